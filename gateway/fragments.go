package gateway

import (
	"net/http"

	"github.com/honestcancel/gateway/chat"
)

type saveFragmentRequest struct {
	MessageID            *string `json:"message_id"`
	LastSeq              *int64  `json:"last_seq"`
	ExpectedStateVersion *int64  `json:"expected_state_version"`
}

func (s *Server) saveFragment(w http.ResponseWriter, r *http.Request) {
	var req saveFragmentRequest
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, s.log, err)
		return
	}
	id, err := pathID(r, "id", "thread_id")
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	p, err := req.command(userID(r), id)
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	ack, err := s.store.SaveFragment(r.Context(), p)
	s.reply(w, http.StatusCreated, ack, err)
}

// command validates the fields of fragment.save.
func (req saveFragmentRequest) command(userID, threadID string) (chat.SaveFragment, error) {
	switch {
	case req.MessageID == nil || *req.MessageID == "":
		return chat.SaveFragment{}, chat.Invalid("message_id is required: the id of the streamed message to save")
	case len(*req.MessageID) > chat.MaxIDBytes:
		return chat.SaveFragment{}, chat.CheckID("message_id", *req.MessageID)
	case req.LastSeq == nil || *req.LastSeq < 1:
		return chat.SaveFragment{}, chat.Invalid("last_seq is required: the seq of the last delta you displayed (at least 1)")
	case requiredVersion(req.ExpectedStateVersion) != nil:
		return chat.SaveFragment{}, requiredVersion(req.ExpectedStateVersion)
	}
	return chat.SaveFragment{
		UserID: userID, ThreadID: threadID, MessageID: *req.MessageID,
		LastSeq: *req.LastSeq, ExpectedStateVersion: *req.ExpectedStateVersion,
	}, nil
}

type deleteDraftRequest struct {
	ExpectedStateVersion *int64 `json:"expected_state_version"`
}

func (s *Server) deleteDraft(w http.ResponseWriter, r *http.Request) {
	var req deleteDraftRequest
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, s.log, err)
		return
	}
	threadID, err := pathID(r, "id", "thread_id")
	var messageID string
	if err == nil {
		messageID, err = pathID(r, "message_id", "message_id")
	}
	if err == nil {
		err = req.validate()
	}
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	ack, err := s.store.DeleteDraft(r.Context(), userID(r), threadID, messageID, *req.ExpectedStateVersion)
	s.reply(w, http.StatusOK, ack, err)
}

func (req deleteDraftRequest) validate() error {
	return requiredVersion(req.ExpectedStateVersion)
}

type decideRequest struct {
	ExpectedStateVersion *int64 `json:"expected_state_version"`
}

func (req decideRequest) validate() error {
	return requiredVersion(req.ExpectedStateVersion)
}

// decide serves POST /api/operations/{id}/confirm and /reject.
func (s *Server) decide(confirm bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req decideRequest
		if err := decode(w, r, &req, false); err != nil {
			writeError(w, s.log, err)
			return
		}
		id, err := pathID(r, "id", "operation_id")
		if err == nil {
			err = req.validate()
		}
		if err != nil {
			writeError(w, s.log, err)
			return
		}
		ack, err := s.runs.DecideOperation(r.Context(), userID(r), id, *req.ExpectedStateVersion, confirm)
		s.reply(w, http.StatusOK, ack, err)
	}
}

// requiredVersion is the rule for a command's expected_state_version: given,
// and not negative.
func requiredVersion(v *int64) error {
	if v == nil || *v < 0 {
		return chat.Invalid("expected_state_version is required: the state_version of the last event you applied")
	}
	return nil
}
