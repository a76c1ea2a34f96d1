// Package model declares what the engine needs from a language model: a
// Backend that streams one reply for a conversation. Implementations live in
// sub-packages (model/demo is the embedded default).
package model

import (
	"context"
	"encoding/json"
	"io"
)

// Role of a message sent to a backend.
type Role string

const (
	RoleSystem    Role = "system"
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
	RoleTool      Role = "tool"
)

// Message is one entry of the conversation sent to a backend. It is built by
// the engine from a checkpoint's published history only: delta text that was
// never published is never part of it.
type Message struct {
	Role Role
	// Content is the message text. A user-saved fragment arrives with
	// Fragment set and its text unchanged in Content. A tool message's
	// Content is the tool's result (JSON).
	Content string
	// Fragment marks text the user saved from an interrupted reply ("Saved
	// fragment"): partial output, not a finished answer.
	Fragment bool
	// Card marks an assistant message that is one JSON document (a card).
	Card bool
	// Call is set on a tool message: the call whose result Content holds.
	Call *ToolCall
}

// ToolSpec describes a tool the model may call.
type ToolSpec struct {
	Name        string
	Description string
	Parameters  json.RawMessage // JSON Schema
}

// ToolCall is the model asking for one tool call. ID is the backend's id
// for the call ("" when it has none).
type ToolCall struct {
	ID        string
	Name      string
	Arguments json.RawMessage
}

// Request is one generation step.
type Request struct {
	// Messages is the confirmed context, oldest first.
	Messages []Message
	// ResumeNote is non-empty when this step re-runs a step whose previous
	// output was stopped (by the user, or by a crash); it says so in words the
	// model can use. Discarded text is never included.
	ResumeNote string
	// Tools the model may call in this step.
	Tools []ToolSpec
	// MaxBytes is the size limit of the reply's text (UTF-8 bytes): the
	// engine stops the stream there and keeps nothing past it. A backend
	// may ask its endpoint for no more than that (openai derives
	// max_completion_tokens from it) and should hold no more than about
	// that of anything it assembles (a tool call's arguments). 0: no limit.
	MaxBytes int
}

// Chunk is one piece of streamed output: text, or (at most once per
// stream, after any text) a tool call.
type Chunk struct {
	Text string
	// Card marks the reply as a card: the concatenated text is one JSON
	// document, published only when complete and valid.
	Card bool
	// Call is a complete tool call; the step ends with it.
	Call *ToolCall
	// Truncated says the endpoint stopped the reply at a length limit (its
	// own, or the one it was asked for) rather than at its end; it comes
	// last, on a chunk without text, and the reply is marked cut at the
	// size limit (chat.TruncatedSizeLimit).
	Truncated bool
}

// Stream yields the chunks of one reply. Next returns io.EOF after the last
// chunk. A Stream is used by one goroutine; Close releases it and may be
// called at any time, also concurrently with a blocked Next, which then
// returns promptly.
type Stream interface {
	Next(ctx context.Context) (Chunk, error)
	Close() error
}

// Backend starts streamed generations. Cancelling ctx (of Stream or of Next)
// must stop the upstream work as soon as the backend can.
type Backend interface {
	Stream(ctx context.Context, req Request) (Stream, error)
}

// EOF is returned by Stream.Next after the last chunk.
var EOF = io.EOF
