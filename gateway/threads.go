package gateway

import (
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
)

// Limits on what a client may send.
const (
	MaxTitleBytes       = 200
	MaxUserMessageBytes = 32768
	MaxReasonBytes      = 200
	MaxClientRequestID  = 128
	DefaultThreadPage   = 50
	MaxThreadPage       = 200
)

type createThreadRequest struct {
	Title *string `json:"title"`
}

func (s *Server) createThread(w http.ResponseWriter, r *http.Request) {
	var req createThreadRequest
	if err := decode(w, r, &req, true); err != nil {
		writeError(w, s.log, err)
		return
	}
	title := "New conversation"
	if req.Title != nil {
		if err := checkText("title", *req.Title, 1, MaxTitleBytes); err != nil {
			writeError(w, s.log, err)
			return
		}
		title = *req.Title
	}
	snap, err := s.store.CreateThread(r.Context(), userID(r), title)
	s.reply(w, http.StatusCreated, snap, err)
}

func (s *Server) listThreads(w http.ResponseWriter, r *http.Request) {
	limit := DefaultThreadPage
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxThreadPage {
			writeError(w, s.log, chat.Invalid("limit must be a whole number from 1 to %d", MaxThreadPage))
			return
		}
		limit = n
	}
	threads, next, err := s.store.ListThreads(r.Context(), userID(r), limit, r.URL.Query().Get("cursor"))
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	var cursor *string
	if next != "" {
		cursor = &next
	}
	writeJSON(w, http.StatusOK, map[string]any{"threads": threads, "next_cursor": cursor})
}

func (s *Server) getThread(w http.ResponseWriter, r *http.Request) {
	snap, err := s.store.Snapshot(r.Context(), userID(r), r.PathValue("id"))
	s.reply(w, http.StatusOK, snap, err)
}

type forkRequest struct {
	FromCheckpointID *string `json:"from_checkpoint_id"`
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req forkRequest
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, s.log, err)
		return
	}
	if err := req.validate(); err != nil {
		writeError(w, s.log, err)
		return
	}
	t, err := s.store.Fork(r.Context(), userID(r), r.PathValue("id"), *req.FromCheckpointID)
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, chat.ForkAck{NewThreadID: t.ThreadID, HeadCheckpointID: t.HeadCheckpointID})
}

func (req forkRequest) validate() error {
	if req.FromCheckpointID == nil || *req.FromCheckpointID == "" {
		return chat.Invalid("from_checkpoint_id is required: name the checkpoint to fork from")
	}
	return nil
}

func (s *Server) listCheckpoints(w http.ResponseWriter, r *http.Request) {
	head, cps, err := s.store.Checkpoints(r.Context(), userID(r), r.PathValue("id"))
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"head_checkpoint_id": head, "checkpoints": cps})
}

func (s *Server) listOperations(w http.ResponseWriter, r *http.Request) {
	ops, err := s.store.Operations(r.Context(), userID(r), r.PathValue("id"))
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"operations": ops})
}

// checkText validates a text field's length in bytes and its encoding.
func checkText(field, v string, minBytes, maxBytes int) error {
	if len(v) < minBytes {
		return chat.Invalid("%s must not be empty", field)
	}
	if len(v) > maxBytes {
		return chat.Invalid("%s is %d bytes; the maximum is %d", field, len(v), maxBytes)
	}
	if !utf8.ValidString(v) {
		return chat.Invalid("%s is not valid UTF-8", field)
	}
	return nil
}
