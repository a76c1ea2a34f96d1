package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// commitLog records what OnCommit received: one entry per commit.
type commitLog struct {
	mu      sync.Mutex
	commits [][]*chat.Event
}

func (l *commitLog) add(evs []*chat.Event) {
	l.mu.Lock()
	l.commits = append(l.commits, evs)
	l.mu.Unlock()
}

func openLogged(t *testing.T) (*store.Store, *commitLog) {
	t.Helper()
	log := &commitLog{}
	// Write-through: AppendDeltas is the grouped write these tests queue.
	st, _ := openStoreAs(t, true, store.Options{OnCommit: log.add})
	return st, log
}

// waitUntil polls cond (every millisecond, for at most 10 s) until it
// holds; otherwise it calls release (when not nil: a writer the test
// holds) and fails with what went wrong.
func waitUntil(t testing.TB, cond func() bool, release func(), failure string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			if release != nil {
				release()
			}
			t.Fatal(failure)
		}
		time.Sleep(time.Millisecond) // polling a condition with a deadline
	}
}

// answerWithin waits up to d for a caller's answer on answer and returns
// it; past d it calls release (when not nil: a writer the test holds) and
// fails with what went wrong.
func answerWithin(t testing.TB, answer <-chan error, d time.Duration, release func(), failure string) error {
	t.Helper()
	select {
	case err := <-answer:
		return err
	case <-time.After(d):
		if release != nil {
			release()
		}
		t.Fatal(failure)
		return nil
	}
}

// replayedDeltas is the deltas a thread's replay from the start holds, in
// seq order.
func replayedDeltas(t *testing.T, st *store.Store, threadID string) []*chat.Event {
	t.Helper()
	rep, err := st.Events(ctx, user, threadID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var deltas []*chat.Event
	for _, ev := range rep.Events {
		if ev.Type == chat.EventMessageDelta {
			deltas = append(deltas, ev)
		}
	}
	return deltas
}

// deltasIn counts the deltas a thread's replay from the start holds.
func deltasIn(t *testing.T, st *store.Store, threadID string) int {
	t.Helper()
	return len(replayedDeltas(t, st, threadID))
}

// bufferedText is the text of the deltas a thread's replay from the start
// holds, in seq order.
func bufferedText(t *testing.T, st *store.Store, threadID string) string {
	t.Helper()
	var out strings.Builder
	for _, ev := range replayedDeltas(t, st, threadID) {
		out.WriteString(ev.Body.(chat.MessageDeltaBody).Text)
	}
	return out.String()
}

// startRuns creates n threads, each with a run claimed by worker "w".
func startRuns(t *testing.T, st *store.Store, n int) (runs, threads []string) {
	t.Helper()
	for range n {
		snap, runID := newThreadWithRun(t, st, "go")
		runs, threads = append(runs, runID), append(threads, snap.ThreadID)
	}
	for range n {
		if r, err := st.Claim(ctx, "w", time.Hour); err != nil || r == nil {
			t.Fatalf("claim: %v %v", r, err)
		}
	}
	return runs, threads
}

// Writes queued while the writer is busy share one transaction, and one
// refused request (its run was cancelled) takes nothing of the others with
// it.
func TestGroupCommitSharesOneTransactionAndIsolatesFailures(t *testing.T) {
	st, log := openLogged(t)
	runs, threads := startRuns(t, st, 6)
	// Run 3 is cancelled: its next append must fail alone.
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: runs[3], Reason: "user_requested", RequestedBy: "tab:t"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishCancel(ctx, runs[3], ptr(leaseW(runs[3])), 0); err != nil {
		t.Fatal(err)
	}
	log.mu.Lock()
	before := len(log.commits)
	log.mu.Unlock()

	release := st.HoldWriter()
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, run := range runs {
		wg.Go(func() {
			errs[i] = st.AppendDeltas(ctx, leaseW(run), fmt.Sprintf("msg_group%d", i), []string{"a", "b", "c"})
		})
	}
	waitUntil(t, func() bool { return st.QueuedWrites() >= len(runs) }, release, fmt.Sprintf("the %d writes never all queued", len(runs)))
	release()
	wg.Wait()

	for i, err := range errs {
		var nr *chat.ErrNotRunning
		if i == 3 {
			if !errors.As(err, &nr) {
				t.Errorf("append to the cancelled run: %v, want ErrNotRunning", err)
			}
		} else if err != nil {
			t.Errorf("append %d: %v", i, err)
		}
	}
	log.mu.Lock()
	commits := log.commits[before:]
	log.mu.Unlock()
	if len(commits) != 1 || len(commits[0]) != 5*3 {
		t.Fatalf("%d commits after the writer was free (events: %v), want one with 15 deltas", len(commits), len(commits))
	}
	for i, th := range threads {
		want := "abc"
		if i == 3 {
			want = ""
		}
		if got := bufferedText(t, st, th); got != want {
			t.Errorf("thread %d buffered %q, want %q", i, got, want)
		}
	}
}

// Many runs appending at once, some cancelled along the way: each run's
// buffer is exactly the batches acknowledged to it, every thread's seqs
// reach subscribers in order without gaps, and the invariants hold.
func TestGroupCommitUnderConcurrency(t *testing.T) {
	st, log := openLogged(t)
	runs, threads := startRuns(t, st, 24)
	const batches = 30
	acked := make([]strings.Builder, len(runs))
	var wg sync.WaitGroup
	for i, run := range runs {
		wg.Go(func() {
			for b := range batches {
				if i%6 == 0 && b == batches/2 {
					if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: run, Reason: "user_requested", RequestedBy: "tab:t"}); err != nil {
						t.Error(err)
						return
					}
					if _, err := st.FinishCancel(ctx, run, ptr(leaseW(run)), 0); err != nil {
						t.Error(err)
						return
					}
				}
				parts := []string{fmt.Sprintf("<%d.%d ", i, b), "x", "> "}
				err := st.AppendDeltas(ctx, leaseW(run), fmt.Sprintf("msg_conc%d", i), parts)
				var nr *chat.ErrNotRunning
				switch {
				case err == nil:
					acked[i].WriteString(strings.Join(parts, ""))
				case errors.As(err, &nr) && i%6 == 0 && b >= batches/2:
				default:
					t.Errorf("run %d batch %d: %v", i, b, err)
					return
				}
			}
		})
	}
	wg.Wait()

	last := map[string]int64{}
	log.mu.Lock()
	ncommits := len(log.commits)
	for _, evs := range log.commits {
		for _, ev := range evs {
			if prev, ok := last[ev.ThreadID]; ok && ev.Seq != prev+1 {
				t.Errorf("thread %s: seq %d after %d", ev.ThreadID, ev.Seq, prev)
			}
			last[ev.ThreadID] = ev.Seq
		}
	}
	log.mu.Unlock()
	for i, th := range threads {
		if got := bufferedText(t, st, th); got != acked[i].String() {
			t.Errorf("run %d buffered %q, acknowledged %q", i, got, acked[i].String())
		}
	}
	t.Logf("%d appends in %d commits", len(runs)*batches, ncommits)
}

// A cancel queued behind a full queue of stream writes is committed in the
// first transaction after the writer frees up, alone, not after the queue.
func TestUrgentCancelGoesFirst(t *testing.T) {
	st, log := openLogged(t)
	runs, _ := startRuns(t, st, 41)
	log.mu.Lock()
	before := len(log.commits)
	log.mu.Unlock()
	release := st.HoldWriter()
	var wg sync.WaitGroup
	for i, run := range runs[1:] {
		wg.Go(func() {
			if err := st.AppendDeltas(ctx, leaseW(run), fmt.Sprintf("msg_u%d", i), []string{"x"}); err != nil {
				t.Error(err)
			}
		})
	}
	waitQueued := func(cond func() bool, what string) {
		waitUntil(t, cond, release, fmt.Sprintf("%s never queued", what))
	}
	waitQueued(func() bool { return st.QueuedWrites() == 40 }, "40 stream writes")
	wg.Go(func() {
		if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: runs[0], Reason: "user_requested", RequestedBy: "tab:t"}); err != nil {
			t.Error(err)
		}
	})
	waitQueued(func() bool { return st.UrgentWrites() == 1 }, "the cancel")
	release()
	wg.Wait()
	log.mu.Lock()
	defer log.mu.Unlock()
	// The cancel commits alone: its answer never waits for the stream
	// writes queued before it to be written too.
	first := log.commits[before]
	if len(first) != 1 || first[0].Type != chat.EventRunCancelRequested {
		var types []string
		for _, ev := range first {
			types = append(types, ev.Type)
		}
		t.Fatalf("the first commit after the writer freed up holds %v, want run.cancel_requested alone", types)
	}
	deltas := 0
	for _, evs := range log.commits[before:] {
		for _, ev := range evs {
			if ev.Type == chat.EventMessageDelta {
				deltas++
			}
		}
	}
	if deltas != 40 {
		t.Fatalf("%d deltas committed, want 40", deltas)
	}
}

// holdBehindPlainWrites holds the writer with n thread creations (plain
// writes, each a transaction of its own; run starts are group commits)
// waiting for it, and returns the commits logged so far, the writer's
// release, a bounded wait that releases the writer when it fails, and the
// group the creations run in (the caller adds its own writers to it, then
// releases and waits).
func holdBehindPlainWrites(t *testing.T, st *store.Store, log *commitLog, n int) (before int, release func(), waitFor func(cond func() bool, what string), wg *sync.WaitGroup) {
	t.Helper()
	log.mu.Lock()
	before = len(log.commits)
	log.mu.Unlock()
	release = st.HoldWriter()
	waitFor = func(cond func() bool, what string) {
		waitUntil(t, cond, release, fmt.Sprintf("%s never waited", what))
	}
	wg = &sync.WaitGroup{}
	for range n {
		wg.Go(func() {
			if _, err := st.CreateThread(ctx, user, "other"); err != nil {
				t.Error(err)
			}
		})
	}
	waitFor(func() bool { return st.PlainWritesWaiting() == n }, "the thread creations")
	return before, release, waitFor, wg
}

// A cancel also goes before plain writes (claims, publishes, new threads …)
// that waited for the writer longer than it: it waits for the transaction
// in progress only.
func TestUrgentCancelPassesPlainWrites(t *testing.T) {
	st, log := openLogged(t)
	runs, threads := startRuns(t, st, 1)
	const others = 8
	before, release, waitFor, wg := holdBehindPlainWrites(t, st, log, others)
	wg.Go(func() {
		if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: runs[0], Reason: "user_requested", RequestedBy: "tab:t"}); err != nil {
			t.Error(err)
		}
	})
	waitFor(func() bool { return st.UrgentWrites() == 1 && st.GroupCommitsWaiting() == 1 }, "the cancel")
	release()
	wg.Wait()
	log.mu.Lock()
	defer log.mu.Unlock()
	if got := len(log.commits) - before; got != 1+others {
		t.Fatalf("%d commits after the writer freed up, want %d", got, 1+others)
	}
	if first := log.commits[before]; first[0].Type != chat.EventRunCancelRequested || first[0].ThreadID != threads[0] {
		t.Fatalf("the first commit after the writer freed up is %s on %s, want the cancel", first[0].Type, first[0].ThreadID)
	}
}

// A burst of cancels is committed before the plain writes that wait for
// the writer, all of it: the writer is not handed to a plain write between
// two cancels (on PostgreSQL each cancel is a transaction of its own).
func TestCancelBurstGoesBeforePlainWrites(t *testing.T) {
	st, log := openLogged(t)
	runs, _ := startRuns(t, st, 3)
	before, release, waitFor, wg := holdBehindPlainWrites(t, st, log, 6)
	for _, run := range runs {
		wg.Go(func() {
			if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: run, Reason: "user_requested", RequestedBy: "tab:t"}); err != nil {
				t.Error(err)
			}
		})
	}
	waitFor(func() bool { return st.UrgentWrites() == len(runs) && st.GroupCommitsWaiting() == 1 }, "the cancels")
	release()
	wg.Wait()
	log.mu.Lock()
	defer log.mu.Unlock()
	var order []string
	for _, evs := range log.commits[before:] {
		for _, ev := range evs {
			order = append(order, ev.Type)
		}
	}
	for i, typ := range order {
		if (i < len(runs)) != (typ == chat.EventRunCancelRequested) {
			t.Fatalf("events in commit order after the writer freed up: %v; want the %d cancels first", order, len(runs))
		}
	}
}

// A grouped write that fails after writing spoils its transaction: it is
// rolled back whole and the other writes are committed without it.
func TestGroupedFailureAfterWritingRetriesTheOthers(t *testing.T) {
	st, _ := openLogged(t)
	runs, threads := startRuns(t, st, 6)
	release := st.HoldWriter()
	var wg sync.WaitGroup
	errs := make([]error, len(runs))
	for i, run := range runs {
		wg.Go(func() { errs[i] = st.AppendDeltas(ctx, leaseW(run), fmt.Sprintf("msg_f%d", i), []string{"ok"}) })
	}
	var failed error
	wg.Go(func() { failed = st.GroupedWriteThatFails(ctx, "ghost") })
	waitUntil(t, func() bool { return st.QueuedWrites() >= len(runs)+1 }, release, "writes never queued")
	release()
	wg.Wait()
	if failed == nil || failed.Error() != "failed after writing" {
		t.Fatalf("the failing write answered %v", failed)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("append %d: %v", i, err)
		}
	}
	if _, _, err := st.Accounts().UserByName(ctx, "ghost"); chat.ErrorCode(err) != chat.CodeNotFound {
		t.Fatalf("the failed write's row survived: %v", err)
	}
	for _, th := range threads {
		n := deltasIn(t, st, th)
		if n != 1 {
			t.Errorf("thread %s holds %d deltas, want 1", th, n)
		}
	}
}

// A stream write whose caller gives up (its run was cancelled) while it
// waits for the writer is taken back: the caller returns at once, and the
// batch is never written, so it counts as unbuffered, not as both.
func TestQueuedWriteIsWithdrawnWhenItsCallerStops(t *testing.T) {
	st, _ := openLogged(t)
	runs, threads := startRuns(t, st, 3)
	release := st.HoldWriter()
	var wg sync.WaitGroup
	// The first caller leads (it waits for the writer); the second waits
	// in the queue behind it and is cancelled there; the third stays.
	var errLead, errKept error
	wg.Go(func() { errLead = st.AppendDeltas(ctx, leaseW(runs[0]), "msg_w0", []string{"lead"}) })
	waitUntil(t, func() bool { return st.GroupCommitsWaiting() == 1 }, release, "the leader never waited for the writer")
	stopped, stop := context.WithCancel(ctx)
	withdrawn := make(chan error, 1)
	go func() { withdrawn <- st.AppendDeltas(stopped, leaseW(runs[1]), "msg_w1", []string{"gone"}) }()
	wg.Go(func() { errKept = st.AppendDeltas(ctx, leaseW(runs[2]), "msg_w2", []string{"kept"}) })
	waitUntil(t, func() bool { return st.QueuedWrites() == 3 }, release, "the writes never queued")
	stop()
	if err := answerWithin(t, withdrawn, 10*time.Second, release, "a cancelled caller still waited for the writer"); !errors.Is(err, context.Canceled) {
		t.Errorf("the withdrawn write answered %v, want context.Canceled", err)
	}
	if n := st.QueuedWrites(); n != 2 {
		t.Errorf("%d writes queued after the withdrawal, want 2", n)
	}
	release()
	wg.Wait()
	if errLead != nil || errKept != nil {
		t.Fatalf("the other writes answered %v, %v", errLead, errKept)
	}
	for i, th := range threads {
		n := deltasIn(t, st, th)
		if want := map[int]int{0: 1, 1: 0, 2: 1}[i]; n != want {
			t.Errorf("thread %d holds %d deltas, want %d", i, n, want)
		}
	}
}

// A caller that stops waiting while its request is in a batch waits for
// the outcome; if the batch is cut short, its request put back and handed
// the lead, the caller leads (skipping its own request): the lead is never
// lost. (It was: every later write then waited forever.)
func TestStoppedCallerPutBackTakesUpTheLead(t *testing.T) {
	st, _ := openLogged(t)
	runs, threads := startRuns(t, st, 2)
	st.PretendLeading()
	stopped, stop := context.WithCancel(ctx)
	answer := make(chan error, 1)
	go func() { answer <- st.AppendDeltas(stopped, leaseW(runs[0]), "msg_late", []string{"never"}) }()
	waitUntil(t, func() bool { return st.QueuedWrites() == 1 }, nil, "the write never queued")
	handBack := st.TakeQueued()
	stop()
	waitUntil(t, func() bool { return st.LateWithdrawals() == 1 }, nil, "the stopped caller never noticed its request was taken")
	handBack()
	if err := answerWithin(t, answer, 10*time.Second, nil, "the stopped caller never answered: the lead it was handed is lost"); !errors.Is(err, context.Canceled) {
		t.Fatalf("the stopped caller answered %v, want context.Canceled", err)
	}
	done := make(chan error, 1)
	go func() { done <- st.AppendDeltas(ctx, leaseW(runs[1]), "msg_next", []string{"next"}) }()
	if err := answerWithin(t, done, 10*time.Second, nil, "a later write never committed: nobody leads the queue"); err != nil {
		t.Fatal(err)
	}
	for i, th := range threads {
		n := deltasIn(t, st, th)
		if n != i { // thread 0: the stopped write, never run; thread 1: the later one
			t.Errorf("thread %d holds %d deltas, want %d", i, n, i)
		}
	}
}

// Runs started at once share commits on SQLite: eight starts queued
// behind a held writer are committed together, not in eight transactions
// ahead of their claims (on PostgreSQL each is a transaction of its own,
// see StartRun). Two of them start on the same thread at the same
// version: one run starts, the other is refused as a start that thread's
// tab would see refused alone (a conflict, with nothing of it written),
// and the batch's other starts are not undone.
func TestRunStartsShareCommits(t *testing.T) {
	st, log := openLogged(t)
	var threads []chat.Snapshot
	for range 7 {
		threads = append(threads, newThread(t, st))
	}
	log.mu.Lock()
	before := len(log.commits)
	log.mu.Unlock()
	release := st.HoldWriter()
	var wg sync.WaitGroup
	errs := make([]error, len(threads)+1)
	acks := make([]chat.RunStartAck, len(threads)+1)
	for i := range errs {
		th := threads[i%len(threads)] // the last start: the first thread again
		wg.Go(func() {
			acks[i], errs[i] = st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: th.ThreadID, ExpectedStateVersion: th.StateVersion, UserMessage: text(fmt.Sprint("go ", i))})
		})
	}
	waiting, wantCommits := st.QueuedWrites, 1
	if onPostgres() {
		waiting, wantCommits = st.PlainWritesWaiting, len(threads)
	}
	waitUntil(t, func() bool { return waiting() == len(errs) }, release, "the run starts never waited together")
	release()
	wg.Wait()
	started, refused := 0, 0
	for i, err := range errs {
		switch {
		case err == nil:
			started++
		case code(err) == chat.CodeStateVersionConflict || code(err) == chat.CodeRunAlreadyActive:
			refused++
			if th := threads[i%len(threads)]; th.ThreadID != threads[0].ThreadID {
				t.Errorf("start %d on its own thread refused: %v", i, err)
			}
		default:
			t.Errorf("start %d: %v", i, err)
		}
	}
	if started != len(threads) || refused != 1 {
		t.Fatalf("%d started, %d refused; want %d started and the second start of one thread refused", started, refused, len(threads))
	}
	log.mu.Lock()
	commits := len(log.commits) - before
	startedEvents := 0
	for _, evs := range log.commits[before:] {
		for _, ev := range evs {
			if ev.Type == chat.EventRunStarted {
				startedEvents++
			}
		}
	}
	log.mu.Unlock()
	if commits != wantCommits || startedEvents != len(threads) {
		t.Fatalf("%d run.started in %d commits; want all %d in %d", startedEvents, commits, len(threads), wantCommits)
	}
	for _, th := range threads {
		snap, err := st.Snapshot(ctx, user, th.ThreadID)
		if err != nil {
			t.Fatal(err)
		}
		if snap.ActiveRun == nil || len(snap.Messages) != 1 {
			t.Fatalf("thread %s after the batch: active run %+v, %d messages; want one run and its request", th.ThreadID, snap.ActiveRun, len(snap.Messages))
		}
	}
}
