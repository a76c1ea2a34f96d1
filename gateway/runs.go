package gateway

import (
	"net/http"
	"regexp"

	"github.com/honestcancel/gateway/chat"
)

type startRunRequest struct {
	ExpectedStateVersion   *int64  `json:"expected_state_version"`
	ResumeFromCheckpointID *string `json:"resume_from_checkpoint_id"`
	UserMessage            *string `json:"user_message"`
	ClientRequestID        *string `json:"client_request_id"`
}

func (s *Server) startRun(w http.ResponseWriter, r *http.Request) {
	var req startRunRequest
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
	ack, err := s.runs.StartRun(r.Context(), p)
	s.reply(w, http.StatusCreated, ack, err)
}

// command validates the fields of run.start.
func (req startRunRequest) command(userID, threadID string) (chat.StartRun, error) {
	p := chat.StartRun{UserID: userID, ThreadID: threadID, UserMessage: req.UserMessage}
	if req.ExpectedStateVersion == nil {
		return p, chat.Invalid("expected_state_version is required: send the state_version of the last event you applied")
	}
	if *req.ExpectedStateVersion < 0 {
		return p, chat.Invalid("expected_state_version must not be negative")
	}
	p.ExpectedStateVersion = *req.ExpectedStateVersion
	if req.UserMessage != nil {
		if err := checkText("user_message", *req.UserMessage, 1, MaxUserMessageBytes); err != nil {
			return p, err
		}
	}
	if req.ResumeFromCheckpointID != nil {
		if *req.ResumeFromCheckpointID == "" {
			return p, chat.Invalid("resume_from_checkpoint_id must not be empty: omit it to continue from the head")
		}
		if err := checkID("resume_from_checkpoint_id", *req.ResumeFromCheckpointID); err != nil {
			return p, err
		}
		p.ResumeFromCheckpointID = *req.ResumeFromCheckpointID
	}
	if req.ClientRequestID != nil {
		if err := checkText("client_request_id", *req.ClientRequestID, 1, MaxClientRequestID); err != nil {
			return p, err
		}
		p.ClientRequestID = *req.ClientRequestID
	}
	return p, nil
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "id", "run_id")
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	run, err := s.store.Run(r.Context(), userID(r), id)
	s.reply(w, http.StatusOK, run, err)
}

type cancelRequest struct {
	Reason               *string `json:"reason"`
	ExpectedStateVersion *int64  `json:"expected_state_version"`
}

func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request) {
	var req cancelRequest
	if err := decode(w, r, &req, true); err != nil {
		writeError(w, s.log, err)
		return
	}
	id, err := pathID(r, "id", "run_id")
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	p, err := req.command(userID(r), id, "api:"+clientName(r))
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	ack, err := s.runs.CancelRun(r.Context(), p)
	s.reply(w, http.StatusAccepted, ack, err)
}

// command validates the fields of run.cancel. A stale
// expected_state_version never blocks a cancel; it is only checked for type.
func (req cancelRequest) command(userID, runID, requestedBy string) (chat.CancelRun, error) {
	p := chat.CancelRun{UserID: userID, RunID: runID, Reason: chat.ReasonUserRequested, RequestedBy: requestedBy}
	if req.Reason != nil {
		if err := checkText("reason", *req.Reason, 1, MaxReasonBytes); err != nil {
			return p, err
		}
		p.Reason = *req.Reason
	}
	return p, nil
}

var clientNamePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// clientName names an API caller in requested_by: the X-Client-Name header
// when it is a plain token, else "http".
func clientName(r *http.Request) string {
	if v := r.Header.Get("X-Client-Name"); clientNamePattern.MatchString(v) {
		return v
	}
	return "http"
}
