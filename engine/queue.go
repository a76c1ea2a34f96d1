package engine

import (
	"context"

	"github.com/honestcancel/gateway/chat"
)

// The message queue's commands (docs/protocol.md "Message queue"). The
// store decides and records each in one transaction, a run it starts
// included (the dispatcher claims it on the store's QueueStarts); the
// engine carries an interrupt's cancel to the run's execution, as after
// run.cancel.

// QueueAdd performs queue.add.
func (e *Engine) QueueAdd(ctx context.Context, p chat.QueueAdd) (chat.QueueAddAck, error) {
	ack, interrupted, err := e.store.QueueAdd(ctx, p)
	if err != nil {
		return ack, err
	}
	if interrupted != nil {
		e.carryCancel(interrupted.RunID, interrupted.Prev)
	}
	return ack, nil
}

// QueueUpdate performs queue.update.
func (e *Engine) QueueUpdate(ctx context.Context, p chat.QueueUpdate) (chat.QueueItemAck, error) {
	return e.store.QueueUpdate(ctx, p)
}

// QueueRemove performs queue.remove.
func (e *Engine) QueueRemove(ctx context.Context, p chat.QueueRemove) (chat.QueueItemAck, error) {
	return e.store.QueueRemove(ctx, p)
}

// QueueResume performs queue.resume.
func (e *Engine) QueueResume(ctx context.Context, p chat.QueueResume) (chat.QueueResumeAck, error) {
	return e.store.QueueResume(ctx, p)
}
