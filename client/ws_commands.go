// The protocol's commands over a WebSocket connection (Conn), one typed
// method each, and the timing a caller can ask of one.

package client

import (
	"context"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// CommandTiming is when a command sent over a Conn left and when its
// answer came, taken where they happen: Sent just before the command's
// frame was written (its last attempt's, when it was resent), Answered by
// the Conn's reader goroutine when it read the frame holding the ack or
// error, before the caller is woken. Their difference is the command's
// round trip without the caller's own scheduling delay, which a program
// measuring latency under load (a load generator) wants left out.
// Answered is zero when no answer came (ErrConnectionLost, ctx ended).
type CommandTiming struct {
	Sent     time.Time
	Answered time.Time
}

type timingKey struct{}

// WithCommandTiming returns a copy of ctx that makes the Conn command
// given it (StartRun, CancelRun, … of a Conn; not Subscribe) fill in t,
// on the caller's goroutine, before the command returns. One t per
// command in flight. Commands sent over HTTP (the Client's) leave t
// alone.
func WithCommandTiming(ctx context.Context, t *CommandTiming) context.Context {
	return context.WithValue(ctx, timingKey{}, t)
}

// Hello announces the connection's tab again (hello) and waits for the
// answer. The gateway answers it without reading or writing its database,
// so its round trip is the floor under every other command's on the same
// connection: what the network, both processes' scheduling and the
// gateway's command path cost (the benchmark's probe beside a cancel). A
// Conn without a TabID gets the gateway's invalid_request.
func (c *Conn) Hello(ctx context.Context) error {
	return c.do(ctx, "hello", map[string]string{"tab_id": c.opts.TabID}, true, nil)
}

// StartRun sends run.start (see Client.StartRun). A request with a
// ClientRequestID is resent when the connection drops before the answer.
func (c *Conn) StartRun(ctx context.Context, r StartRunRequest) (chat.RunStartAck, error) {
	return doFor[chat.RunStartAck](ctx, c, "run.start", r.body(true), r.ClientRequestID != "")
}

// CancelRun sends run.cancel, requested_by this tab (see Client.CancelRun).
func (c *Conn) CancelRun(ctx context.Context, r CancelRunRequest) (chat.CancelAck, error) {
	return doFor[chat.CancelAck](
		ctx,
		c,
		"run.cancel",
		cancelBody{RunID: r.RunID, Reason: r.Reason, ExpectedStateVersion: r.ExpectedStateVersion},
		false,
	)
}

// SaveFragment sends fragment.save (see Client.SaveFragment).
func (c *Conn) SaveFragment(ctx context.Context, r SaveFragmentRequest) (chat.FragmentSaved, error) {
	return doFor[chat.FragmentSaved](
		ctx,
		c,
		"fragment.save",
		fragmentBody{
			ThreadID:             r.ThreadID,
			MessageID:            r.MessageID,
			LastSeq:              r.LastSeq,
			ExpectedStateVersion: r.ExpectedStateVersion,
		},
		false,
	)
}

// DeleteDraft sends draft.delete (see Client.DeleteDraft).
func (c *Conn) DeleteDraft(ctx context.Context, r DeleteDraftRequest) (chat.DraftDeleted, error) {
	return doFor[chat.DraftDeleted](
		ctx,
		c,
		"draft.delete",
		draftBody{ThreadID: r.ThreadID, MessageID: r.MessageID, ExpectedStateVersion: r.ExpectedStateVersion},
		false,
	)
}

// Fork sends thread.fork (see Client.Fork).
func (c *Conn) Fork(ctx context.Context, threadID, fromCheckpointID string) (chat.ForkAck, error) {
	return doFor[chat.ForkAck](
		ctx,
		c,
		"thread.fork",
		forkBody{ThreadID: threadID, FromCheckpointID: fromCheckpointID},
		false,
	)
}

// Checkout sends thread.checkout (see Client.Checkout).
func (c *Conn) Checkout(ctx context.Context, r CheckoutRequest) (chat.CheckoutAck, error) {
	return doFor[chat.CheckoutAck](
		ctx,
		c,
		"thread.checkout",
		checkoutBody{ThreadID: r.ThreadID, CheckpointID: r.CheckpointID, ExpectedStateVersion: r.ExpectedStateVersion},
		false,
	)
}

// DeleteThread sends thread.delete (see Client.DeleteThread).
func (c *Conn) DeleteThread(ctx context.Context, r DeleteThreadRequest) (chat.ThreadDeletedAck, error) {
	return doFor[chat.ThreadDeletedAck](
		ctx,
		c,
		"thread.delete",
		deleteThreadBody{ThreadID: r.ThreadID, ExpectedStateVersion: r.ExpectedStateVersion},
		false,
	)
}

// ConfirmTool sends tool.confirm (see Client.ConfirmTool).
func (c *Conn) ConfirmTool(
	ctx context.Context,
	operationID string,
	expectedStateVersion int64,
) (chat.ConfirmAck, error) {
	return doFor[chat.ConfirmAck](
		ctx,
		c,
		"tool.confirm",
		decideBody{OperationID: operationID, ExpectedStateVersion: expectedStateVersion},
		false,
	)
}

// RejectTool sends tool.reject (see Client.RejectTool).
func (c *Conn) RejectTool(
	ctx context.Context,
	operationID string,
	expectedStateVersion int64,
) (chat.ConfirmAck, error) {
	return doFor[chat.ConfirmAck](
		ctx,
		c,
		"tool.reject",
		decideBody{OperationID: operationID, ExpectedStateVersion: expectedStateVersion},
		false,
	)
}

// doFor is c.do of a command whose ack is one T.
func doFor[T any](ctx context.Context, c *Conn, typ string, body any, resend bool) (T, error) {
	var ack T
	err := c.do(ctx, typ, body, resend, &ack)
	return ack, err
}
