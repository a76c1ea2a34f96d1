package store

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/honestcancel/gateway/chat"
)

// Transactions that another instance made fail.
//
// On PostgreSQL, instances sharing the database lock the rows they decide
// on (txn.forUpdate). Two transactions can then wait for each other (a
// group commit locks several threads, in its own order); PostgreSQL breaks
// the cycle by failing one of them with a deadlock (SQLSTATE 40P01), a
// stricter isolation would fail one with a serialization failure (40001),
// and a lock held past lock_timeout (an instance frozen mid-transaction,
// see sessionLimits) fails the waiter with 55P03.
// Neither says anything about the request: the whole transaction runs
// again, its closures from scratch, after a short random wait so the two
// do not meet again at once. (On SQLite every write goes through one
// connection of one process: neither happens.)

// txAttempts bounds the runs of one transaction.
const txAttempts = 5

// retryable reports a failure that running the transaction again may cure.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001" || pe.Code == "55P03")
}

// backoff waits before attempt+1: a random time up to 2ms·2^attempt (at most
// about 64ms), or until ctx ends.
func backoff(ctx context.Context, attempt int) error {
	d := time.Duration(1+rand.IntN(2<<min(attempt, 5))) * time.Millisecond
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// refusal reports an error a write closure returns by decision (not found,
// conflict, not running …) rather than from the database. On PostgreSQL any
// other error leaves the transaction aborted, so a group commit cannot go on
// with it (see group.go).
func refusal(err error) bool {
	var ce *chat.Error
	var nr *chat.ErrNotRunning
	var th *threadHeld
	return errors.As(err, &ce) || errors.As(err, &nr) || errors.As(err, &th) || errors.Is(err, chat.ErrDeltasLost)
}
