// The message queue's commands (docs/protocol.md "Message queue"), over
// HTTP (Client) and over a WebSocket connection (Conn).

package client

import (
	"context"
	"net/http"

	"github.com/honestcancel/gateway/chat"
)

// QueueAddRequest is queue.add: a message to send after the active run
// (Mode chat.QueueAfter, the default) or instead of it (chat.QueueInterrupt:
// the active run is cancelled with its receipt, reason interrupted).
type QueueAddRequest struct {
	ThreadID    string
	UserMessage string
	Mode        string
	// ClientRequestID, when set, makes a resent add return the same item
	// (its place now, or the run it became) and add nothing.
	ClientRequestID string
	// ExpectedStateVersion, when not nil, must be the thread's current one.
	ExpectedStateVersion *int64
}

type queueAddBody struct {
	ThreadID             string `json:"thread_id,omitempty"`
	UserMessage          string `json:"user_message"`
	Mode                 string `json:"mode,omitempty"`
	ClientRequestID      string `json:"client_request_id,omitempty"`
	ExpectedStateVersion *int64 `json:"expected_state_version,omitempty"`
}

func (r QueueAddRequest) body(ws bool) queueAddBody {
	b := queueAddBody{UserMessage: r.UserMessage, Mode: r.Mode, ClientRequestID: r.ClientRequestID,
		ExpectedStateVersion: r.ExpectedStateVersion}
	if ws {
		b.ThreadID = r.ThreadID
	}
	return b
}

// QueueUpdateRequest is queue.update: a waiting item's new text, its new
// place (1 = next), or both.
type QueueUpdateRequest struct {
	ThreadID             string
	ItemID               string
	UserMessage          *string
	Position             *int
	ExpectedStateVersion *int64
}

type queueUpdateBody struct {
	ThreadID             string  `json:"thread_id,omitempty"`
	ItemID               string  `json:"item_id,omitempty"`
	UserMessage          *string `json:"user_message,omitempty"`
	Position             *int    `json:"position,omitempty"`
	ExpectedStateVersion *int64  `json:"expected_state_version,omitempty"`
}

// QueueItemRequest names one waiting item (queue.remove) or, with ItemID
// empty, a thread's queue (queue.resume).
type QueueItemRequest struct {
	ThreadID             string
	ItemID               string
	ExpectedStateVersion *int64
}

type queueItemBody struct {
	ThreadID             string `json:"thread_id,omitempty"`
	ItemID               string `json:"item_id,omitempty"`
	ExpectedStateVersion *int64 `json:"expected_state_version,omitempty"`
}

// QueueAdd adds a message to a thread's queue (POST
// /api/threads/{id}/queue). With no run active and the queue not paused
// it starts at once: the answer's RunID names the run.
func (c *Client) QueueAdd(ctx context.Context, r QueueAddRequest) (chat.QueueAddAck, error) {
	return callFor[chat.QueueAddAck](ctx, c, http.MethodPost, "/api/threads/"+esc(r.ThreadID)+"/queue", r.body(false))
}

// QueueUpdate edits or moves a waiting item (PATCH
// /api/threads/{id}/queue/{item_id}); one that was sent or removed is
// not_found.
func (c *Client) QueueUpdate(ctx context.Context, r QueueUpdateRequest) (chat.QueueItemAck, error) {
	return callFor[chat.QueueItemAck](ctx, c, http.MethodPatch,
		"/api/threads/"+esc(r.ThreadID)+"/queue/"+esc(r.ItemID),
		queueUpdateBody{UserMessage: r.UserMessage, Position: r.Position, ExpectedStateVersion: r.ExpectedStateVersion})
}

// QueueRemove removes a waiting item (DELETE
// /api/threads/{id}/queue/{item_id}).
func (c *Client) QueueRemove(ctx context.Context, r QueueItemRequest) (chat.QueueItemAck, error) {
	return callFor[chat.QueueItemAck](ctx, c, http.MethodDelete,
		"/api/threads/"+esc(r.ThreadID)+"/queue/"+esc(r.ItemID),
		queueItemBody{ExpectedStateVersion: r.ExpectedStateVersion})
}

// QueueResume resumes a paused queue (POST /api/threads/{id}/queue/resume):
// with no run active its first item starts at once.
func (c *Client) QueueResume(ctx context.Context, r QueueItemRequest) (chat.QueueResumeAck, error) {
	return callFor[chat.QueueResumeAck](ctx, c, http.MethodPost, "/api/threads/"+esc(r.ThreadID)+"/queue/resume",
		queueItemBody{ExpectedStateVersion: r.ExpectedStateVersion})
}

// QueueAdd sends queue.add (see Client.QueueAdd). A request with a
// ClientRequestID is resent when the connection drops before the answer.
func (c *Conn) QueueAdd(ctx context.Context, r QueueAddRequest) (chat.QueueAddAck, error) {
	return doFor[chat.QueueAddAck](ctx, c, "queue.add", r.body(true), r.ClientRequestID != "")
}

// QueueUpdate sends queue.update (see Client.QueueUpdate).
func (c *Conn) QueueUpdate(ctx context.Context, r QueueUpdateRequest) (chat.QueueItemAck, error) {
	return doFor[chat.QueueItemAck](ctx, c, "queue.update", queueUpdateBody{ThreadID: r.ThreadID, ItemID: r.ItemID,
		UserMessage: r.UserMessage, Position: r.Position, ExpectedStateVersion: r.ExpectedStateVersion}, false)
}

// QueueRemove sends queue.remove (see Client.QueueRemove).
func (c *Conn) QueueRemove(ctx context.Context, r QueueItemRequest) (chat.QueueItemAck, error) {
	return doFor[chat.QueueItemAck](ctx, c, "queue.remove", queueItemBody{ThreadID: r.ThreadID, ItemID: r.ItemID,
		ExpectedStateVersion: r.ExpectedStateVersion}, false)
}

// QueueResume sends queue.resume (see Client.QueueResume).
func (c *Conn) QueueResume(ctx context.Context, r QueueItemRequest) (chat.QueueResumeAck, error) {
	return doFor[chat.QueueResumeAck](ctx, c, "queue.resume", queueItemBody{ThreadID: r.ThreadID,
		ExpectedStateVersion: r.ExpectedStateVersion}, false)
}
