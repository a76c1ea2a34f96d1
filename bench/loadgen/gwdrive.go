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
	return fmt.Sprintf("Explain goroutines, channels and backpressure for the %s benchmark, thread %d, round %d", scenario, thread, i)
}

func terminal(typ string) bool {
	return typ == chat.EventRunCompleted || typ == chat.EventRunFailed || typ == chat.EventRunCancelled
}

// connect makes tabsPer tabs for every thread, starts their goroutines in
// wg under ctx, and waits until every tab is subscribed (at most timeout).
// Tab 0 of each thread sends run notes to its driver; so does every tab
// when notesAll.
func (e *gwEnv) connect(ctx context.Context, threads []*gwThread, tabsPer int, notesAll bool, wg *sync.WaitGroup, timeout time.Duration) error {
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
func (th *gwThread) startRun(ctx context.Context, text string) (string, bool) {
	cctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	ack, err := th.tabs[0].conn.StartRun(cctx, client.StartRunRequest{ThreadID: th.id, ExpectedStateVersion: th.version, UserMessage: text})
	if err != nil {
		th.env.commandFailed(ctx, "run.start", th.id, err)
		return "", false
	}
	th.version = ack.StateVersion
	return ack.RunID, true
}

// cancelRun sends run.cancel from tab k; timing, when not nil, gets when
// it left and when its answer was read.
func (th *gwThread) cancelRun(ctx context.Context, k int, r client.CancelRunRequest, timing *client.CommandTiming) (chat.CancelAck, error) {
	if timing != nil {
		ctx = client.WithCommandTiming(ctx, timing)
	}
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	return th.tabs[k].conn.CancelRun(ctx, r)
}

// runTimeout bounds the wait for one run's end.
func runTimeout(pace time.Duration) time.Duration { return 30*time.Second + 300*pace }

// awaitEnd waits for tab 0's terminal event of runID, cancelling the run
// from tab 0 once stopAt passes. It updates the driver's state_version and
// reports whether the run ended.
func (th *gwThread) awaitEnd(ctx context.Context, runID string, stopAt time.Time, pace time.Duration) bool {
	e := th.env
	stop := time.NewTimer(time.Until(stopAt))
	defer stop.Stop()
	limit := time.NewTimer(runTimeout(pace))
	defer limit.Stop()
	for {
		select {
		case n := <-th.notes:
			if n.tab == 0 && n.runID == runID && terminal(n.typ) {
				th.version = n.stateVersion
				return true
			}
		case <-stop.C:
			_, err := th.cancelRun(ctx, 0, client.CancelRunRequest{RunID: runID, Reason: "bench phase ended"}, nil)
			if err != nil && client.ErrorCode(err) != chat.CodeRunNotActive {
				e.commandFailed(ctx, "run.cancel", runID, err)
				return false
			}
		case <-limit.C:
			e.errs.add("run_timeout", fmt.Sprintf("%s did not end within %s", runID, runTimeout(pace)))
			return false
		case <-ctx.Done():
			return false
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
		runID, ok := th.startRun(ctx, longMessage(th.env.scenario, th.idx, i))
		if !ok || !th.awaitEnd(ctx, runID, stopAt, pace) {
			return
		}
	}
}

// cancelStats is what one cancel driver measured.
type cancelStats struct {
	ack, cancelled samples // µs from sending run.cancel
	sent, missed   int     // cancels sent; runs that completed first
	unsampled      int     // cluster: cancels not sampled (the run's lease owner was unknown)
}

// cancelTotals is what all the cancel drivers of a scenario measured.
type cancelTotals struct {
	ack, done               Dist // cancel → ack, cancel → run.cancelled
	sent, missed, unsampled int  // cancelStats' counts, summed
}

// mergeCancels merges the cancel drivers' samples and sums their counts.
func mergeCancels(stats []cancelStats) cancelTotals {
	var ack, done []*samples
	var t cancelTotals
	for i := range stats {
		ack, done = append(ack, &stats[i].ack), append(done, &stats[i].cancelled)
		t.sent += stats[i].sent
		t.missed += stats[i].missed
		t.unsampled += stats[i].unsampled
	}
	t.ack, t.done = summarize(merged(ack...)), summarize(merged(done...))
	return t
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
func (th *gwThread) awaitNote(ctx context.Context, runID string, tab int, typ string, timeout time.Duration) (note, bool) {
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

// driveCancels repeats, until stopAt: start a run, wait until it streams,
// wait a random moment in [0, maxDelay], cancel it from the tab pick
// chooses, and wait for run.cancelled on that tab and on tab 0. Only
// cancels sent while the environment measures (and that pick samples) are
// sampled.
func (th *gwThread) driveCancels(ctx context.Context, stopAt time.Time, maxDelay, pace time.Duration, rng *rand.Rand, pick cancelTab, st *cancelStats) {
	e := th.env
	for round := range maxRunsPerThread {
		if ctx.Err() != nil || !time.Now().Before(stopAt) {
			return
		}
		runID, ok := th.startRun(ctx, longMessage(e.scenario, th.idx, round))
		if !ok {
			return
		}
		n, ok := th.awaitNote(ctx, runID, 0, noteFirstDelta, runTimeout(pace))
		if !ok {
			if ctx.Err() == nil {
				e.errs.add("run_never_streamed", runID)
			}
			return
		}
		if terminal(n.typ) {
			e.errs.add("run_ended_before_streaming", fmt.Sprintf("%s: %s", runID, n.typ))
			continue
		}
		delay := time.Duration(rng.Int64N(int64(maxDelay) + 1))
		if n, ok := th.awaitNote(ctx, runID, -1, "", delay); ok && terminal(n.typ) {
			st.missed++ // it completed before its cancel moment
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
		var tm client.CommandTiming
		ack, err := th.cancelRun(ctx, k, client.CancelRunRequest{RunID: runID}, &tm)
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
			st.ack.add(tm.Answered.Sub(sent).Microseconds())
		}
		gotK, got0 := false, false
		limit := time.NewTimer(runTimeout(pace))
	wait:
		for !gotK || !got0 {
			select {
			case n := <-th.notes:
				if n.runID != runID || !terminal(n.typ) {
					continue
				}
				if n.typ != chat.EventRunCancelled {
					e.errs.add("accepted_cancel_ended_"+n.typ, runID)
				}
				if n.tab == k && !gotK {
					gotK = true
					if sampled {
						st.cancelled.add(n.at.Sub(sent).Microseconds())
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
