package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// Two instances on one PostgreSQL database, both fanning deltas out before
// they write them (Options.StreamBuffer): a write one of them makes on a
// thread the other streams on. The instances reach each other through
// peers that call the other store's YieldStream directly (in production
// the NATS bus carries the request; bus/nats_test.go tests that part).

// peerNet routes YieldStream requests to the store holding each lease
// owner's reservations; a holder it does not know, or one marked mute,
// does not answer.
type peerNet struct {
	mu     sync.Mutex
	stores map[string]*store.Store
	mute   map[string]bool
	// confused holders answer yes and give nothing back (a process that
	// no longer knows the reservation as its own).
	confused map[string]bool
	asked    []string
}

func (n *peerNet) YieldStream(ctx context.Context, holder, threadID string) error {
	n.mu.Lock()
	st, mute, confused := n.stores[holder], n.mute[holder], n.confused[holder]
	n.asked = append(n.asked, holder)
	n.mu.Unlock()
	if confused {
		return nil
	}
	if st == nil || mute {
		<-ctx.Done() // a stalled instance: the asker's bound decides
		return ctx.Err()
	}
	return st.YieldStream(ctx, threadID)
}

// deltaSeqs are the seqs of the deltas tap saw (one thread per test).
func deltaSeqs(tap *feedTap) []int64 {
	var out []int64
	for _, ev := range tap.deltas() {
		out = append(out, ev.Seq)
	}
	return out
}

type sharedPair struct {
	a, b     *store.Store
	recA     *feedTap
	net      *peerNet
	dsn      string
	holderA  string
	threadID string
	runID    string
	lease    chat.Lease
	message  string
}

// streamingOnA opens instances A and B, starts a run on a thread through
// B, lets A claim it (as holder "gwA.p1") and stream three deltas, which
// A fans out before it writes them. before, if given, runs on the pair
// right after the claim.
func streamingOnA(t *testing.T, before ...func(p *sharedPair)) *sharedPair {
	t.Helper()
	dsn := postgresDSN(t)
	p := &sharedPair{recA: &feedTap{}, net: &peerNet{stores: map[string]*store.Store{}, mute: map[string]bool{}, confused: map[string]bool{}}, dsn: dsn, holderA: "gwA.p1"}
	var err error
	if p.a, err = store.Open(ctx, dsn, store.Options{StreamBuffer: true, OnCommit: p.recA.publish}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.a.Close() })
	if p.b, err = store.Open(ctx, dsn, store.Options{StreamBuffer: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.b.Close() })
	p.a.SetStreamPeers(p.net)
	p.b.SetStreamPeers(p.net)
	p.net.stores[p.holderA] = p.a

	snap := newThread(t, p.b)
	p.threadID = snap.ThreadID
	p.runID = startRun(t, p.b, p.threadID, snap.StateVersion, "hello")
	claim, err := p.a.Claim(ctx, p.holderA, time.Hour)
	if err != nil || claim == nil || claim.Run.RunID != p.runID {
		t.Fatalf("claim on A = %+v, %v", claim, err)
	}
	p.lease = claim.Lease
	for _, f := range before {
		f(p)
	}
	p.message = chat.NewID(chat.PrefixMessage)
	for _, w := range []string{"Hel", "lo ", "there"} {
		if err := p.a.AppendDeltas(ctx, p.lease, p.message, []string{w}); err != nil {
			t.Fatal(err)
		}
	}
	if got := deltaSeqs(p.recA); len(got) != 3 {
		t.Fatalf("A fanned out deltas %v, want 3", got)
	}
	return p
}

// cancelThroughB requests the cancel of p's run through instance B (a tab
// connected to B) and returns how long the request took.
func (p *sharedPair) cancelThroughB(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	if _, _, err := p.b.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: p.runID, Reason: "user_requested", RequestedBy: "tab:b"}); err != nil {
		t.Fatalf("cancel through B: %v", err)
	}
	return time.Since(start)
}

// finishCancelOnA finishes the cancelled run on A, under A's lease, as A's
// execution would at its next safe point.
func (p *sharedPair) finishCancelOnA(t *testing.T) {
	t.Helper()
	if _, err := p.a.FinishCancel(ctx, p.runID, &p.lease, 0); err != nil {
		t.Fatal(err)
	}
}

func (p *sharedPair) lastDelta(t *testing.T) int64 {
	t.Helper()
	seqs := deltaSeqs(p.recA)
	return seqs[len(seqs)-1]
}

// writtenDeltas is how many of the run's deltas the database holds.
func writtenDeltas(t *testing.T, dsn, runID string) int64 {
	t.Helper()
	var n int64
	if err := rawDB(t, dsn).QueryRow(`SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM stream_batches WHERE run_id = ?`, runID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A tab on B saves the fragment it saw, which A had fanned out and maybe
// not written yet: B asks A to yield the thread, A writes its deltas
// first, and the fragment holds all of them. B's event follows A's last
// delta: no seq is skipped, none is recorded lost.
func TestSharedWriteWaitsForTheHoldersDeltas(t *testing.T) {
	p := streamingOnA(t)
	last := p.lastDelta(t)
	saved, err := p.b.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: p.threadID, MessageID: p.message, LastSeq: last, ExpectedStateVersion: version(t, p.b, p.threadID)})
	if err != nil {
		t.Fatalf("save the fragment seen up to seq %d through B: %v", last, err)
	}
	snap, err := p.b.Snapshot(ctx, user, p.threadID)
	if err != nil {
		t.Fatal(err)
	}
	var fragment string
	for _, m := range snap.Messages {
		if m.MessageID == saved.MessageID {
			fragment = m.Content
		}
	}
	if fragment != "Hello there" {
		t.Fatalf("saved fragment %q, want the three deltas A fanned out", fragment)
	}
	rep, err := p.b.ThreadEvents(ctx, p.threadID, 0)
	if err != nil || !rep.Complete {
		t.Fatalf("replay: %+v, %v", rep, err)
	}
	for i, ev := range rep.Events {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d: the log skips seqs (%v)", i, ev.Seq, rep.Events)
		}
	}
	if a, b := p.a.StreamStats(), p.b.StreamStats(); b.Yields != 1 || b.Unanswered != 0 || b.WrittenPast != 0 || a.DeltasLost != 0 {
		t.Fatalf("A %+v, B %+v: want one yield asked by B, nothing written past or lost", a, b)
	}

	// A yielded: its next deltas are written before they are fanned out
	// (the slow path), without a new reservation B would have to ask for.
	if err := p.a.AppendDeltas(ctx, p.lease, p.message, []string{"!"}); err != nil {
		t.Fatal(err)
	}
	if n := writtenDeltas(t, p.dsn, p.runID); n != 4 {
		t.Fatalf("%d deltas written after the yield, want 4 (the slow path writes before it returns)", n)
	}
	var reserved int64
	var holder string
	if err := rawDB(t, p.dsn).QueryRow(`SELECT seq_reserved, seq_holder FROM threads WHERE thread_id = ?`, p.threadID).Scan(&reserved, &holder); err != nil {
		t.Fatal(err)
	}
	if reserved != 0 || holder != "" {
		t.Fatalf("after the yield the thread is reserved up to %d by %q, want nothing reserved", reserved, holder)
	}
	p.cancelThroughB(t)
	if got := p.b.StreamStats().Yields; got != 1 {
		t.Fatalf("B asked %d times, want still 1: nothing was reserved any more", got)
	}
	mustCheck(t, p.b, "after the cancel")
}

// A cancel through B of a run streaming on A: the cancel's event comes
// right after A's last delta, and A's later batches are refused.
func TestSharedCancelOfAnotherInstancesRun(t *testing.T) {
	p := streamingOnA(t)
	last := p.lastDelta(t)
	ack, status, err := p.b.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: p.runID, Reason: "user_requested", RequestedBy: "tab:b"})
	if err != nil || ack.Status != chat.RunCancelRequested || status != chat.RunRunning {
		t.Fatalf("cancel through B: %+v %s %v", ack, status, err)
	}
	if n := writtenDeltas(t, p.dsn, p.runID); n != 3 {
		t.Fatalf("%d deltas written when B's cancel committed, want the 3 A fanned out", n)
	}
	rep, err := p.b.ThreadEvents(ctx, p.threadID, last)
	if err != nil || len(rep.Events) == 0 || rep.Events[0].Seq != last+1 || rep.Events[0].Type != chat.EventRunCancelRequested {
		t.Fatalf("events after A's last delta %d: %+v, %v; want run.cancel_requested at %d", last, rep.Events, err, last+1)
	}
	var nr *chat.ErrNotRunning
	if err := p.a.AppendDeltas(ctx, p.lease, p.message, []string{"late"}); !errors.As(err, &nr) {
		t.Fatalf("A's batch after the cancel: %v, want ErrNotRunning", err)
	}
	p.finishCancelOnA(t)
	mustCheck(t, p.a, "after the cancel")
}

// A holder that does not answer (stalled, cut off) is written past: its
// whole reservation is recorded lost, B's write goes after it, and A, at
// its next write of the thread, drops the deltas it held — they were
// fanned out and are now a recorded gap. A fragment naming them is
// refused with what is known; the log stays honest (check).
func TestSharedWritePastAHolderThatDoesNotAnswer(t *testing.T) {
	p := streamingOnA(t)
	p.net.mu.Lock()
	p.net.mute[p.holderA] = true
	p.net.mu.Unlock()
	seqs := deltaSeqs(p.recA)
	last := seqs[len(seqs)-1]
	if waited := p.cancelThroughB(t); waited > 5*time.Second {
		t.Fatalf("the cancel waited %v for a mute holder", waited)
	}
	b := p.b.StreamStats()
	if b.Unanswered != 1 || b.WrittenPast != 1 {
		t.Fatalf("B %+v: want one unanswered request and one reservation written past", b)
	}
	var gapFirst, gapLast int64
	if err := rawDB(t, p.dsn).QueryRow(`SELECT first_seq, last_seq FROM stream_gaps WHERE thread_id = ?`, p.threadID).Scan(&gapFirst, &gapLast); err != nil {
		t.Fatalf("no gap recorded: %v", err)
	}
	// A's flusher may have written some before B wrote past (it runs
	// whether A answers or not); none after.
	written := writtenDeltas(t, p.dsn, p.runID)
	if gapFirst != seqs[0]+written || gapLast < last {
		t.Fatalf("gap %d–%d; want it from the first unwritten delta %d past A's last %d", gapFirst, gapLast, seqs[0]+written, last)
	}

	// A finds out at its next write of the thread.
	if err := p.a.FlushStream(ctx); err != nil {
		t.Fatal(err)
	}
	if a := p.a.StreamStats(); a.DeltasLost != 3-written || a.Buffered != 0 {
		t.Fatalf("A %+v: want %d deltas dropped as lost (3 fanned out, %d written before B wrote past)", a, 3-written, written)
	}
	if written < 3 {
		_, err := p.b.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: p.threadID, MessageID: p.message, LastSeq: last, ExpectedStateVersion: version(t, p.b, p.threadID)})
		var ce *chat.Error
		if !errors.As(err, &ce) || ce.Code != chat.CodeFragmentUnavailable {
			t.Fatalf("fragment naming lost seq %d: %v, want fragment_unavailable", last, err)
		}
	}
	// A's replay and snapshot no longer offer what it held.
	rep, err := p.a.ThreadEvents(ctx, p.threadID, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range rep.Events {
		if ev.Type == chat.EventMessageDelta && ev.Seq > gapFirst-1 && ev.Seq <= gapLast {
			t.Fatalf("A replays delta %d inside the recorded gap", ev.Seq)
		}
	}
	p.finishCancelOnA(t)
	mustCheck(t, p.a, "after writing past")
}

// A holder that is gone (no peers at all: one instance without NATS, or
// the process that reserved died) is written past at once.
func TestSharedWritePastWithoutPeers(t *testing.T) {
	p := streamingOnA(t)
	p.b.SetStreamPeers(nil)
	if waited := p.cancelThroughB(t); waited > time.Second/2 {
		t.Fatalf("the cancel waited %v with nobody to ask", waited)
	}
	if b := p.b.StreamStats(); b.WrittenPast != 1 || b.Yields != 0 {
		t.Fatalf("B %+v: want the reservation written past without asking", b)
	}
	p.finishCancelOnA(t)
	mustCheck(t, p.b, "after writing past")
}

// An execution that stalls past its lease (SIGSTOP, a long pause) and
// wakes up after another instance took the run over fans out nothing of
// it: past the part of its lease the fast path trusts, a batch asks the
// database, which refuses it.
func TestSharedStalledExecutionFansOutNothingAfterTakeover(t *testing.T) {
	dsn := postgresDSN(t)
	rec := &feedTap{}
	a, err := store.Open(ctx, dsn, store.Options{StreamBuffer: true, OnCommit: rec.publish})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := store.Open(ctx, dsn, store.Options{StreamBuffer: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, runID := newThreadWithRun(t, b, "hello")
	// A lease of 1 ms: expired (by the database's clock) by the time
	// anything reads it, and past what the fast path trusts at once.
	claim, err := a.Claim(ctx, "gwA.p1", time.Millisecond)
	if err != nil || claim == nil || claim.Run.RunID != runID {
		t.Fatalf("claim on A = %+v, %v", claim, err)
	}
	for i := 0; ; i++ {
		recovered, err := b.Recover(ctx, "gwB.p1", true, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(recovered) > 0 {
			break
		}
		if i == 1000 {
			t.Fatal("B did not recover the run with an expired lease")
		}
		time.Sleep(time.Millisecond) // the database's clock has not passed the 1 ms lease yet
	}
	taken, err := b.Claim(ctx, "gwB.p1", time.Hour)
	if err != nil || taken == nil || taken.Run.RunID != runID {
		t.Fatalf("takeover claim on B = %+v, %v", taken, err)
	}
	var nr *chat.ErrNotRunning
	if err := a.AppendDeltas(ctx, claim.Lease, chat.NewID(chat.PrefixMessage), []string{"stale"}); !errors.As(err, &nr) || !nr.Fenced {
		t.Fatalf("the stalled execution's batch: %v, want refused as fenced", err)
	}
	if got := deltaSeqs(rec); len(got) != 0 {
		t.Fatalf("A fanned out deltas %v of a run B had taken over", got)
	}
}

// A holder that answers but gives nothing back (it no longer knows the
// reservation as its own) is asked once: the same reservation found again
// is written past, not asked about until the write gives up.
func TestSharedWritePastAHolderThatAnswersButKeeps(t *testing.T) {
	p := streamingOnA(t)
	p.net.mu.Lock()
	p.net.confused[p.holderA] = true
	p.net.mu.Unlock()
	p.cancelThroughB(t)
	if b := p.b.StreamStats(); b.Yields != 1 || b.WrittenPast != 1 {
		t.Fatalf("B %+v: want one answered request, then the reservation written past", b)
	}
	p.finishCancelOnA(t)
	mustCheck(t, p.b, "after writing past")
}
