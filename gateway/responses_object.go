package gateway

// A run as a response object of the OpenAI Responses API
// (docs/openai-api.md): OpenAI's fields, and the gateway's extension
// field with the run behind it and, once cancelled, its receipt.

import (
	"time"

	"github.com/honestcancel/gateway/chat"
)

// responseObject is a response as OpenAI's API shows it, plus the
// gateway's extension field (gateway): the run behind it and, once it was
// cancelled, the cancel's receipt.
type responseObject struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	CreatedAt          int64             `json:"created_at"`
	Status             string            `json:"status"`
	Background         bool              `json:"background"`
	Error              *responseError    `json:"error"`
	IncompleteDetails  *incomplete       `json:"incomplete_details"`
	Instructions       *string           `json:"instructions"`
	Metadata           map[string]string `json:"metadata"`
	Model              string            `json:"model"`
	Output             []outputItem      `json:"output"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Store              bool              `json:"store"`
	Usage              *usage            `json:"usage"`
	Gateway            gatewayExtension  `json:"gateway"`
}

type responseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type incomplete struct {
	Reason string `json:"reason"`
}

type usage struct {
	InputTokens         int64          `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int64          `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int64          `json:"total_tokens"`
}

// outputItem is a message item: one published assistant message.
type outputItem struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

// gatewayExtension is the response's run as the protocol tells it
// (docs/openai-api.md, "The gateway field").
type gatewayExtension struct {
	RunID    string         `json:"run_id"`
	ThreadID string         `json:"thread_id"`
	Status   chat.RunStatus `json:"status"`
	// CheckpointID is where the response ended: what a response with
	// previous_response_id continues from.
	CheckpointID string                  `json:"checkpoint_id"`
	Operations   []chat.OperationOutcome `json:"operations"`
	Receipt      *receipt                `json:"receipt"`
}

// receipt is a cancelled run's receipt: run.cancelled's fields and the
// cancel's own (when, why, by whom).
type receipt struct {
	CancelRequestedAt    *time.Time              `json:"cancel_requested_at"`
	CancelReason         *string                 `json:"cancel_reason"`
	RequestedBy          *string                 `json:"requested_by"`
	PublishedMessageID   *string                 `json:"published_message_id"`
	DiscardedStreamChars int64                   `json:"discarded_stream_chars"`
	ResumeCheckpointID   *string                 `json:"resume_checkpoint_id"`
	ResumePolicy         string                  `json:"resume_policy"`
	Operations           []chat.OperationOutcome `json:"operations"`
	Executed             bool                    `json:"executed"`
}

// openAIStatus is the status OpenAI's clients know for a run's status
// (and the reason of an incomplete one): the stages of a cancel that has
// not finished, and a wait for a confirmation, are in_progress (the
// gateway field tells which).
func openAIStatus(rec chat.Response) (string, *incomplete) {
	switch rec.Run.Status {
	case chat.RunQueued:
		return "queued", nil
	case chat.RunCompleted:
		if n := len(rec.Output); n > 0 && rec.Output[n-1].Truncated != "" {
			return "incomplete", &incomplete{Reason: "max_output_tokens"}
		}
		return "completed", nil
	case chat.RunFailed:
		return "failed", nil
	case chat.RunCancelled:
		return "cancelled", nil
	}
	return "in_progress", nil
}

// responseHead is the part of a response object that does not change as
// its run goes on: what its request said, and the run it is.
func (s *Server) responseHead(rec chat.Response) responseObject {
	o := responseObject{
		ID: chat.ResponseID(rec.Run.RunID), Object: "response", CreatedAt: rec.Run.CreatedAt.Unix(),
		Metadata: map[string]string{}, Model: s.model, Output: []outputItem{}, Store: true,
		Gateway: gatewayExtension{RunID: rec.Run.RunID, ThreadID: rec.Run.ThreadID, CheckpointID: rec.Run.BaseCheckpointID,
			Operations: []chat.OperationOutcome{}},
	}
	if n := len(rec.Output); n > 0 && rec.Output[n-1].Model != "" {
		o.Model = rec.Output[n-1].Model
	}
	if q := rec.Request; q != nil {
		o.Background, o.Model = q.Background, q.Model
		if q.Instructions != "" {
			o.Instructions = &q.Instructions
		}
		if q.Metadata != nil {
			o.Metadata = q.Metadata
		}
		if q.PreviousResponseID != "" {
			o.PreviousResponseID = &q.PreviousResponseID
		}
	}
	return o
}

// responseObject is rec as a response object.
func (s *Server) responseObject(rec chat.Response) responseObject {
	o := s.responseHead(rec)
	o.Status, o.IncompleteDetails = openAIStatus(rec)
	for _, m := range rec.Output {
		o.Output = append(o.Output, messageItem(m, "completed"))
	}
	run := rec.Run
	o.Gateway.Status, o.Gateway.CheckpointID = run.Status, rec.CheckpointID
	if rec.Operations != nil {
		o.Gateway.Operations = rec.Operations
	}
	if run.Status.Terminal() {
		u := run.Usage
		o.Usage = &usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens,
			InputTokensDetails: map[string]int{"cached_tokens": 0}, OutputTokensDetails: map[string]int{"reasoning_tokens": 0}}
	}
	switch run.Status {
	case chat.RunFailed:
		msg := "the run failed"
		if run.Error != nil {
			msg = *run.Error
		}
		o.Error = &responseError{Code: "server_error", Message: msg}
	case chat.RunCancelled:
		o.Gateway.Receipt = &receipt{CancelRequestedAt: run.CancelRequestedAt, CancelReason: run.CancelReason, RequestedBy: run.RequestedBy,
			PublishedMessageID: rec.PublishedMessageID, DiscardedStreamChars: run.DiscardedStreamChars,
			ResumeCheckpointID: run.ResumeCheckpointID, ResumePolicy: chat.ResumePolicyRegenerate,
			Operations: o.Gateway.Operations, Executed: run.Executed}
	}
	return o
}

// messageItem is a message as an output item of the given status.
func messageItem(m chat.Message, status string) outputItem {
	return outputItem{ID: m.MessageID, Type: "message", Status: status, Role: chat.RoleAssistant,
		Content: []outputText{{Type: "output_text", Text: m.Content, Annotations: []any{}}}}
}
