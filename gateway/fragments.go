package gateway

import (
	"context"
	"net/http"
	"strconv"

	"github.com/honestcancel/gateway/chat"
)

type saveFragmentRequest struct {
	MessageID            *string `json:"message_id"`
	LastSeq              *int64  `json:"last_seq"`
	ExpectedStateVersion *int64  `json:"expected_state_version"`
}

func (s *Server) saveFragment(w http.ResponseWriter, r *http.Request) {
	serveCommand(s, w, r, http.StatusCreated, mustHaveBody, "thread_id", saveFragmentRequest.command, s.store.SaveFragment)
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

// streamedText serves GET /api/threads/{id}/streamed/{message_id}?last_seq=N:
// what fragment.save would keep of the message up to seq N, or its error.
func (s *Server) streamedText(w http.ResponseWriter, r *http.Request) {
	serveLookup(s, w, r, "thread_id", func(ctx context.Context, userID, threadID string) (chat.StreamedText, error) {
		messageID, err := pathID(r, "message_id", "message_id")
		if err != nil {
			return chat.StreamedText{}, err
		}
		v := r.URL.Query().Get("last_seq")
		if v == "" {
			return chat.StreamedText{}, chat.Invalid("last_seq is required: the seq of the last delta you displayed (at least 1)")
		}
		lastSeq, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return chat.StreamedText{}, chat.Invalid("last_seq must be a whole number, at least 1")
		}
		q := chat.StreamedTextQuery{UserID: userID, ThreadID: threadID, MessageID: messageID, LastSeq: lastSeq}
		if err := q.Validate(); err != nil {
			return chat.StreamedText{}, err
		}
		return s.store.StreamedText(ctx, q)
	})
}

type deleteDraftRequest struct {
	ExpectedStateVersion *int64 `json:"expected_state_version"`
}

func (s *Server) deleteDraft(w http.ResponseWriter, r *http.Request) {
	serveCommand(s, w, r, http.StatusOK, mustHaveBody, "thread_id", func(req deleteDraftRequest, userID, threadID string) (chat.DeleteDraft, error) {
		messageID, err := pathID(r, "message_id", "message_id")
		if err != nil {
			return chat.DeleteDraft{}, err
		}
		return req.command(userID, threadID, messageID)
	}, s.store.DeleteDraft)
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
		serveCommand(s, w, r, http.StatusOK, mustHaveBody, "operation_id", func(req decideRequest, userID, operationID string) (chat.Decide, error) {
			return req.command(userID, operationID, confirm)
		}, s.runs.DecideOperation)
	}
}

// versionRequired answers a command sent without expected_state_version
// (its value is the domain's to check: chat.CheckVersion).
func versionRequired() error {
	return chat.Invalid("expected_state_version is required: the state_version of the last event you applied")
}
