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
	switch {
	case req.MessageID == nil || *req.MessageID == "":
		writeError(w, s.log, chat.Invalid("message_id is required: the id of the streamed message to save"))
		return
	case req.LastSeq == nil || *req.LastSeq < 1:
		writeError(w, s.log, chat.Invalid("last_seq is required: the seq of the last delta you displayed (at least 1)"))
		return
	case req.ExpectedStateVersion == nil || *req.ExpectedStateVersion < 0:
		writeError(w, s.log, chat.Invalid("expected_state_version is required: the state_version of the last event you applied"))
		return
	}
	ack, err := s.store.SaveFragment(r.Context(), chat.SaveFragment{
		UserID: userID(r), ThreadID: r.PathValue("id"), MessageID: *req.MessageID,
		LastSeq: *req.LastSeq, ExpectedStateVersion: *req.ExpectedStateVersion,
	})
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, ack)
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
	if req.ExpectedStateVersion == nil || *req.ExpectedStateVersion < 0 {
		writeError(w, s.log, chat.Invalid("expected_state_version is required: the state_version of the last event you applied"))
		return
	}
	ack, err := s.store.DeleteDraft(r.Context(), userID(r), r.PathValue("id"), r.PathValue("message_id"), *req.ExpectedStateVersion)
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, ack)
}
