package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/honestcancel/gateway/chat"
)

// Threads another instance streams on (PostgreSQL with StreamBuffer; see
// streambuf.go): a write that meets another process's reservation asks
// that process to yield the thread, and writes past the reservation when
// it does not answer.

// StreamPeers reaches the other instances sharing the database. The NATS
// bus implements it.
type StreamPeers interface {
	// YieldStream asks the process holder (a run lease owner) to write its
	// pending deltas of the thread and give the thread's reservation back
	// (its Store.YieldStream), and waits for the answer until ctx ends;
	// it may fail sooner when the holder does not confirm it got the
	// request (gone, stopped, cut off). An error means it did not answer
	// that it did.
	YieldStream(ctx context.Context, holder, threadID string) error
}

type peersBox struct{ p StreamPeers }

// SetStreamPeers connects the store to the other instances (wiring's
// second phase: the bus that implements StreamPeers reads this store's
// event log, so it exists only after the store). Call it before the store
// serves; nil disconnects.
func (s *Store) SetStreamPeers(p StreamPeers) {
	if p == nil {
		s.peers.Store(nil)
		return
	}
	s.peers.Store(&peersBox{p})
}

// StreamStats counts what the stream buffer did across instances since
// Open.
type StreamStats struct {
	// Yields counts reservations other instances were asked for and gave
	// back; Unanswered those they did not answer for within the bound.
	Yields, Unanswered int64
	// WrittenPast counts reservations recorded as lost and written past
	// (a holder that did not answer, or this process's own reservation
	// another instance had moved beyond).
	WrittenPast int64
	// DeltasLost counts deltas fanned out by this process and dropped
	// unwritten because another instance had written past their seqs.
	DeltasLost int64
	// Buffered is the deltas held in memory now.
	Buffered int64
}

type streamCounters struct {
	yields, unanswered, writtenPast, deltasLost atomic.Int64
}

// StreamStats reports the stream buffer's counters (zero without one).
func (s *Store) StreamStats() StreamStats {
	b := s.buf
	if b == nil {
		return StreamStats{}
	}
	return StreamStats{Yields: b.stats.yields.Load(), Unanswered: b.stats.unanswered.Load(),
		WrittenPast: b.stats.writtenPast.Load(), DeltasLost: b.stats.deltasLost.Load(), Buffered: b.pending.Load()}
}

type pastKey struct{}

// pastFrom is the reservations a write may go past (acrossHolders).
func pastFrom(ctx context.Context) map[string]int64 {
	m, _ := ctx.Value(pastKey{}).(map[string]int64)
	return m
}

// acrossHolders runs one write (try, given the context to run it with)
// and, each time it is refused because another process holds a thread's
// seqs, asks that holder to yield and runs it again; a holder that does
// not confirm the request (StreamPeers bounds that) or does not answer
// within yieldTimeout has its reservation written past by the next run
// (recorded as lost). Without a stream buffer it is just try.
func (s *Store) acrossHolders(ctx context.Context, try func(ctx context.Context) error) error {
	if s.buf == nil || !s.pg {
		return try(ctx)
	}
	var past, asked map[string]int64
	for round := 1; ; round++ {
		run := ctx
		if past != nil {
			run = context.WithValue(ctx, pastKey{}, past)
		}
		err := try(run)
		var h *threadHeld
		if !errors.As(err, &h) {
			return err
		}
		if round >= maxHeldRounds {
			return fmt.Errorf("%w: asked %d times, it keeps reserving: try again", err, round)
		}
		if past[h.threadID] == h.reserved {
			// Allowed already and refused again: cannot happen (adoptShared
			// writes past what it is allowed to); do not spin on it.
			return err
		}
		if asked[h.threadID] == h.reserved || s.askYield(ctx, h) != nil {
			// (Asked already, answered, and the same reservation is still
			// there: the holder does not know it as its own any more, so
			// it is written past like one whose holder does not answer.)
			if err := ctx.Err(); err != nil {
				return err
			}
			if past == nil {
				past = map[string]int64{}
			}
			past[h.threadID] = h.reserved
			continue
		}
		if asked == nil {
			asked = map[string]int64{}
		}
		asked[h.threadID] = h.reserved
	}
}

// askYield asks the holder of h's thread to yield it, for at most
// yieldTimeout.
func (s *Store) askYield(ctx context.Context, h *threadHeld) error {
	box := s.peers.Load()
	if box == nil {
		s.buf.stats.unanswered.Add(1)
		return errors.New("no peers to ask")
	}
	ask, cancel := context.WithTimeout(ctx, yieldTimeout)
	defer cancel()
	if err := box.p.YieldStream(ask, h.holder, h.threadID); err != nil {
		s.buf.stats.unanswered.Add(1)
		return err
	}
	s.buf.stats.yields.Add(1)
	return nil
}

// YieldStream is what another instance asks of this one through
// StreamPeers: write the thread's pending deltas and give back its
// reserved seqs, if this process holds them, in one urgent transaction.
// The thread then streams through the slow path (written before fanned
// out) until this process claims a run on it again. Holding nothing of
// the thread is a success too: the asker finds the row as it is.
func (s *Store) YieldStream(ctx context.Context, threadID string) error {
	if s.buf == nil {
		return nil
	}
	return s.writeUrgent(ctx, func(t *txn) error {
		t.skipHeld = true
		c, err := t.engineThread(threadID)
		t.skipHeld = false
		if errors.Is(err, errHeldElsewhere) || chat.ErrorCode(err) == chat.CodeNotFound {
			return nil
		}
		if err != nil {
			return err
		}
		if c.row.SeqReserved > c.row.LastSeq {
			t.release(c)
		}
		t.yield = append(t.yield, threadID)
		return nil
	})
}

// RunHolder is the lease owner of an active run: the process executing it
// ("" when none does, or the run is not active), as last committed.
func (s *Store) RunHolder(ctx context.Context, runID string) (string, error) {
	var owner sql.NullString
	err := s.reader.GetContext(
		ctx, &owner,
		s.reader.Rebind(`SELECT lease_owner FROM runs WHERE run_id = ? AND status IN `+activeStatuses),
		runID,
	)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the run's lease: %w", err)
	}
	return owner.String, nil
}
