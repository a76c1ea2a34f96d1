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

// command is fragment.save from the decoded fields, validated.
func (req saveFragmentRequest) command(userID, threadID string) (chat.SaveFragment, error) {
	switch {
	case req.MessageID == nil || *req.MessageID == "":
		return chat.SaveFragment{}, chat.Invalid("message_id is required: the id of the streamed message to save")
	case req.LastSeq == nil:
		return chat.SaveFragment{}, chat.Invalid("last_seq is required: the seq of the last delta you displayed (at least 1)")
	case req.ExpectedStateVersion == nil:
		return chat.SaveFragment{}, versionRequired()
	}
	p := chat.SaveFragment{
		UserID: userID, ThreadID: threadID, MessageID: *req.MessageID,
		LastSeq: *req.LastSeq, ExpectedStateVersion: *req.ExpectedStateVersion,
	}
	return p, p.Validate()
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
	var p chat.DeleteDraft
	if err == nil {
		p, err = req.command(userID(r), threadID, messageID)
	}
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	ack, err := s.store.DeleteDraft(r.Context(), p.UserID, p.ThreadID, p.MessageID, p.ExpectedStateVersion)
	s.reply(w, http.StatusOK, ack, err)
}

// command is draft.delete from the decoded fields, validated.
func (req deleteDraftRequest) command(userID, threadID, messageID string) (chat.DeleteDraft, error) {
	if req.ExpectedStateVersion == nil {
		return chat.DeleteDraft{}, versionRequired()
	}
	p := chat.DeleteDraft{UserID: userID, ThreadID: threadID, MessageID: messageID, ExpectedStateVersion: *req.ExpectedStateVersion}
	return p, p.Validate()
}

type decideRequest struct {
	ExpectedStateVersion *int64 `json:"expected_state_version"`
}

// command is tool.confirm (confirm) or tool.reject from the decoded
// fields, validated.
func (req decideRequest) command(userID, operationID string, confirm bool) (chat.Decide, error) {
	if req.ExpectedStateVersion == nil {
		return chat.Decide{}, versionRequired()
	}
	p := chat.Decide{UserID: userID, OperationID: operationID, ExpectedStateVersion: *req.ExpectedStateVersion, Confirm: confirm}
	return p, p.Validate()
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
		var p chat.Decide
		if err == nil {
			p, err = req.command(userID(r), id, confirm)
		}
		if err != nil {
			writeError(w, s.log, err)
			return
		}
		ack, err := s.runs.DecideOperation(r.Context(), p.UserID, p.OperationID, p.ExpectedStateVersion, p.Confirm)
		s.reply(w, http.StatusOK, ack, err)
	}
}

// versionRequired answers a command sent without expected_state_version
// (its value is the domain's to check: chat.CheckVersion).
func versionRequired() error {
	return chat.Invalid("expected_state_version is required: the state_version of the last event you applied")
}
