package chat

import (
	"strings"
	"unicode/utf8"
)

// The OpenAI Responses API (POST /v1/responses, docs/openai-api.md) is a
// second way to start and follow runs: each response is one run on a
// thread, its id the run's id behind PrefixResponse. What such a request
// asks that a run.start does not say (the model named, instructions,
// metadata, the response it continues) is recorded with the run, in the
// transaction that starts it.

// PrefixResponse starts a response id: "resp_" followed by the run's id
// ("resp_run_…"), so that either id names the other.
const PrefixResponse = "resp_"

// Limits of a response request, OpenAI's own where it has them
// (metadata) and the user message's elsewhere.
const (
	MaxInstructionsBytes  = MaxUserMessageBytes
	MaxMetadataPairs      = 16
	MaxMetadataKeyChars   = 64
	MaxMetadataValueChars = 512
)

// ResponseID is the response id of a run.
func ResponseID(runID string) string { return PrefixResponse + runID }

// RunOfResponse is the run id a response id names, and whether it names
// one at all (a run id behind PrefixResponse, within the id limit).
func RunOfResponse(responseID string) (string, bool) {
	runID, ok := strings.CutPrefix(responseID, PrefixResponse)
	if !ok || !strings.HasPrefix(runID, PrefixRun) || len(runID) > MaxIDBytes {
		return "", false
	}
	return runID, true
}

// ResponseRequest is what a Responses API request records with the run it
// starts (StartRun.Response): none of it changes how the run executes but
// Instructions, which the model reads before the conversation (a system
// message) in every step of this run and of no other.
type ResponseRequest struct {
	// Model is the model name the request asked for (one the gateway
	// serves).
	Model string `json:"model"`
	// Instructions is a system message for this run only; "" for none.
	Instructions string `json:"instructions"`
	// Metadata is the caller's key-value pairs, returned as given.
	Metadata map[string]string `json:"metadata"`
	// PreviousResponseID is the response this one continues ("" for a
	// response that started a new thread).
	PreviousResponseID string `json:"previous_response_id"`
	// Background records whether the request asked for background mode.
	Background bool `json:"background"`
}

// Validate checks a response request's fields against their limits.
func (r ResponseRequest) Validate() error {
	if err := CheckText("model", r.Model, 1, MaxIDBytes); err != nil {
		return err
	}
	if r.Instructions != "" {
		if err := CheckText("instructions", r.Instructions, 1, MaxInstructionsBytes); err != nil {
			return err
		}
	}
	if len(r.Metadata) > MaxMetadataPairs {
		return Invalid("metadata has %d pairs; the maximum is %d", len(r.Metadata), MaxMetadataPairs)
	}
	for k, v := range r.Metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return Invalid("metadata is not valid UTF-8")
		}
		if n := utf8.RuneCountInString(k); n == 0 || n > MaxMetadataKeyChars {
			return Invalid("metadata key %q is %d characters; keys are 1 to %d", cut(k, 64), n, MaxMetadataKeyChars)
		}
		if n := utf8.RuneCountInString(v); n > MaxMetadataValueChars {
			return Invalid("metadata value of %q is %d characters; the maximum is %d", cut(k, 64), n, MaxMetadataValueChars)
		}
	}
	return nil
}

// cut shortens s to at most n bytes, on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// Response is a run seen as a response of the Responses API (GET
// /v1/responses/{id}): the run, what its request recorded, what it
// published and where it ended, read in one transaction.
type Response struct {
	Run Run
	// Thread is the run's thread as it is now (its version and head).
	Thread Thread
	// Request is what the Responses API request recorded; nil for a run
	// started otherwise (the page, /api, the message queue).
	Request *ResponseRequest
	// Output is the assistant messages the run published, oldest first.
	Output []Message
	// StartSeq is the seq of the run's run.started event (0 when the
	// event log no longer holds it).
	StartSeq int64
	// CheckpointID is the checkpoint the response ended on, the one a
	// response continuing it starts from: the checkpoint of the run's last
	// published message, else the run's base checkpoint (which holds the
	// user message and, when the run did not finish, its pending step).
	CheckpointID string
	// PublishedMessageID is a cancelled run's published_message_id (the
	// last message of the thread's history at the cancel).
	PublishedMessageID *string
	// Operations is every tool call of the run with its outcome so far.
	Operations []OperationOutcome
}
