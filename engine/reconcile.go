package engine

import (
	"context"
	"errors"
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
			got, err := e.store.SettleReconciliation(e.ctx, op.OperationID, e.lookUp(op))
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
// counts as not found (the next one is scheduled), unless the provider
// can never be asked (tools.ErrNoLookup).
func (e *Engine) lookUp(op chat.Operation) chat.Lookup {
	if e.tools == nil || op.IdempotencyKey == nil {
		return chat.LookupNotFound
	}
	t, ok := e.tools.Get(op.Tool)
	if !ok {
		return chat.LookupNotFound
	}
	c, ok := t.(tools.Committer)
	if !ok {
		return chat.LookupNotFound
	}
	ctx, stop := context.WithTimeout(e.ctx, lookupTimeout)
	defer stop()
	st, err := c.Status(ctx, *op.IdempotencyKey)
	switch {
	case errors.Is(err, tools.ErrNoLookup):
		return chat.LookupImpossible
	case err != nil:
		e.log.Debug("look up an unknown outcome", "operation_id", op.OperationID, "err", err)
		return chat.LookupNotFound
	case st.Known:
		return chat.LookupFound
	}
	return chat.LookupNotFound
}
