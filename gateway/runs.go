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
	serveCommand(s, w, r, http.StatusCreated, mustHaveBody, "thread_id", startRunRequest.command, s.runs.StartRun)
}

// command decodes run.start's fields: what is required, and what must not
// be given empty; the protocol's limits are chat.StartRun.Validate's.
func (req startRunRequest) command(userID, threadID string) (chat.StartRun, error) {
	p := chat.StartRun{UserID: userID, ThreadID: threadID, UserMessage: req.UserMessage}
	if req.ExpectedStateVersion == nil {
		return p, chat.Invalid("expected_state_version is required: send the state_version of the last event you applied")
	}
	p.ExpectedStateVersion = *req.ExpectedStateVersion
	if req.ResumeFromCheckpointID != nil {
		if *req.ResumeFromCheckpointID == "" {
			return p, chat.Invalid("resume_from_checkpoint_id must not be empty: omit it to continue from the head")
		}
		p.ResumeFromCheckpointID = *req.ResumeFromCheckpointID
	}
	if req.ClientRequestID != nil {
		if *req.ClientRequestID == "" {
			return p, chat.Invalid("client_request_id must not be empty")
		}
		p.ClientRequestID = *req.ClientRequestID
	}
	return p, p.Validate()
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request) {
	serveLookup(s, w, r, "run_id", s.store.Run)
}

type cancelRequest struct {
	Reason               *string `json:"reason"`
	ExpectedStateVersion *int64  `json:"expected_state_version"`
}

func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request) {
	serveCommand(s, w, r, http.StatusAccepted, mayBeEmpty, "run_id", inCallersName(r, cancelRequest.command), s.runs.CancelRun)
}

// command decodes run.cancel's fields (the reason defaults to
// chat.ReasonUserRequested); the limits are chat.CancelRun.Validate's. A
// stale expected_state_version never blocks a cancel; it is only checked
// for type.
func (req cancelRequest) command(userID, runID, requestedBy string) (chat.CancelRun, error) {
	p := chat.CancelRun{UserID: userID, RunID: runID, Reason: chat.ReasonUserRequested, RequestedBy: requestedBy}
	if req.Reason != nil {
		p.Reason = *req.Reason
	}
	return p, p.Validate()
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
