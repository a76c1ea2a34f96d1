package engine

import (
	"context"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/tools"
)

// reconcileBatch bounds the lookups one pass makes.
const reconcileBatch = 16

// lookupTimeout bounds one lookup of a key at its provider.
const lookupTimeout = 10 * time.Second

// reconcile looks up, by their keys, the outcomes left unknown that no
// worker is settling any more (the call's result says unknown, or its run
// ended), every ReconcilePoll: the store hands out those due, with backoff
// per operation, until the provider knows the key or the horizon passes
// (store.SettleReconciliation; each change reaches the tabs as
// tool.updated). It runs on its own goroutine, so a slow provider never
// holds up lease renewal.
func (e *Engine) reconcile() {
	e.onTicks(e.cfg.ReconcilePoll, nil, func() {
		ops, err := e.store.DueReconciliations(e.ctx, reconcileBatch)
		if err != nil {
			if e.ctx.Err() == nil {
				e.log.Warn("list outcomes to reconcile", "err", err)
			}
			return
		}
		for _, op := range ops {
			if e.ctx.Err() != nil {
				return
			}
			known := e.lookUp(op)
			got, err := e.store.SettleReconciliation(e.ctx, op.OperationID, known)
			if err != nil {
				if e.ctx.Err() == nil {
					e.log.Warn("record reconciliation", "operation_id", op.OperationID, "err", err)
				}
				continue
			}
			switch {
			case got.Phase == chat.PhaseReconciled:
				e.log.Info("reconciled an unknown outcome", "operation_id", op.OperationID, "run_id", op.RunID)
			case got.ReconcileNextAt == nil:
				e.log.Warn("gave up reconciling an unknown outcome: only its provider can tell", "operation_id", op.OperationID, "run_id", op.RunID, "tool", op.Tool)
			}
		}
	})
}

// lookUp asks op's provider whether its key acted; a lookup that fails
// counts as not known (the next one is scheduled).
func (e *Engine) lookUp(op chat.Operation) bool {
	if e.tools == nil || op.IdempotencyKey == nil {
		return false
	}
	t, ok := e.tools.Get(op.Tool)
	if !ok {
		return false
	}
	c, ok := t.(tools.Committer)
	if !ok {
		return false
	}
	ctx, stop := context.WithTimeout(e.ctx, lookupTimeout)
	defer stop()
	st, err := c.Status(ctx, *op.IdempotencyKey)
	if err != nil {
		e.log.Debug("look up an unknown outcome", "operation_id", op.OperationID, "err", err)
		return false
	}
	return st.Known
}
