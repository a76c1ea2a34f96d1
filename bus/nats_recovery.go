package bus

import (
	"context"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// recoverLocked starts the thread's recovery goroutine, or asks the
// running one for another pass.
func (b *NATS) recoverLocked(threadID string, t *threadState) {
	if b.closed {
		return
	}
	if t.recovering {
		t.again = true
		return
	}
	t.recovering = true
	b.wg.Go(func() { b.recover(threadID, t) })
}

// recover reads the thread's events after the last delivered one from the
// log and delivers them with the held ones, in order; it reruns while new
// gaps appeared during a read. On a read error it stops: the sweep retries.
func (b *NATS) recover(threadID string, t *threadState) {
	var idle time.Duration
	for {
		b.mu.Lock()
		if b.threads[threadID] != t {
			b.mu.Unlock()
			return
		}
		after := t.last
		t.again = false
		b.mu.Unlock()

		var rep chat.Replay
		var err error
		select {
		case b.reads <- struct{}{}:
			ctx, cancel := context.WithTimeout(b.ctx, b.cfg.LogTimeout)
			rep, err = b.cfg.Log.ThreadEvents(ctx, threadID, after)
			cancel()
			<-b.reads
		case <-b.ctx.Done():
			err = b.ctx.Err()
		}

		b.mu.Lock()
		if b.threads[threadID] != t {
			b.mu.Unlock()
			return
		}
		if err != nil {
			t.recovering = false
			warn := b.ctx.Err() == nil && time.Since(b.warnedAt) >= warnEvery
			if warn {
				b.warnedAt = time.Now()
			}
			b.mu.Unlock()
			if warn {
				b.log.Warn(
					"recover thread events from the log failed: the sweep retries "+
						"(further failures within 5s are not logged)",
					"thread_id", threadID,
					"after_seq", after,
					"err", err,
				)
			}
			return
		}
		b.stats.Recoveries++
		b.applyReplayLocked(threadID, t, rep)
		if b.threads[threadID] != t || !t.again || b.closed {
			t.recovering = false
			b.mu.Unlock()
			return
		}
		progress := t.last > after
		b.mu.Unlock()
		if progress {
			idle = 0
			continue
		}
		// The log is behind what NATS brought (the instance streaming the
		// thread writes its deltas after it fans them out, every few ms):
		// read it again a little later, later each time.
		idle = min(max(2*idle, time.Millisecond), 250*time.Millisecond)
		select {
		case <-time.After(idle):
		case <-b.ctx.Done():
			b.mu.Lock()
			t.recovering = false
			b.mu.Unlock()
			return
		}
	}
}

// applyReplayLocked merges a log read into the held events and delivers
// them in order. A gap that remains below rep.LastSeq was committed before
// the read yet the log cannot give it (Complete=false: purged deltas, too
// long a gap): it is skipped, and the sinks, which check seqs, see it and
// close their connections so the clients resync from a snapshot. A gap
// above rep.LastSeq was committed after the read: another pass reads it.
func (b *NATS) applyReplayLocked(threadID string, t *threadState, rep chat.Replay) {
	for _, ev := range rep.Events {
		if ev.Seq <= t.last {
			continue
		}
		if _, held := t.pending[ev.Seq]; held {
			continue
		}
		if ev.ThreadID != threadID {
			cp := *ev
			cp.ThreadID = threadID
			ev = &cp
		}
		t.pending[ev.Seq] = ev
		b.stats.Recovered++
	}
	for {
		b.drainLocked(threadID, t)
		if b.threads[threadID] != t {
			return
		}
		if len(t.pending) == 0 {
			if t.last < rep.LastSeq {
				// Not held by the log and nothing after it yet: the next
				// event shows the gap to the sinks.
				b.log.Warn(
					"events missing from the log: delivering past them",
					"thread_id", threadID,
					"missing_from", t.last+1,
					"missing_to", rep.LastSeq,
				)
				b.skipLocked(threadID, t, rep.LastSeq)
			}
			return
		}
		first := minSeq(t.pending)
		if first-1 > rep.LastSeq {
			t.again = true
			return
		}
		b.log.Warn(
			"events missing from the log: delivering past them",
			"thread_id", threadID,
			"missing_from", t.last+1,
			"missing_to", first-1,
		)
		b.skipLocked(threadID, t, first-1)
		if b.threads[threadID] != t {
			return
		}
	}
}

// skipLocked gives up the seqs after t.last up to through, which nobody
// can deliver any more: LossAware sinks are told, and those that miss some
// of them dropped (their clients start over from a snapshot); the others
// see the gap in the next event's seq. The thread's state goes with its last sink.
func (b *NATS) skipLocked(threadID string, t *threadState, through int64) {
	b.stats.Skipped += through - t.last
	t.last = through
	t.wake()
	t.recent, t.recentAt = nil, nil // no longer consecutive up to last
	for s := range t.sinks {
		if la, ok := s.(LossAware); ok && !la.Lost(threadID, through) {
			delete(t.sinks, s)
		}
	}
	if len(t.sinks) == 0 && b.threads[threadID] == t {
		delete(b.threads, threadID)
	}
}

// sweeper compares, every SweepEvery and when NATS asks (reconnect, slow
// consumer), the log's last seq of each thread with local sinks with what
// was delivered, and recovers the threads that are behind: it catches an
// event whose NATS message was lost when nothing follows it.
func (b *NATS) sweeper() {
	tick := time.NewTicker(b.cfg.SweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-tick.C:
		case <-b.resync:
		}
		b.sweep()
	}
}

func (b *NATS) sweep() {
	b.mu.Lock()
	ids := make([]string, 0, len(b.threads))
	for id, t := range b.threads {
		if !t.baselining {
			ids = append(ids, id)
		}
	}
	b.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	// The server must hold our subscription before the log is read: after
	// a reconnect the client resends it, and until the server has it
	// another instance may append and publish an event that neither this
	// read nor NATS brings here. A round trip orders them (the server
	// handles a connection's SUB before its PING); when it fails we are
	// disconnected, and the reconnect sweeps again.
	_ = b.nc.FlushTimeout(b.cfg.LogTimeout)
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.LogTimeout)
	seqs, err := b.cfg.Log.LastSeqs(ctx, ids)
	cancel()
	if err != nil {
		if b.ctx.Err() == nil {
			b.log.Warn("sweep: read last seqs failed", "threads", len(ids), "err", err)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old := time.Now().Add(-recentAge).UnixNano()
	for _, id := range ids {
		t := b.threads[id]
		if t != nil {
			t.pruneRecent(old)
		}
		last, ok := seqs[id]
		if t == nil || t.baselining || !ok {
			continue
		}
		if !t.based {
			// The baseline read failed and nothing arrived since: start
			// from here (a later event shows any gap to the sinks).
			t.based, t.last = true, last
			t.wake()
			b.drainLocked(id, t)
			continue
		}
		if last > t.last || len(t.pending) > 0 {
			b.recoverLocked(id, t)
		}
	}
}

// wakeSweep asks the sweeper for a sweep now; never blocks.
func (b *NATS) wakeSweep() {
	select {
	case b.resync <- struct{}{}:
	default:
	}
}
