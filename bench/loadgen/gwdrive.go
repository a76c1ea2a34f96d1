package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// maxRunsPerThread bounds the runs one driver starts.
const maxRunsPerThread = 100_000

// longMessage makes the demo model answer with at least 80 words (a
// message without the word "short").
func longMessage(scenario string, thread, i int) string {
	return fmt.Sprintf(
		"Explain goroutines, channels and backpressure for the %s benchmark, thread %d, round %d",
		scenario, thread, i,
	)
}

func terminal(typ string) bool {
	return typ == chat.EventRunCompleted || typ == chat.EventRunFailed || typ == chat.EventRunCancelled
}

// connect makes tabsPer tabs for every thread, starts their goroutines in
// wg under ctx, and waits until every tab is subscribed (at most timeout).
// Tab 0 of each thread sends run notes to its driver; so does every tab
// when notesAll.
func (e *gwEnv) connect(
	ctx context.Context,
	threads []*gwThread,
	tabsPer int,
	notesAll bool,
	wg *sync.WaitGroup,
	timeout time.Duration,
) error {
	var all []*gwTab
	for _, th := range threads {
		for k := range tabsPer {
			t := newGWTab(th, k)
			t.notes = k == 0 || notesAll
			th.tabs = append(th.tabs, t)
			all = append(all, t)
		}
	}
	for _, t := range all {
		wg.Go(func() { t.run(ctx) })
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for i, t := range all {
		select {
		case <-t.ready:
		case <-deadline.C:
			return fmt.Errorf("only %d of %d tabs subscribed within %s", i, len(all), timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// startRun starts a run from tab 0 with the driver's known state_version.
// A run whose ack carries a queue_position waits for a slot: it is
// recorded in th.queued before startRun returns.
func (th *gwThread) startRun(ctx context.Context, text string) (started, bool) {
	var tm client.CommandTiming
	cctx, cancel := context.WithTimeout(client.WithCommandTiming(ctx, &tm), commandTimeout)
	defer cancel()
	ack, err := th.tabs[0].conn.StartRun(
		cctx,
		client.StartRunRequest{ThreadID: th.id, ExpectedStateVersion: th.version, UserMessage: text},
	)
	if err != nil {
		th.env.commandFailed(ctx, "run.start", th.id, err)
		return started{}, false
	}
	th.version = ack.StateVersion
	s := started{runID: ack.RunID, position: ack.QueuePosition, acked: tm.Answered, sampled: th.env.measuring.Load()}
	if s.acked.IsZero() {
		s.acked = time.Now()
	}
	if s.queued() {
		th.queued.Store(s.runID, s.position)
	}
	return s, true
}

// startLimit bounds the wait for a run's first delta: runTimeout, and for
// a queued run also the environment's queueAllowance (it may wait for a
// slot that long without counting as an error).
func (th *gwThread) startLimit(s started, pace time.Duration) time.Duration {
	if s.queued() {
		return runTimeout(pace) + th.env.queueAllowance
	}
	return runTimeout(pace)
}

// neverStarted records that run s had no delta within startLimit: an
// admitted run the server said it started (run_never_streamed), or a
// queued run that waited longer than allowed (queued_run_never_started).
func (th *gwThread) neverStarted(s started, pace time.Duration) {
	kind := "run_never_streamed"
	if s.queued() {
		kind = "queued_run_never_started"
	}
	th.env.errs.add(
		kind,
		fmt.Sprintf(
			"%s: no delta within %s of its ack (queue_position %d)",
			s.runID, th.startLimit(s, pace), s.position,
		),
	)
}

// cancelRun sends run.cancel from tab k; timing, when not nil, gets when
// it left and when its answer was read.
func (th *gwThread) cancelRun(
	ctx context.Context,
	k int,
	r client.CancelRunRequest,
	timing *client.CommandTiming,
) (chat.CancelAck, error) {
	if timing != nil {
		ctx = client.WithCommandTiming(ctx, timing)
	}
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	return th.tabs[k].conn.CancelRun(ctx, r)
}

// runTimeout bounds the wait for one run's end.
func runTimeout(pace time.Duration) time.Duration { return 30*time.Second + 300*pace }

// awaitEnd waits for tab 0's terminal event of run s, cancelling the run
// from tab 0 once stopAt passes. A run must stream within startLimit of
// its ack and end within runTimeout of its first delta. It updates the
// driver's state_version and admission figures and returns tab 0's
// terminal note of the run, and whether the run ended.
func (th *gwThread) awaitEnd(ctx context.Context, s started, stopAt time.Time, pace time.Duration) (note, bool) {
	e, runID := th.env, s.runID
	stop := time.NewTimer(time.Until(stopAt))
	defer stop.Stop()
	limit := time.NewTimer(th.startLimit(s, pace))
	defer limit.Stop()
	var first time.Time
	for {
		select {
		case n := <-th.notes:
			if n.tab != 0 || n.runID != runID {
				continue
			}
			if n.typ == noteFirstDelta && first.IsZero() {
				first = n.at
				limit.Reset(runTimeout(pace))
			}
			if terminal(n.typ) {
				th.version = n.stateVersion
				th.adm.counted(s, first)
				return n, true
			}
		case <-stop.C:
			_, err := th.cancelRun(ctx, 0, client.CancelRunRequest{RunID: runID, Reason: "bench phase ended"}, nil)
			if err != nil && client.ErrorCode(err) != chat.CodeRunNotActive {
				e.commandFailed(ctx, "run.cancel", runID, err)
				return note{}, false
			}
		case <-limit.C:
			if first.IsZero() {
				th.neverStarted(s, pace)
			} else {
				e.errs.add("run_timeout", fmt.Sprintf("%s did not end within %s of its first "+
					"delta", runID, runTimeout(pace)))
			}
			return note{}, false
		case <-ctx.Done():
			return note{}, false
		}
	}
}

// driveContinuous keeps one run streaming on the thread until stopAt:
// each run that ends is followed by the next; the one active at stopAt is
// cancelled and waited for.
func (th *gwThread) driveContinuous(ctx context.Context, stopAt time.Time, pace time.Duration) {
	for i := range maxRunsPerThread {
		if ctx.Err() != nil || !time.Now().Before(stopAt) {
			return
		}
		s, ok := th.startRun(ctx, longMessage(th.env.scenario, th.idx, i))
		if !ok {
			return
		}
		if _, ended := th.awaitEnd(ctx, s, stopAt, pace); !ended {
			return
		}
	}
}

// cancelStats is what one cancel driver measured.
type cancelStats struct {
	ack, cancelled samples // µs from sending run.cancel
	probe          samples // µs, hello round trips on another tab sent with sampled cancels (probe)
	sent, missed   int     // cancels sent; runs that completed first
	unsampled      int     // cluster: cancels not sampled (the run's lease owner was unknown)
	// the same samples split by where the cancel found its run
	// (cancelStreaming, cancelWaiting: see cancelWhen)
	byWhen [2]struct{ ack, cancelled samples }
}

// cancelTotals is what all the cancel drivers of a scenario measured.
type cancelTotals struct {
	ack, done               Dist // cancel → ack, cancel → run.cancelled
	probe                   Dist // hello round trips beside the cancels
	sent, missed, unsampled int  // cancelStats' counts, summed
	byWhen                  [2]struct{ ack, done Dist }
}

// mergeCancels merges the cancel drivers' samples and sums their counts.
func mergeCancels(stats []cancelStats) cancelTotals {
	var ack, done, probe []*samples
	var byWhen [2]struct{ ack, done []*samples }
	var t cancelTotals
	for i := range stats {
		ack, done = append(ack, &stats[i].ack), append(done, &stats[i].cancelled)
		probe = append(probe, &stats[i].probe)
		for w := range byWhen {
			byWhen[w].ack = append(byWhen[w].ack, &stats[i].byWhen[w].ack)
			byWhen[w].done = append(byWhen[w].done, &stats[i].byWhen[w].cancelled)
		}
		t.sent += stats[i].sent
		t.missed += stats[i].missed
		t.unsampled += stats[i].unsampled
	}
	t.ack, t.done, t.probe = summarize(merged(ack...)), summarize(merged(done...)), summarize(merged(probe...))
	for w := range byWhen {
		t.byWhen[w].ack, t.byWhen[w].done = summarize(merged(byWhen[w].ack...)), summarize(merged(byWhen[w].done...))
	}
	return t
}

// probe sends, when sample is set and the thread has another tab than k,
// hello on that tab at once, and records its round trip in st.probe: the
// floor under the cancel sent from tab k at the same moment (the same
// connections' network, both processes' scheduling and the gateway's
// command path, without the database). The channel closes when it is done;
// the caller waits for it before touching st again.
func (th *gwThread) probe(ctx context.Context, k int, sample bool, st *cancelStats) <-chan struct{} {
	done := make(chan struct{})
	if !sample || len(th.tabs) < 2 {
		close(done)
		return done
	}
	tab := th.tabs[(k+1)%len(th.tabs)]
	go func() {
		defer close(done)
		var tm client.CommandTiming
		if err := tab.conn.Hello(client.WithCommandTiming(ctx, &tm)); err != nil {
			if ctx.Err() == nil {
				th.env.commandFailed(ctx, "hello", "", err)
			}
			return
		}
		st.probe.add(tm.Answered.Sub(tm.Sent).Microseconds())
	}()
	return done
}

// cancelTab chooses the tab (index into the thread's tabs) that cancels
// runID, just before the cancel is sent; sample = false leaves that cancel
// out of the figures.
type cancelTab func(ctx context.Context, runID string) (k int, sample bool)

// anyTab cancels from a random tab of the thread.
func anyTab(th *gwThread, rng *rand.Rand) cancelTab {
	return func(context.Context, string) (int, bool) { return rng.IntN(len(th.tabs)), true }
}

// awaitNote waits for a note of typ about runID from tab, up to timeout,
// keeping track of the driver's state_version from tab 0's terminal
// events. It returns the note, or the terminal note of the run if the run
// ended first.
func (th *gwThread) awaitNote(
	ctx context.Context,
	runID string,
	tab int,
	typ string,
	timeout time.Duration,
) (note, bool) {
	limit := time.NewTimer(timeout)
	defer limit.Stop()
	for {
		select {
		case n := <-th.notes:
			if n.runID != runID {
				continue
			}
			if n.tab == 0 && terminal(n.typ) {
				th.version = n.stateVersion
			}
			if (n.tab == tab && n.typ == typ) || (n.tab == 0 && terminal(n.typ)) {
				return n, true
			}
		case <-limit.C:
			return note{}, false
		case <-ctx.Done():
			return note{}, false
		}
	}
}

// watch reads the thread's notes about runID for d (or until ctx ends),
// noting in *first when tab 0 received the run's first delta (if it had
// not yet), and stops early at tab 0's terminal event of the run, which
// it returns (ended true; the driver's state_version follows it). Notes
// already waiting when d passes are read too, so *first is what tab 0 had
// told the driver by then.
func (th *gwThread) watch(ctx context.Context, runID string, d time.Duration, first *time.Time) (end note, ended bool) {
	limit := time.NewTimer(d)
	defer limit.Stop()
	apply := func(n note) bool {
		if n.tab != 0 || n.runID != runID {
			return false
		}
		if n.typ == noteFirstDelta && first.IsZero() {
			*first = n.at
		}
		if terminal(n.typ) {
			th.version = n.stateVersion
			return true
		}
		return false
	}
	for {
		select {
		case n := <-th.notes:
			if apply(n) {
				return n, true
			}
		case <-limit.C:
			for {
				select {
				case n := <-th.notes:
					if apply(n) {
						return n, true
					}
				default:
					return note{}, false
				}
			}
		case <-ctx.Done():
			return note{}, false
		}
	}
}

// driveCancels repeats, until stopAt: start a run, wait until it streams,
// wait a random moment in [0, maxDelay], cancel it from the tab pick
// chooses, and wait for run.cancelled on that tab and on tab 0. A run
// whose ack said it is queued (waits for a slot) is, every other time at
// random, instead cancelled at a random moment in [0, maxDelay] after its
// ack, which may find it still waiting; a cancel counts as "waiting" when
// the run was queued and tab 0 had seen none of its deltas when the
// cancel left, else as "streaming". Only cancels sent while the
// environment measures (and that pick samples) are sampled.
func (th *gwThread) driveCancels(
	ctx context.Context,
	stopAt time.Time,
	maxDelay, pace time.Duration,
	rng *rand.Rand,
	pick cancelTab,
	st *cancelStats,
) {
	e := th.env
	for round := range maxRunsPerThread {
		if ctx.Err() != nil || !time.Now().Before(stopAt) {
			return
		}
		s, ok := th.startRun(ctx, longMessage(e.scenario, th.idx, round))
		if !ok {
			return
		}
		runID := s.runID
		var first time.Time
		if fromAck := s.queued() && rng.IntN(2) == 0; !fromAck {
			n, ok := th.awaitNote(ctx, runID, 0, noteFirstDelta, th.startLimit(s, pace))
			if !ok {
				if ctx.Err() == nil {
					th.neverStarted(s, pace)
				}
				return
			}
			if terminal(n.typ) {
				e.errs.add("run_ended_before_streaming", fmt.Sprintf("%s: %s", runID, n.typ))
				th.adm.counted(s, first)
				continue
			}
			first = n.at
		}
		delay := time.Duration(rng.Int64N(int64(maxDelay) + 1))
		if n, ended := th.watch(ctx, runID, delay, &first); ended {
			if first.IsZero() {
				e.errs.add("run_ended_before_streaming", fmt.Sprintf("%s: %s", runID, n.typ))
			} else {
				st.missed++ // it completed before its cancel moment
			}
			th.adm.counted(s, first)
			continue
		}
		if ctx.Err() != nil {
			return
		}
		k, sample := pick(ctx, runID)
		if ctx.Err() != nil {
			return
		}
		if !sample {
			st.unsampled++
		}
		sampled := e.measuring.Load() && sample
		when := cancelWhen(s.queued(), !first.IsZero())
		probed := th.probe(ctx, k, sampled, st)
		var tm client.CommandTiming
		ack, err := th.cancelRun(ctx, k, client.CancelRunRequest{RunID: runID}, &tm)
		<-probed
		st.sent++
		var refused *client.Error
		switch {
		case errors.As(err, &refused):
			if refused.Code == chat.CodeRunNotActive {
				st.missed++
			} else {
				e.commandFailed(ctx, "run.cancel", runID, err)
			}
			if _, ok := th.awaitNote(ctx, runID, 0, chat.EventRunCompleted, runTimeout(pace)); !ok {
				return
			}
			th.adm.counted(s, first)
			continue
		case err != nil:
			e.commandFailed(ctx, "run.cancel", runID, err)
			return
		}
		if ack.AlreadyRequested {
			e.errs.add("cancel_already_requested", runID)
		}
		sent := tm.Sent
		if sampled {
			us := tm.Answered.Sub(sent).Microseconds()
			st.ack.add(us)
			st.byWhen[when].ack.add(us)
		}
		gotK, got0 := false, false
		limit := time.NewTimer(runTimeout(pace))
	wait:
		for !gotK || !got0 {
			select {
			case n := <-th.notes:
				if n.runID != runID {
					continue
				}
				if n.tab == 0 && n.typ == noteFirstDelta && first.IsZero() {
					first = n.at // it started before the cancel took hold
				}
				if !terminal(n.typ) {
					continue
				}
				if n.typ != chat.EventRunCancelled {
					e.errs.add("accepted_cancel_ended_"+n.typ, runID)
				}
				if n.tab == k && !gotK {
					gotK = true
					if sampled {
						us := n.at.Sub(sent).Microseconds()
						st.cancelled.add(us)
						st.byWhen[when].cancelled.add(us)
					}
				}
				if n.tab == 0 {
					got0 = true
					th.version = n.stateVersion
				}
			case <-limit.C:
				e.errs.add("run_cancelled_missing", fmt.Sprintf("%s: tab %d got it %v, tab 0 %v", runID, k, gotK, got0))
				break wait
			case <-ctx.Done():
				break wait
			}
		}
		limit.Stop()
		if !got0 {
			return
		}
		th.adm.counted(s, first)
	}
}

// verifyEnd checks that every tab received every event of its thread: it
// reads each thread's last seq from the server and waits (at most
// timeout) for every tab to reach it; tabs that do not are errors.
func (e *gwEnv) verifyEnd(ctx context.Context, threads []*gwThread, timeout time.Duration) {
	final := make([]int64, len(threads))
	for i, th := range threads {
		s, err := e.lastSeq(ctx, th)
		if err != nil {
			e.errs.add("http", err.Error())
			return
		}
		final[i] = s
	}
	deadline := time.Now().Add(timeout)
	for range 100_000 {
		behind := 0
		for i, th := range threads {
			for _, t := range th.tabs {
				if t.lastSeqA.Load() < final[i] {
					behind++
				}
			}
		}
		if behind == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, th := range threads {
		for _, t := range th.tabs {
			if s := t.lastSeqA.Load(); s < final[i] {
				e.errs.add("missing_events_at_end", fmt.Sprintf("tab %s at seq %d, thread at %d", t.tabID, s, final[i]))
			}
		}
	}
}
