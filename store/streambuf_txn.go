package store

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
)

// ---- inside a write transaction ----

// holdStream takes the sequencer of c's thread for the rest of the
// transaction and writes its pending deltas into it (see streambuf.go). Called
// once per thread, when the transaction loads it.
func (t *txn) holdStream(c *threadCursor) error {
	if t.buf == nil {
		return nil
	}
	id := c.row.ThreadID
	ts, held := t.held[id]
	if held && !t.heldOnly[id] {
		return nil // taken along by this transaction already
	}
	if !held {
		if t.held == nil {
			t.held = map[string]*threadStream{}
		}
		ts = t.buf.thread(id)
		ts.mu.Lock()
		t.held[id] = ts
	}
	// Held by runChanged until now, or just taken: its pending deltas
	// come along either way.
	delete(t.heldOnly, id)
	if t.pg {
		if err := t.adoptShared(c, ts); err != nil {
			return err
		}
		return t.writePending(c, ts)
	}
	if !ts.known {
		ts.known, ts.written, ts.next, ts.reserved = true, c.row.LastSeq, c.row.LastSeq, max(
			c.row.SeqReserved,
			c.row.LastSeq,
		)
	}
	if c.row.LastSeq != ts.written {
		if len(ts.pending) > 0 {
			return fmt.Errorf(
				"thread %s: the database's last_seq %d is not the %d this process wrote, "+
					"so the deltas held in memory have no place: another process writes this database",
				id, c.row.LastSeq, ts.written,
			)
		}
		// Nothing in memory: the database is the truth.
		ts.written, ts.next, ts.reserved = c.row.LastSeq, c.row.LastSeq, max(c.row.SeqReserved, c.row.LastSeq)
	}
	return t.writePending(c, ts)
}

// writePending writes the thread's pending deltas at c's next seqs.
func (t *txn) writePending(c *threadCursor, ts *threadStream) error {
	// Consecutive batches of one message become one row (each delta
	// keeps the time it was fanned out with).
	for i := 0; i < len(ts.pending); {
		pb := ts.pending[i]
		var texts []string
		var tss []int64
		j := i
		for ; j < len(ts.pending) && ts.pending[j].messageID == pb.messageID && ts.pending[j].runID == pb.runID; j++ {
			texts = append(texts, ts.pending[j].texts...)
			for range ts.pending[j].texts {
				tss = append(tss, ts.pending[j].ts)
			}
		}
		if err := t.writeBatch(c, pb.runID, pb.messageID, texts, tss); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// adoptShared is holdStream's check on PostgreSQL, where other instances
// write the thread too: the sequencer in memory counts only while the row
// still names this process's reservation exactly as the sequencer left
// it. Otherwise another instance wrote past it (recording it as a gap):
// the deltas held for it are dropped, lost, and the row is the truth.
// A live reservation of another process is not this transaction's to use:
// it is written past if the caller was allowed to (the holder did not
// answer, see Store.acrossHolders), skipped when the transaction only
// visits the thread (flush, yield), and refused with *threadHeld
// otherwise.
func (t *txn) adoptShared(c *threadCursor, ts *threadStream) error {
	row := &c.row
	reserved := row.SeqReserved > row.LastSeq
	mine := ts.known && ts.holder != "" && reserved && row.SeqHolder == ts.holder && row.LastSeq == ts.written
	if mine {
		return nil
	}
	if len(ts.pending) > 0 {
		var n int64
		t.buf.mu.Lock()
		for _, pb := range ts.pending {
			n += int64(len(pb.texts))
			t.buf.lost[pb.messageID] = pb.runID
		}
		t.buf.mu.Unlock()
		ts.pending = nil
		t.buf.pending.Add(-n)
		t.buf.stats.deltasLost.Add(n)
	}
	own := ts.holder != "" && row.SeqHolder == ts.holder
	ts.known, ts.written, ts.next, ts.reserved, ts.holder = true, row.LastSeq, row.LastSeq, row.LastSeq, ""
	if !reserved {
		return nil
	}
	switch {
	case own || t.pastOK[row.ThreadID] == row.SeqReserved:
		// This process's own reservation that no longer matches (the
		// database lost writes: it stopped), or one whose holder did not
		// answer: record it lost and go past it.
		reason := gapWrittenPast
		if own {
			reason = gapStopped
		}
		t.wrotePast = t.wrotePast || !own
		if _, err := t.exec(`INSERT INTO stream_gaps (thread_id, first_seq, last_seq, recorded_at, reason)
			VALUES (?, ?, ?, ?, ?)`,
			row.ThreadID, row.LastSeq+1, row.SeqReserved, ms(t.now), reason); err != nil {
			return fmt.Errorf("record the seqs reserved by %s as lost: %w", row.SeqHolder, err)
		}
		t.buf.stats.writtenPast.Add(1)
		row.LastSeq, row.SeqReserved, row.SeqHolder = row.SeqReserved, 0, ""
		c.touched = true
		return nil
	case t.skipHeld:
		delete(t.threads, row.ThreadID) // nothing of it may change here
		return errHeldElsewhere
	default:
		return &threadHeld{threadID: row.ThreadID, holder: row.SeqHolder, reserved: row.SeqReserved}
	}
}

// Why a stream_gaps row's seqs were never written (its reason column).
const (
	gapStopped     = "stopped"      // a process (or the database) stopped before writing them
	gapWrittenPast = "written_past" // another instance wrote past a holder that did not answer
)

// threadHeld refuses a write to a thread whose seqs another process
// reserved (PostgreSQL): Store.acrossHolders asks the holder to yield and
// runs the write again.
type threadHeld struct {
	threadID, holder string
	reserved         int64
}

func (e *threadHeld) Error() string {
	return fmt.Sprintf("thread %s is streaming on %s (seqs reserved up to %d)", e.threadID, e.holder, e.reserved)
}

// errHeldElsewhere is adoptShared's answer to a transaction that only
// visits threads (t.skipHeld): this one is another process's now.
var errHeldElsewhere = errors.New("thread held by another process")

// reserve moves the thread's reservation ahead, under holder (a run lease
// owner), when few seqs are left. fresh is a claim's reservation: on
// PostgreSQL only a claim reserves for a thread another instance asked
// for (see yielded).
func (t *txn) reserve(c *threadCursor, holder string, fresh bool) {
	if t.buf == nil || holder == "" {
		return
	}
	if t.pg {
		ts := t.held[c.row.ThreadID]
		if ts == nil {
			return
		}
		if fresh {
			t.unyield = append(t.unyield, c.row.ThreadID)
		} else if ts.yielded && !slices.Contains(t.unyield, c.row.ThreadID) {
			return
		}
		if c.row.SeqReserved > c.row.LastSeq && c.row.SeqHolder != holder {
			return // another run's execution holds it (adoptShared let it be)
		}
	}
	// While the transaction holds the thread, the database's row is at
	// least as far as the sequencer: it alone decides.
	if c.row.SeqReserved-c.row.LastSeq < reserveLow {
		c.row.SeqReserved = c.row.LastSeq + reserveBlock
		c.row.SeqHolder = holder
		c.touched = true
	}
}

// release gives back the thread's reserved seqs: the step that streamed
// ends in this transaction (published, or its run ends), so at a crash
// from here on nothing of it is lost and no seq is recorded lost. A run
// streaming again reserves anew (its first batch takes the slow path).
func (t *txn) release(c *threadCursor) {
	if t.buf == nil || (c.row.SeqReserved == 0 && c.row.SeqHolder == "") {
		return
	}
	c.row.SeqReserved, c.row.SeqHolder = 0, ""
	c.touched = true
}

// writeBatch writes one batch of a streamed message's deltas at c's next
// seqs (they were handed out already when the batch was fanned out, or
// are handed out now by the caller's events), counting it into its
// message's row; the first batch of a message creates the row.
func (t *txn) writeBatch(c *threadCursor, runID, messageID string, texts []string, tss []int64) error {
	chars := 0
	for _, text := range texts {
		chars += utf8.RuneCountInString(text)
	}
	first := c.row.LastSeq + 1
	var parts int
	err := t.execRow(`UPDATE stream_messages SET parts = parts + ?, chars = chars + ? WHERE message_id = ?
		RETURNING parts`,
		len(texts), chars, messageID).
		Scan(&parts)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := t.exec(`INSERT INTO stream_messages
			(message_id, thread_id, run_id, first_seq, parts, chars, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)`,
			messageID, c.row.ThreadID, runID, first, len(texts), chars, ms(t.now)); err != nil {
			return fmt.Errorf("start streamed message: %w", err)
		}
		parts = 0
	case err != nil:
		return fmt.Errorf("count streamed text: %w", err)
	default:
		parts -= len(texts)
	}
	encoded, err := encodeTexts(texts)
	if err != nil {
		return err
	}
	ts, offsets, err := encodeTimes(tss)
	if err != nil {
		return err
	}
	c.row.LastSeq += int64(len(texts))
	c.touched = true
	if _, err := t.exec(`INSERT INTO stream_batches (`+batchCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		c.row.ThreadID, first, c.row.LastSeq, runID, messageID, parts, encoded, ts, offsets); err != nil {
		return fmt.Errorf("buffer deltas: %w", err)
	}
	t.buffered += int64(len(texts))
	return nil
}

// confirmLive stages runID as confirmed running under lease on
// messageID ("" any), effective when the transaction commits unless the
// transaction changes the run again after it (runChanged).
func (t *txn) confirmLive(lease chat.Lease, threadID, messageID string) {
	if t.buf != nil {
		t.live = append(
			t.live,
			stagedLive{liveRun{lease: lease, threadID: threadID, messageID: messageID}, len(t.changedRuns)},
		)
	}
}

// leaseHolds stages, for commit, that lease holds for ttl from start (a
// moment before the write that grants or renews it) — of which the fast
// path trusts leaseSafe (PostgreSQL; see streamBuffer.until).
func (t *txn) leaseHolds(lease chat.Lease, start time.Time, ttl time.Duration) {
	if t.buf != nil && t.pg {
		t.leases = append(t.leases, leaseUntil{lease: lease, at: start.Add(time.Duration(float64(ttl) * leaseSafe))})
	}
}

// runChanged notes that the transaction changes runID's status or lease:
// at commit the buffer forgets it (see streambuf.go).
//
// A run whose deltas may skip the database has its thread's sequencer
// held from here to the end of the transaction (if the transaction does
// not hold it already), so that no batch of it is fanned out between the
// commit and the forgetting.
func (t *txn) runChanged(runID string) {
	if t.buf == nil {
		return
	}
	t.changedRuns = append(t.changedRuns, runID)
	lr, ts, ok := t.buf.live(runID)
	if !ok {
		return
	}
	if _, held := t.held[lr.threadID]; held {
		return
	}
	ts.mu.Lock()
	if t.held == nil {
		t.held = map[string]*threadStream{}
	}
	t.held[lr.threadID] = ts
	if t.heldOnly == nil {
		t.heldOnly = map[string]bool{}
	}
	t.heldOnly[lr.threadID] = true
}

// endStreams ends the transaction's hold on its threads' sequencers, after
// it committed (and fanned out its events) or rolled back. On commit every
// held thread's pending deltas are written, so its sequencer moves to what
// the transaction left; runs it confirmed become live, runs it changed are
// forgotten.
func (t *txn) endStreams(committed bool) {
	if t.buf == nil {
		return
	}
	b := t.buf
	if committed {
		for id, ts := range t.held {
			c, ok := t.threads[id]
			if !ok {
				continue // held for runChanged, or loaded by a refused request only: nothing was written
			}
			for _, pb := range ts.pending {
				b.pending.Add(-int64(len(pb.texts)))
			}
			ts.pending = nil
			ts.written, ts.next = c.row.LastSeq, c.row.LastSeq
			ts.reserved = max(c.row.SeqReserved, c.row.LastSeq)
			ts.holder = ""
			if ts.reserved > ts.written {
				ts.holder = c.row.SeqHolder
			}
		}
		for _, id := range t.unyield {
			if ts := t.held[id]; ts != nil {
				ts.yielded = false
			}
		}
		for _, id := range t.yield {
			if ts := t.held[id]; ts != nil {
				ts.yielded = true
			}
		}
		b.mu.Lock()
		// Each changed run was live when runChanged held its thread,
		// which is still held. The transaction's last word on a run wins:
		// a confirmation made after its last change (a claim) stands, one
		// made before it goes.
		lastChange := make(map[string]int, len(t.changedRuns))
		for i, runID := range t.changedRuns {
			delete(b.runs, runID)
			delete(b.until, runID)
			lastChange[runID] = i + 1
		}
		for msg, runID := range b.lost {
			if _, changed := lastChange[runID]; changed {
				delete(b.lost, msg)
			}
		}
		for _, u := range t.leases {
			if cur, ok := b.until[u.lease.RunID]; !ok || cur.lease != u.lease || u.at.After(cur.at) {
				b.until[u.lease.RunID] = u
			}
		}
		for _, sl := range t.live {
			if sl.after >= lastChange[sl.lease.RunID] {
				b.runs[sl.lease.RunID] = sl.liveRun
			}
		}
		b.mu.Unlock()
	}
	for _, ts := range t.held {
		ts.mu.Unlock()
	}
	clear(t.held)
	clear(t.heldOnly)
	t.live, t.changedRuns, t.yield, t.unyield, t.leases = nil, nil, nil, nil, nil
}
