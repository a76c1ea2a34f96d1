package gateway

import (
	"context"
	"net/http"

	"github.com/honestcancel/gateway/chat"
)

// The message queue's commands (docs/protocol.md "Message queue"), over
// HTTP and the WebSocket alike, decoded just as strictly as the others.

// Queue performs the message queue's commands (the engine).
type Queue interface {
	QueueAdd(ctx context.Context, p chat.QueueAdd) (chat.QueueAddAck, error)
	QueueUpdate(ctx context.Context, p chat.QueueUpdate) (chat.QueueItemAck, error)
	QueueRemove(ctx context.Context, p chat.QueueRemove) (chat.QueueItemAck, error)
	QueueResume(ctx context.Context, p chat.QueueResume) (chat.QueueResumeAck, error)
}

type queueAddRequest struct {
	UserMessage          *string `json:"user_message"`
	Mode                 *string `json:"mode"`
	ClientRequestID      *string `json:"client_request_id"`
	ExpectedStateVersion *int64  `json:"expected_state_version"`
}

// command decodes queue.add's fields; the limits are chat.QueueAdd.Validate's.
func (req queueAddRequest) command(userID, threadID, requestedBy string) (chat.QueueAdd, error) {
	p := chat.QueueAdd{UserID: userID, ThreadID: threadID, RequestedBy: requestedBy,
		ExpectedStateVersion: req.ExpectedStateVersion}
	if req.UserMessage == nil {
		return p, chat.Invalid("user_message is required: the message to queue")
	}
	p.UserMessage = *req.UserMessage
	if req.Mode != nil {
		if *req.Mode == "" {
			return p, chat.Invalid("mode must not be empty: omit it for %q", chat.QueueAfter)
		}
		p.Mode = *req.Mode
	}
	if req.ClientRequestID != nil {
		if *req.ClientRequestID == "" {
			return p, chat.Invalid("client_request_id must not be empty")
		}
		p.ClientRequestID = *req.ClientRequestID
	}
	return p, p.Validate()
}

type queueUpdateRequest struct {
	UserMessage          *string `json:"user_message"`
	Position             *int    `json:"position"`
	ExpectedStateVersion *int64  `json:"expected_state_version"`
}

func (req queueUpdateRequest) command(userID, threadID, itemID string) (chat.QueueUpdate, error) {
	p := chat.QueueUpdate{UserID: userID, ThreadID: threadID, ItemID: itemID, UserMessage: req.UserMessage,
		Position: req.Position, ExpectedStateVersion: req.ExpectedStateVersion}
	return p, p.Validate()
}

type queueVersionRequest struct {
	ExpectedStateVersion *int64 `json:"expected_state_version"`
}

func (req queueVersionRequest) remove(userID, threadID, itemID string) (chat.QueueRemove, error) {
	p := chat.QueueRemove{UserID: userID, ThreadID: threadID, ItemID: itemID,
		ExpectedStateVersion: req.ExpectedStateVersion}
	return p, p.Validate()
}

func (req queueVersionRequest) resume(userID, threadID string) (chat.QueueResume, error) {
	p := chat.QueueResume{UserID: userID, ThreadID: threadID, ExpectedStateVersion: req.ExpectedStateVersion}
	return p, p.Validate()
}

// HTTP: POST /api/threads/{id}/queue, PATCH and DELETE
// /api/threads/{id}/queue/{item_id}, POST /api/threads/{id}/queue/resume.

func (s *Server) queueAdd(w http.ResponseWriter, r *http.Request) {
	serveCommand(s, w, r, http.StatusCreated, mustHaveBody, "thread_id", inCallersName(r, queueAddRequest.command),
		s.runs.QueueAdd)
}

func (s *Server) queueUpdate(w http.ResponseWriter, r *http.Request) {
	serveCommand(s, w, r, http.StatusOK, mustHaveBody, "thread_id", withItem(r, queueUpdateRequest.command),
		s.runs.QueueUpdate)
}

func (s *Server) queueRemove(w http.ResponseWriter, r *http.Request) {
	serveCommand(s, w, r, http.StatusOK, mayBeEmpty, "thread_id", withItem(r, queueVersionRequest.remove),
		s.runs.QueueRemove)
}

func (s *Server) queueResume(w http.ResponseWriter, r *http.Request) {
	serveCommand(s, w, r, http.StatusOK, mayBeEmpty, "thread_id", queueVersionRequest.resume, s.runs.QueueResume)
}

// withItem adapts the decoder of a command on one queue item to
// serveCommand's build, with the item's id from the path's {item_id}.
func withItem[Req, Cmd any](r *http.Request, command func(req Req, userID, threadID, itemID string) (Cmd, error)) func(req Req, userID, threadID string) (Cmd, error) {
	return func(req Req, userID, threadID string) (Cmd, error) {
		itemID, err := pathID(r, "item_id", "item_id")
		if err != nil {
			var zero Cmd
			return zero, err
		}
		return command(req, userID, threadID, itemID)
	}
}

// WebSocket frames.

type wsQueueAdd struct {
	wsEnvelope
	ThreadID *string `json:"thread_id"`
	queueAddRequest
}

type wsQueueUpdate struct {
	wsEnvelope
	ThreadID *string `json:"thread_id"`
	ItemID   *string `json:"item_id"`
	queueUpdateRequest
}

type wsQueueRemove struct {
	wsEnvelope
	ThreadID *string `json:"thread_id"`
	ItemID   *string `json:"item_id"`
	queueVersionRequest
}

type wsQueueResume struct {
	wsEnvelope
	ThreadID *string `json:"thread_id"`
	queueVersionRequest
}

func (cmd *wsQueueAdd) target() (string, *string)    { return "thread_id", cmd.ThreadID }
func (cmd *wsQueueUpdate) target() (string, *string) { return "thread_id", cmd.ThreadID }
func (cmd *wsQueueRemove) target() (string, *string) { return "thread_id", cmd.ThreadID }
func (cmd *wsQueueResume) target() (string, *string) { return "thread_id", cmd.ThreadID }

// queueCommand runs a queue.* frame (dispatch sends it only those).
func (c *wsConn) queueCommand(typ string, data []byte) (any, error) {
	ctx, s := c.ctx, c.hub.s
	switch typ {
	case "queue.add":
		return wsCommand(ctx, data, c.user, func(cmd *wsQueueAdd, userID, threadID string) (chat.QueueAdd, error) {
			return cmd.command(userID, threadID, c.requestedBy())
		}, s.runs.QueueAdd)
	case "queue.update":
		return wsCommand(ctx, data, c.user, func(cmd *wsQueueUpdate, userID, threadID string) (chat.QueueUpdate, error) {
			if err := required("item_id", cmd.ItemID); err != nil {
				return chat.QueueUpdate{}, err
			}
			return cmd.command(userID, threadID, *cmd.ItemID)
		}, s.runs.QueueUpdate)
	case "queue.remove":
		return wsCommand(ctx, data, c.user, func(cmd *wsQueueRemove, userID, threadID string) (chat.QueueRemove, error) {
			if err := required("item_id", cmd.ItemID); err != nil {
				return chat.QueueRemove{}, err
			}
			return cmd.remove(userID, threadID, *cmd.ItemID)
		}, s.runs.QueueRemove)
	default: // queue.resume
		return wsCommand(ctx, data, c.user, func(cmd *wsQueueResume, userID, threadID string) (chat.QueueResume, error) {
			return cmd.resume(userID, threadID)
		}, s.runs.QueueResume)
	}
}
