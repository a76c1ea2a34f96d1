package app

import (
	"context"
	"log/slog"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/store"
)

// queueAware is the store as the API and the page read it, with each
// queued run's place in line filled in (docs/protocol.md "Admission"): the
// store knows the queue, only the engine knows its free slots, so the
// position of a run that waits is the engine's answer (engine.QueuePosition).
// Every other method is the store's own.
type queueAware struct {
	*store.Store
	engine *engine.Engine
	log    *slog.Logger
}

// Snapshot is store.Snapshot with the active run's queue_position.
func (q queueAware) Snapshot(ctx context.Context, userID, threadID string) (chat.Snapshot, error) {
	snap, err := q.Store.Snapshot(ctx, userID, threadID)
	if err == nil {
		q.place(ctx, snap.ActiveRun)
	}
	return snap, err
}

// SnapshotLatest is store.SnapshotLatest with the active run's
// queue_position.
func (q queueAware) SnapshotLatest(ctx context.Context, userID, threadID string, limit int, maxBytes int64) (chat.Snapshot, error) {
	snap, err := q.Store.SnapshotLatest(ctx, userID, threadID, limit, maxBytes)
	if err == nil {
		q.place(ctx, snap.ActiveRun)
	}
	return snap, err
}

// Run is store.Run with its queue_position.
func (q queueAware) Run(ctx context.Context, userID, runID string) (chat.Run, error) {
	r, err := q.Store.Run(ctx, userID, runID)
	if err == nil && r.Status == chat.RunQueued {
		r.QueuePosition = q.position(ctx, runID)
	}
	return r, err
}

func (q queueAware) place(ctx context.Context, run *chat.ActiveRun) {
	if run != nil && run.Status == chat.RunQueued {
		run.QueuePosition = q.position(ctx, run.RunID)
	}
}

// position is the run's queue_position; a failed read leaves it out (the
// state it decorates was read, and is still true without it) and is
// logged unless the caller went away.
func (q queueAware) position(ctx context.Context, runID string) int {
	pos, err := q.engine.QueuePosition(ctx, runID)
	if err != nil {
		if ctx.Err() == nil {
			q.log.Warn("read a waiting run's place in the queue", "run_id", runID, "err", err)
		}
		return 0
	}
	return pos
}
