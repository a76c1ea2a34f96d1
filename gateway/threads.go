package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
)

// The limits on what a client may send are the protocol's (package chat,
// limits.go and title.go); this edge adds its own on the envelope:
//
//	id (a WebSocket command's)  1–128 bytes (MaxCommandIDBytes)
//	type (a WebSocket command)  one of the protocol's command types
//	a request body              at most 1 MiB (maxBody)
//	a WebSocket frame           at most WSConfig.ReadLimit (1 MiB; over it
//	                            the connection closes with 1009)
//
// A saved fragment's text is not sent by the client: the server takes it
// from the deltas it streamed (up to last_seq).
const (
	DefaultThreadPage = 50
	MaxThreadPage     = 200
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
	title := chat.DefaultTitle
	if req.Title != nil {
		if err := chat.CheckTitle("title", *req.Title); err != nil {
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
	cursor := r.URL.Query().Get("cursor")
	if len(cursor) > chat.MaxCursorBytes {
		writeError(w, s.log, chat.Invalid("cursor is %d bytes; the maximum is %d: pass back the next_cursor this server gave out", len(cursor), chat.MaxCursorBytes))
		return
	}
	search := r.URL.Query().Get("q")
	if err := checkSearch(search); err != nil {
		writeError(w, s.log, err)
		return
	}
	threads, next, err := s.store.ListThreads(r.Context(), userID(r), limit, cursor, search)
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	var nextCursor *string
	if next != "" {
		nextCursor = &next
	}
	writeJSON(w, http.StatusOK, map[string]any{"threads": threads, "next_cursor": nextCursor})
}

// checkSearch is the limit on q (GET /api/threads): one line of at most
// chat.MaxSearchBytes; its words past store.MaxSearchWords are ignored.
func checkSearch(q string) error {
	if len(q) > chat.MaxSearchBytes {
		return chat.Invalid("q is %d bytes; the maximum is %d: search for fewer or shorter words", len(q), chat.MaxSearchBytes)
	}
	if !utf8.ValidString(q) || strings.IndexFunc(q, chat.IsControl) >= 0 {
		return chat.Invalid("q must be one line of text: no control characters")
	}
	return nil
}

func (s *Server) getThread(w http.ResponseWriter, r *http.Request) {
	serveLookup(s, w, r, "thread_id", s.store.Snapshot)
}

type forkRequest struct {
	FromCheckpointID *string `json:"from_checkpoint_id"`
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	serveCommand(s, w, r, http.StatusCreated, mustHaveBody, "thread_id", forkRequest.command, s.forkThread)
}

// forkThread performs thread.fork and answers with the new thread.
func (s *Server) forkThread(ctx context.Context, p chat.Fork) (chat.ForkAck, error) {
	t, err := s.store.Fork(ctx, p)
	if err != nil {
		return chat.ForkAck{}, err
	}
	return chat.ForkAck{NewThreadID: t.ThreadID, HeadCheckpointID: t.HeadCheckpointID}, nil
}

// command is thread.fork from the decoded fields, validated.
func (req forkRequest) command(userID, threadID string) (chat.Fork, error) {
	if req.FromCheckpointID == nil || *req.FromCheckpointID == "" {
		return chat.Fork{}, chat.Invalid("from_checkpoint_id is required: name the checkpoint to fork from")
	}
	p := chat.Fork{UserID: userID, ThreadID: threadID, FromCheckpointID: *req.FromCheckpointID}
	return p, p.Validate()
}

type checkoutRequest struct {
	CheckpointID         *string `json:"checkpoint_id"`
	ExpectedStateVersion *int64  `json:"expected_state_version"`
}

// checkout moves the thread's head to another of its checkpoints
// (POST /api/threads/{id}/head).
func (s *Server) checkout(w http.ResponseWriter, r *http.Request) {
	serveCommand(s, w, r, http.StatusOK, mustHaveBody, "thread_id", checkoutRequest.command, s.store.Checkout)
}

// command is thread.checkout from the decoded fields, validated.
func (req checkoutRequest) command(userID, threadID string) (chat.Checkout, error) {
	switch {
	case req.CheckpointID == nil || *req.CheckpointID == "":
		return chat.Checkout{}, chat.Invalid("checkpoint_id is required: name the checkpoint of this thread to switch to")
	case req.ExpectedStateVersion == nil:
		return chat.Checkout{}, versionRequired()
	}
	p := chat.Checkout{UserID: userID, ThreadID: threadID, CheckpointID: *req.CheckpointID, ExpectedStateVersion: *req.ExpectedStateVersion}
	return p, p.Validate()
}

// listCheckpoints answers the thread's checkpoints, oldest first
// (GET /api/threads/{id}/checkpoints): each with its lists whole, as the
// protocol says, or, with ?lists=delta, each list as what it changes from
// the parent's (chat.CheckpointDelta), an answer that grows with the
// number of checkpoints rather than with that number times the
// conversation's length (the page reads this one).
func (s *Server) listCheckpoints(w http.ResponseWriter, r *http.Request) {
	delta := false
	if q := r.URL.Query(); q.Has("lists") {
		if q.Get("lists") != "delta" {
			writeError(w, s.log, chat.Invalid("lists must be delta (each checkpoint's lists as what they change from its parent's), or be left out for whole lists"))
			return
		}
		delta = true
	}
	serveLookup(s, w, r, "thread_id", func(ctx context.Context, userID, threadID string) (map[string]any, error) {
		if delta {
			head, cps, err := s.store.CheckpointDeltas(ctx, userID, threadID)
			return map[string]any{"head_checkpoint_id": head, "checkpoints": cps}, err
		}
		head, cps, err := s.store.Checkpoints(ctx, userID, threadID)
		return map[string]any{"head_checkpoint_id": head, "checkpoints": cps}, err
	})
}

// listMessages answers a page of the thread's history
// (GET /api/threads/{id}/messages?before=&limit=): the messages just
// before the message before (none: the latest ones), oldest first, at most
// limit (default chat.DefaultHistoryPage, at most chat.MaxHistoryPage) and,
// but for the newest of them, at most chat.HistoryPageBytes of content;
// next_before continues with the older ones (null: the page starts the
// history).
func (s *Server) listMessages(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("ids") {
		s.lookupMessages(w, r) // messages by id, on any branch
		return
	}
	limit := chat.DefaultHistoryPage
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > chat.MaxHistoryPage {
			writeError(w, s.log, chat.Invalid("limit must be a whole number from 1 to %d", chat.MaxHistoryPage))
			return
		}
		limit = n
	}
	before := r.URL.Query().Get("before")
	if _, given := r.URL.Query()["before"]; given && (before == "" || len(before) > chat.MaxIDBytes) {
		writeError(w, s.log, chat.Invalid("before must name a message of the history (the next_before of the page you have, at most %d bytes), or be left out for the latest messages", chat.MaxIDBytes))
		return
	}
	serveLookup(s, w, r, "thread_id", func(ctx context.Context, userID, threadID string) (chat.HistoryPage, error) {
		return s.store.History(ctx, userID, threadID, before, limit, chat.HistoryPageBytes)
	})
}

func (s *Server) listOperations(w http.ResponseWriter, r *http.Request) {
	serveLookup(s, w, r, "thread_id", func(ctx context.Context, userID, threadID string) (map[string]any, error) {
		ops, err := s.store.Operations(ctx, userID, threadID)
		return map[string]any{"operations": ops}, err
	})
}

// pathID reads the id in path segment name, checked as field.
func pathID(r *http.Request, name, field string) (string, error) {
	v := r.PathValue(name)
	if err := chat.CheckID(field+" (in the path)", v); err != nil {
		return "", err
	}
	return v, nil
}

// quoteShort quotes a client's string for an error message, cut to 64
// bytes, so that an answer never echoes an arbitrarily large input.
func quoteShort(v string) string {
	const n = 64
	if len(v) <= n {
		return strconv.Quote(v)
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return strconv.Quote(v[:cut]) + fmt.Sprintf("… (%d bytes)", len(v))
}

type deleteThreadRequest struct {
	ExpectedStateVersion *int64 `json:"expected_state_version"`
}

// deleteThread deletes a thread (DELETE /api/threads/{id}, an optional
// body {expected_state_version}); a run in flight is cancelled first, in
// the caller's name (api:<client>).
func (s *Server) deleteThread(w http.ResponseWriter, r *http.Request) {
	serveCommand(s, w, r, http.StatusOK, mayBeEmpty, "thread_id", inCallersName(r, deleteThreadRequest.command), s.runs.DeleteThread)
}

// command is thread.delete from the decoded fields (expected_state_version
// is optional), validated.
func (req deleteThreadRequest) command(userID, threadID, requestedBy string) (chat.DeleteThread, error) {
	p := chat.DeleteThread{UserID: userID, ThreadID: threadID, ExpectedStateVersion: req.ExpectedStateVersion, RequestedBy: requestedBy}
	return p, p.Validate()
}
