// TestInterleavings, its seeds, and the invariants it checks after each
// seed. The doubles, a seed's state and the scenario it plays are in
// interleave_doubles_test.go, interleave_seed_test.go and
// interleave_scenario_test.go.

package engine_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/tools"
)

// Randomized interleavings of one run's events: a seed decides the
// scenario (chunks, tool, dead-worker prefix, a cancel injected at a store
// boundary) and, at every point where the engine is parked (the model
// waits for its next chunk, a tool waits to finish, the run waits for a
// decision), which event comes next: a delta, a cancel, a confirm or
// reject, the tool's completion, a lost provider answer, a reconnect, a
// crash. Each seed replays exactly:
//
//	go test ./engine -run TestInterleavings -interleave.seed=N -v
var (
	interleaveSeed  = flag.Int64("interleave.seed", -1, "TestInterleavings: replay this one seed")
	interleaveSeeds = flag.Int("interleave.seeds", 0, "TestInterleavings: how many seeds to explore (0: the default)")
)

// defaultInterleaveSeeds fits the CI budget (about 20 s with -race on two
// cores); -interleave.seeds raises it for a long run.
const defaultInterleaveSeeds = 800

const (
	ilUser  = chat.LocalUserID
	ilWaitT = 10 * time.Second // bound on every wait
)

// ---------------------------------------------------------------------------
// Invariants.

func isResultPhase(p string) bool {
	switch p {
	case chat.PhaseCompleted, chat.PhaseCommitted, chat.PhaseReconciled, chat.PhaseRejected, chat.PhaseFailed:
		return true
	}
	return false
}

// collect reads sub until it delivered every event up to last.
func collect(sub *bus.Subscription, after, last int64) ([]*chat.Event, error) {
	var out []*chat.Event
	deadline := time.After(ilWaitT)
	for after < last {
		select {
		case ev, ok := <-sub.Events():
			if !ok {
				return out, fmt.Errorf("subscription ended: %v", sub.Err())
			}
			if ev.Seq > after {
				out = append(out, ev)
				after = ev.Seq
			}
		case <-deadline:
			return out, fmt.Errorf("timed out at seq %d of %d", after, last)
		}
	}
	return out, nil
}

func (r *ilRun) verify() {
	ctx := context.Background()
	h := r.h
	snap := h.snapshot(r.thread)
	evs, err := collect(r.sub, r.lastSeq, snap.LastSeq)
	for _, ev := range evs {
		r.observe(ev)
	}
	if err != nil {
		r.fail("primary stream: %v", err)
		return
	}
	run := h.run(r.runID)
	r.stats.ended[run.Status]++
	accepted := r.cancelAccepted()
	r.cmu.Lock()
	cancel := r.cancel
	r.cmu.Unlock()

	// The live stream: gapless, nothing of the run after run.cancelled,
	// nothing but the tool's own outcome after run.cancel_requested.
	prev := r.baseSeq
	cancelReq, cancelled := -1, -1
	terminals := 0
	deltas := map[string]*strings.Builder{}
	published := map[string]bool{}
	var receipt *chat.RunCancelledBody
	var resultPhaseBefore string
	opBefore := false
	sentBefore := false // the call was handed to its system (committing) before the cancel
	for i, ev := range r.events {
		if ev.Seq != prev+1 {
			r.fail("live stream jumps from seq %d to %d", prev, ev.Seq)
		}
		prev = ev.Seq
		if cancelled >= 0 && ev.Type != chat.EventQueueUpdated { // the pause, in run.cancelled's transaction
			r.fail("%s (seq %d) published after run.cancelled", ev.Type, ev.Seq)
		}
		if cancelReq >= 0 {
			switch ev.Type {
			case chat.EventToolUpdated, chat.EventCheckpointCreated, chat.EventRunCancelling, chat.EventRunCancelled,
				chat.EventQueueUpdated:
			case chat.EventMessagePublished:
				if m := ev.Body.(chat.MessagePublishedBody).Message; m.Role != chat.RoleTool {
					r.fail("%s message %s published after the cancel was accepted", m.Role, m.MessageID)
				}
			default:
				r.fail("%s (seq %d) after the cancel was accepted", ev.Type, ev.Seq)
			}
		}
		switch ev.Type {
		case chat.EventMessageDelta:
			b := ev.Body.(chat.MessageDeltaBody)
			if deltas[b.MessageID] == nil {
				deltas[b.MessageID] = &strings.Builder{}
			}
			deltas[b.MessageID].WriteString(b.Text)
		case chat.EventMessagePublished:
			m := ev.Body.(chat.MessagePublishedBody).Message
			published[m.MessageID] = true
			if m.Role == chat.RoleAssistant {
				if d := deltas[m.MessageID]; d == nil || d.String() != m.Content {
					r.fail("published %s %q is not the concatenation of its deltas (%v)", m.MessageID, m.Content, d)
				}
			}
		case chat.EventToolPrepared, chat.EventToolUpdated:
			if cancelReq < 0 {
				opBefore = true
				p := ev.Body.(chat.ToolBody).Operation.Phase
				if isResultPhase(p) {
					resultPhaseBefore = p
				}
				if p == chat.PhaseCommitting || p == chat.PhaseUnknown {
					sentBefore = true
				}
			}
		case chat.EventRunCancelRequested:
			if cancelReq >= 0 {
				r.fail("two run.cancel_requested events")
			}
			cancelReq = i
		case chat.EventRunCancelled:
			cancelled = i
			b := ev.Body.(chat.RunCancelledBody)
			receipt = &b
		}
		if ev.Type == chat.EventRunCancelled || ev.Type == chat.EventRunCompleted || ev.Type == chat.EventRunFailed {
			terminals++
		}
	}

	// The run ended once, cancelled if and only if a cancel was accepted.
	if !run.Status.Terminal() || terminals != 1 {
		r.fail("run is %s with %d terminal events", run.Status, terminals)
	}
	if accepted != (cancelReq >= 0) {
		r.fail("cancel accepted=%v but run.cancel_requested seen=%v", accepted, cancelReq >= 0)
	}
	if accepted && run.Status != chat.RunCancelled {
		r.fail("a cancel was accepted (%s) but the run ended %s", cancel.how, run.Status)
	}
	if run.Status == chat.RunFailed && (run.Error == nil || *run.Error != chat.ErrorInterrupted) {
		r.fail("run failed: %v", run.Error)
	}
	if snap.ActiveRun != nil {
		r.fail("snapshot still shows active run %+v", snap.ActiveRun)
	}
	// Messages queued while the cancel was under way wait, paused by it;
	// none started, and the receipt counts them.
	if q := snap.Queue; q == nil || len(q.Items) != r.queued || (r.queued > 0 && (!q.Paused ||
		*q.PausedReason != chat.PausedRunCancelled)) {
		r.fail("queue after the run: %+v, want %d items paused by the cancel", snap.Queue, r.queued)
	}
	if r.queued > 0 && (receipt == nil || receipt.QueuedMessages != r.queued) {
		r.fail("receipt %+v: want queued_messages %d", receipt, r.queued)
	}
	if run.Status == chat.RunCompleted {
		if n := len(snap.Messages); n == 0 || snap.Messages[n-1].Role != chat.RoleAssistant {
			r.fail("completed run does not end the history with an answer: %+v", snap.Messages)
		}
	}

	// Discarded text: every streamed message never published, plus the
	// batch a cancel at the append boundary stopped.
	var discarded int64
	for id, b := range deltas {
		if !published[id] {
			discarded += int64(utf8.RuneCountInString(b.String()))
		}
	}
	r.ws.mu.Lock()
	discarded += r.ws.inHand
	r.ws.mu.Unlock()
	if run.DiscardedStreamChars != discarded {
		r.fail("discarded_stream_chars = %d, want %d", run.DiscardedStreamChars, discarded)
	}

	// Operations: settled, consistent with their contract, and with the
	// moment of the cancel.
	ops, err := h.st.Operations(ctx, ilUser, r.thread)
	if err != nil {
		r.t.Fatal(err)
	}
	if len(ops) > 1 {
		r.fail("%d operations for one call", len(ops))
	}
	for _, op := range ops {
		outcome := ""
		if op.Outcome != nil {
			outcome = *op.Outcome
		}
		r.stats.phases[op.Contract+"/"+op.Phase]++
		pairs := map[string]string{
			chat.PhaseCompleted: chat.OutcomeCompleted, chat.PhaseCommitted: chat.OutcomeCommitted,
			chat.PhaseReconciled: chat.OutcomeCommitted, chat.PhaseVoided: chat.OutcomeNotStarted,
			chat.PhaseAborted: chat.OutcomeAborted, chat.PhaseRejected: chat.OutcomeNotStarted, chat.PhaseFailed: chat.OutcomeFailed,
			chat.PhaseUnknown: chat.OutcomeUnknown,
		}
		if o, ok := pairs[op.Phase]; !ok || o != outcome {
			r.fail("operation %s ended %s/%s", op.OperationID, op.Phase, outcome)
		}
		var allowed []string
		switch {
		case op.Contract == tools.Consequential && !accepted:
			allowed = []string{chat.PhaseCommitted, chat.PhaseReconciled, chat.PhaseRejected}
		case op.Contract == tools.Idempotent && !accepted:
			allowed = []string{chat.PhaseCompleted}
		case !opBefore:
			r.fail("operation %s was created after the cancel was accepted", op.OperationID)
		case resultPhaseBefore != "":
			allowed = []string{resultPhaseBefore}
		case op.Contract == tools.Consequential && (cancel.touched || sentBefore):
			// Handed to the provider before the cancel: a cancel cannot
			// recall it, and never reports it not started; what the
			// provider did not confirm stays unknown (invariant 10).
			allowed = []string{chat.PhaseCommitted, chat.PhaseReconciled, chat.PhaseUnknown}
		case op.Contract == tools.Consequential:
			allowed = []string{chat.PhaseVoided}
		case cancel.touched:
			allowed = []string{chat.PhaseCompleted}
		default:
			allowed = []string{chat.PhaseAborted}
		}
		if allowed != nil && !slices.Contains(allowed, op.Phase) {
			r.fail("operation %s (%s) ended %s; with the cancel %q (tool touched: %v) it must be one of %v",
				op.OperationID, op.Contract, op.Phase, cancel.how, cancel.touched, allowed)
		}
		switch op.Contract {
		case tools.Idempotent:
			calls := r.runner.callCounts()[op.OperationID]
			if (op.Phase == chat.PhaseCompleted) != (calls == 1) || calls > 1 {
				r.fail("idempotent operation %s is %s after %d calls", op.OperationID, op.Phase, calls)
			}
		case tools.Consequential:
			key := *op.IdempotencyKey
			r.mail.mu.Lock()
			acts, commits := r.mail.actions[key], r.mail.commits[key]
			r.mail.mu.Unlock()
			committed := op.Phase == chat.PhaseCommitted || op.Phase == chat.PhaseReconciled
			unknown := op.Phase == chat.PhaseUnknown // honest whatever the provider did
			if !unknown && (committed != (acts == 1) || (!committed && commits > 0)) {
				r.fail("operation %s is %s after %d commits and %d provider actions", op.OperationID, op.Phase, commits, acts)
			}
		}
	}
	if r.mail != nil {
		r.mail.mu.Lock()
		for key, n := range r.mail.actions {
			if n > 1 {
				r.fail("key %s accepted %d times by the provider", key, n)
			}
		}
		r.mail.mu.Unlock()
	}
	if accepted && receipt != nil {
		var got []chat.OperationOutcome
		for _, op := range ops {
			got = append(got, chat.OperationOutcome{OperationID: op.OperationID, Tool: op.Tool, Phase: op.Phase, Outcome: *op.Outcome})
		}
		if !slices.Equal(got, receipt.Operations) {
			r.fail("cancel receipt %+v, operations %+v", receipt.Operations, got)
		}
	}

	// Reconnects: the replay and the new subscription after it give exactly
	// what the live stream gave.
	for _, rc := range r.recon {
		rest, err := collect(rc.sub, rc.last, snap.LastSeq)
		rc.sub.Close()
		if err != nil {
			r.fail("reconnect from %d: %v", rc.from, err)
			continue
		}
		all := append(slices.Clone(rc.events), rest...)
		next := rc.from + 1
		for _, ev := range all {
			live := r.bySeq[ev.Seq]
			switch {
			case ev.Seq != next:
				r.fail("reconnect from %d: seq %d where %d was due", rc.from, ev.Seq, next)
			case live == nil || string(live.Raw) != string(ev.Raw):
				r.fail("reconnect from %d: seq %d differs from the live stream:\n  replay %s\n  live   %s", rc.from, ev.Seq, ev.Raw, liveRaw(live))
			}
			next = ev.Seq + 1
		}
		if next != snap.LastSeq+1 {
			r.fail("reconnect from %d ends at seq %d, the thread at %d", rc.from, next-1, snap.LastSeq)
		}
	}
}

func liveRaw(ev *chat.Event) string {
	if ev == nil {
		return "(none)"
	}
	return string(ev.Raw)
}

func (r *ilRun) report() string {
	var b strings.Builder
	for i, s := range r.steps {
		fmt.Fprintf(&b, "  %2d. %s\n", i+1, s)
	}
	fmt.Fprintf(&b, "  events: %s\n", r.eventTypes())
	return b.String()
}

// ---------------------------------------------------------------------------

func TestInterleavings(t *testing.T) {
	seeds := []int64{}
	switch {
	case *interleaveSeed >= 0:
		seeds = append(seeds, *interleaveSeed)
	default:
		n := *interleaveSeeds
		if n <= 0 {
			n = defaultInterleaveSeeds
			if testing.Short() {
				n /= 10
			}
		}
		for i := range n {
			seeds = append(seeds, int64(i+1))
		}
	}
	h := newHarness(t, nil)
	var cur *ilRun
	t.Cleanup(func() { // before the harness closes the engine: let go of every call
		if cur != nil {
			if cur.runner != nil {
				cur.runner.gate.open()
			}
			if cur.mail != nil {
				cur.mail.gate.open()
			}
		}
	})
	stats := &ilStats{ended: map[chat.RunStatus]int{}, phases: map[string]int{}}
	threadSeed := map[string]int64{}
	runSeed := map[string]int64{}
	failed := 0
	start := time.Now()
	checkStore := func(upTo int64) {
		vs, err := h.st.Check(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			stats.violations++
			who := "an unknown seed"
			for id, s := range threadSeed {
				if strings.Contains(v.Detail, id) {
					who = fmt.Sprintf("seed %d", s)
				}
			}
			for id, s := range runSeed {
				if strings.Contains(v.Detail, id) {
					who = fmt.Sprintf("seed %d", s)
				}
			}
			t.Errorf("store check after seed %d: %v (from %s)", upTo, v, who)
		}
	}
	for i, seed := range seeds {
		r := &ilRun{t: t, h: h, seed: seed, stats: stats, rng: rand.New(rand.NewPCG(uint64(seed), 0x1e1ea7e)),
			bySeq: map[int64]*chat.Event{}, seen: map[string]bool{}}
		cur = r
		r.play()
		r.cmu.Lock()
		r.viol = append(r.viol, r.hookViol...)
		if strings.HasPrefix(r.cancel.how, "hook:") {
			stats.cancels++
			stats.hookCancels++
		}
		r.cmu.Unlock()
		stats.seeds++
		threadSeed[r.thread] = seed
		runSeed[r.runID] = seed
		if len(r.viol) > 0 {
			stats.violations += len(r.viol)
			failed++
			t.Errorf("seed %d: %d invariant violations:\n  - %s\nsteps:\n%sreplay: go test ./engine -run TestInterleavings -interleave.seed=%d -v",
				seed, len(r.viol), strings.Join(r.viol, "\n  - "), r.report(), seed)
			if r.stuck {
				t.FailNow()
			}
			if failed >= 5 {
				t.Fatalf("stopping after %d failing seeds", failed)
			}
		}
		if len(seeds) == 1 {
			t.Logf("seed %d steps:\n%s", seed, r.report())
		}
		if (i+1)%100 == 0 || i == len(seeds)-1 {
			checkStore(seed)
		}
	}
	t.Logf("interleavings: seeds=%d steps=%d releases=%d cancels=%d (at store boundaries: %d) confirms=%d rejects=%d tool_completions=%d lost_answers=%d crashes=%d dead_workers=%d reconnects=%d queued=%d violations=%d in %v",
		stats.seeds, stats.steps, stats.releases, stats.cancels, stats.hookCancels, stats.confirms, stats.rejects, stats.completes, stats.lost,
		stats.crashes, stats.deadWorkers, stats.reconnects, stats.queued, stats.violations, time.Since(start).Round(time.Millisecond))
	t.Logf("runs ended: %v; operations ended: %v", stats.ended, stats.phases)
}
