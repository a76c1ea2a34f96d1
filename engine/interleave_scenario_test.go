// The scenario a TestInterleavings seed plays: the dead-worker prefix,
// then at each point where the engine is parked the next action (a delta,
// a cancel, a confirm or reject, the tool's completion, a lost answer, a
// reconnect, a crash).

package engine_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/tools"
)

// ---------------------------------------------------------------------------
// The scenario.

func (r *ilRun) play() {
	ctx := context.Background()
	rng := r.rng
	h := r.h
	switch rng.IntN(3) {
	case 1:
		r.toolKind = "runner"
	case 2:
		r.toolKind = "mail"
	}
	nText := 1 + rng.IntN(4)
	if r.toolKind != "" {
		nText = rng.IntN(4)
	}
	r.m = &ilModel{nText: nText, nAnswer: 1 + rng.IntN(3), gate: make(chan struct{}), waits: make(chan ilWait, 256)}
	h.backend, h.tools = r.m, nil
	switch r.toolKind {
	case "runner":
		r.runner = newRunner("lookup", tools.Idempotent, true)
		r.m.tool, r.m.args = "lookup", lookupArgs
		reg, err := tools.NewRegistry(r.runner)
		if err != nil {
			r.t.Fatal(err)
		}
		h.tools = reg
	case "mail":
		r.mail = newMailer(mailAccepts, true)
		r.m.tool, r.m.args = "fake_send_email", mailArgs
		reg, err := tools.NewRegistry(r.mail)
		if err != nil {
			r.t.Fatal(err)
		}
		h.tools = reg
	}
	r.ws = &ilStore{Store: h.st, idle: make(chan struct{}, 1)}
	if rng.IntN(4) == 0 {
		points := []string{"append", "before-publish", "after-publish", "complete"}
		if r.toolKind != "" {
			points = append(points, "record", "record")
		}
		if r.toolKind == "mail" {
			points = append(points, "committing", "committing")
		}
		r.ws.point = points[rng.IntN(len(points))]
		r.ws.nth = 1 + rng.IntN(max(nText, 1)+2)
	}
	snap := h.thread()
	r.thread, r.baseSeq = snap.ThreadID, snap.LastSeq
	r.lastSeq = snap.LastSeq
	r.sub = h.feed.Subscribe(r.thread, 1<<14)
	defer r.sub.Close()
	prefix := ""
	if rng.IntN(10) < 3 {
		options := []string{"interrupted", "interrupted"}
		switch r.toolKind {
		case "":
			options = append(options, "published")
		case "runner":
			options = append(options, "runner-handed-over")
		case "mail":
			options = append(options, "commit-open", "commit-open")
		}
		prefix = options[rng.IntN(len(options))]
	}
	r.step("scenario: tool=%q text_chunks=%d answer_chunks=%d hook=%s#%d dead_prefix=%q",
		r.toolKind, nText, r.m.nAnswer, r.ws.point, r.ws.nth, prefix)

	mk := r.mark()
	if prefix == "" {
		r.startEngine()
		ack, err := h.eng.StartRun(ctx, chat.StartRun{UserID: ilUser, ThreadID: r.thread, ExpectedStateVersion: snap.StateVersion, UserMessage: ptr("go")})
		if err != nil {
			r.t.Fatal(err)
		}
		r.setRun(ack.RunID)
	} else {
		r.setRun(h.startRun(r.thread, snap.StateVersion, ptr("go")).RunID)
		r.deadPrefix(prefix)
		r.startEngine()
	}
	r.settle(mk, "start")

	budget := 2 + rng.IntN(12)
	for i := 0; i < budget && !r.terminal && !r.stuck; i++ {
		r.act(false)
	}
	for i := 0; i < 60 && !r.terminal && !r.stuck; i++ {
		r.act(true)
	}
	if !r.terminal && !r.stuck {
		r.failStuck("the run did not end after settling")
	}
	if r.stuck {
		return
	}
	r.stopEngine()
	r.verify()
}

func (r *ilRun) setRun(runID string) {
	r.runID = runID
	r.ws.mu.Lock()
	r.ws.runID = runID
	r.ws.mu.Unlock()
}

// deadPrefix leaves the run as a worker of a dead process did, through the
// store with a foreign owner, before this engine starts.
func (r *ilRun) deadPrefix(kind string) {
	ctx := context.Background()
	h := r.h
	owner := fmt.Sprintf("dead-%d", r.seed)
	r.stats.deadWorkers++
	lease := r.claimDead(owner)
	msgID := chat.NewID(chat.PrefixMessage)
	text := []string{"dead ", "text "}
	if err := h.st.AppendDeltas(ctx, lease, msgID, text); err != nil {
		r.t.Fatal(err)
	}
	r.step("dead worker %s claimed the run and streamed %q", owner, strings.Join(text, ""))
	out := chat.StepOutput{Step: r.h.pending(r.runID), MessageID: msgID, Kind: chat.KindText, Content: strings.Join(text, "")}
	switch kind {
	case "interrupted":
		return
	case "published":
	case "runner-handed-over":
		args, _ := r.runner.Validate(lookupArgs)
		op := chat.NewID(chat.PrefixOperation)
		out.Call = &chat.ToolCall{OperationID: op, Tool: "lookup", Contract: tools.Idempotent, Args: args, IdempotencyKey: op}
	case "commit-open":
		args, _ := r.mail.Validate(mailArgs)
		preview, key, err := r.mail.Prepare(r.thread, args)
		if err != nil {
			r.t.Fatal(err)
		}
		out.Call = &chat.ToolCall{OperationID: chat.NewID(chat.PrefixOperation), Tool: "fake_send_email", Contract: tools.Consequential,
			Args: args, Preview: preview, IdempotencyKey: key}
	}
	if err := h.st.PublishStep(ctx, lease, out); err != nil {
		r.t.Fatal(err)
	}
	r.step("dead worker published its step (call: %v)", out.Call != nil)
	if kind != "commit-open" {
		return
	}
	op := out.Call
	if _, err := h.st.DecideOperation(ctx, chat.Decide{UserID: ilUser, OperationID: op.OperationID, ExpectedStateVersion: h.snapshot(r.thread).StateVersion, Confirm: true}); err != nil {
		r.t.Fatal(err)
	}
	lease = r.claimDead(owner)
	if err := h.st.SetOperationPhase(ctx, lease, op.OperationID, chat.PhaseCommitting, "", true); err != nil {
		r.t.Fatal(err)
	}
	r.step("user confirmed; dead worker set committing")
	if r.rng.IntN(2) == 0 {
		r.mail.mu.Lock()
		r.mail.commits[op.IdempotencyKey]++
		r.mail.accept(op.IdempotencyKey)
		r.mail.mu.Unlock()
		r.deadReached = true
		r.step("the provider accepted the dead worker's commit; it died before the answer")
	}
	if r.rng.IntN(2) == 0 {
		if _, _, err := h.st.RequestCancel(ctx, chat.CancelRun{UserID: ilUser, RunID: r.runID, Reason: chat.ReasonUserRequested, RequestedBy: "tab:dead"}); err != nil {
			r.t.Fatal(err)
		}
		r.noteCancel("recorded while the dead worker held the commit")
		r.stats.cancels++
		r.step("cancel recorded while the dead worker held the run")
	}
}

func (r *ilRun) claimDead(owner string) chat.Lease {
	run, err := r.h.st.Claim(context.Background(), owner, time.Hour)
	if err != nil || run == nil || run.Run.RunID != r.runID {
		r.t.Fatalf("seed %d: dead claim = %+v, %v (want run %s)\n%s", r.seed, run, err, r.runID, r.report())
	}
	return run.Lease
}

// state names where the engine rests.
func (r *ilRun) state() string {
	switch {
	case r.terminal:
		return "ended"
	case r.wcOp != "" && !r.cancelAccepted():
		return "waiting_confirmation"
	case r.toolBlocked:
		return "tool_in_flight"
	case r.waiting && r.wait.stream > r.staleBound:
		return "streaming"
	}
	return "nowhere"
}

type ilAction struct {
	name   string
	weight int
}

// act picks the next event (only progress when settling) and waits for
// the engine to rest again.
func (r *ilRun) act(settling bool) {
	st := r.state()
	var acts []ilAction
	accepted := r.cancelAccepted()
	switch st {
	case "streaming":
		acts = []ilAction{{"release", 12}, {"cancel", 1}, {"crash", 1}, {"reconnect", 1}}
	case "waiting_confirmation":
		acts = []ilAction{{"confirm", 4}, {"reject", 2}, {"cancel", 1}, {"crash", 1}, {"reconnect", 1}}
	case "tool_in_flight":
		acts = []ilAction{{"complete", 4}, {"cancel", 1}, {"crash", 1}, {"reconnect", 1}}
		if r.mail != nil {
			acts = append(acts, ilAction{"lost", 1})
		}
	default:
		r.failStuck("no point of rest to act from (events: %s)", r.eventTypes())
		return
	}
	var pick []ilAction
	total := 0
	for _, a := range acts {
		if a.name == "cancel" && accepted && !settling {
			a.name = "cancel-again" // a duplicate cancel changes nothing
			a.weight = 1
		}
		if settling && a.name != "release" && a.name != "confirm" && a.name != "reject" && a.name != "complete" {
			continue
		}
		if a.name == "crash" && r.crashes >= 3 {
			continue
		}
		if a.name == "reconnect" && len(r.recon) >= 2 {
			continue
		}
		pick = append(pick, a)
		total += a.weight
	}
	if accepted && !settling && r.queued < 3 {
		pick = append(pick, ilAction{"queue", 1})
		total++
	}
	n := r.rng.IntN(total)
	var a string
	for _, c := range pick {
		if n < c.weight {
			a = c.name
			break
		}
		n -= c.weight
	}
	r.do(st, a)
}

func (r *ilRun) do(st, a string) {
	ctx := context.Background()
	h := r.h
	mk := r.mark()
	r.stats.steps++
	switch a {
	case "release":
		r.step("release chunk %d of stream %d", r.wait.chunk, r.wait.stream)
		r.stats.releases++
		select {
		case r.m.gate <- struct{}{}:
		case <-time.After(ilWaitT):
			r.failStuck("the model never took chunk %d of stream %d", r.wait.chunk, r.wait.stream)
			return
		}
		r.waiting = false
	case "cancel", "cancel-again":
		again := a == "cancel-again"
		if !again && r.rng.IntN(2) == 0 {
			// At a point of rest the run cannot end before the cancel:
			// what is queued now waits, and the cancel pauses it.
			r.queue(st)
		}
		r.step("cancel (%s)", st)
		ack, err := h.eng.CancelRun(ctx, chat.CancelRun{UserID: ilUser, RunID: r.runID, Reason: chat.ReasonUserRequested, RequestedBy: "tab:seed"})
		if err != nil {
			r.fail("cancel in %s: %v", st, err)
			return
		}
		if ack.AlreadyRequested != again {
			r.fail("cancel in %s answered already_requested=%v", st, ack.AlreadyRequested)
		}
		if again {
			return // nothing changes
		}
		r.stats.cancels++
		r.noteCancel("cancel in " + st)
	case "confirm", "reject":
		confirm := a == "confirm"
		r.step("%s %s", a, r.wcOp)
		if _, err := h.eng.DecideOperation(ctx, chat.Decide{UserID: ilUser, OperationID: r.wcOp, ExpectedStateVersion: h.snapshot(r.thread).StateVersion, Confirm: confirm}); err != nil {
			r.fail("%s: %v", a, err)
			return
		}
		if confirm {
			r.stats.confirms++
		} else {
			r.stats.rejects++
		}
		r.wcOp = ""
	case "complete", "lost":
		r.step("%s the tool call", a)
		if a == "lost" {
			r.stats.lost++
			r.mail.mu.Lock()
			r.mail.mode = mailAcceptTimeout
			r.mail.mu.Unlock()
		} else {
			r.stats.completes++
		}
		r.openTool()
	case "reconnect":
		from := r.baseSeq + r.rng.Int64N(r.lastSeq-r.baseSeq+1)
		r.step("reconnect from seq %d (live at %d)", from, r.lastSeq)
		r.stats.reconnects++
		sub := h.feed.Subscribe(r.thread, 1<<14)
		rep, err := h.st.Events(ctx, ilUser, r.thread, from)
		if err != nil || !rep.Complete {
			r.fail("replay from %d: complete=%v, %v", from, rep.Complete, err)
			sub.Close()
			return
		}
		r.recon = append(r.recon, &ilReconnect{from: from, last: rep.LastSeq, events: rep.Events, sub: sub})
		return // nothing moves
	case "queue":
		r.queue(st)
		return // nothing moves
	case "crash":
		r.crash(st)
		if st == "waiting_confirmation" {
			return // nothing holds the run: nothing moves
		}
	}
	r.settle(mk, a)
}

// crash stops the engine (it hands runs back), maybe lets a worker of
// another (dead) process take the run and die, and starts a new engine.
func (r *ilRun) crash(st string) {
	r.crashes++
	r.stats.crashes++
	r.step("crash (%s)", st)
	r.stopEngine()
	r.staleBound = r.m.count()
	r.waiting = false
	if st == "streaming" && r.rng.IntN(2) == 0 {
		if run := r.h.run(r.runID); run.Status == chat.RunQueued {
			owner := fmt.Sprintf("dead-%d-%d", r.seed, r.crashes)
			lease := r.claimDead(owner)
			if err := r.h.st.AppendDeltas(context.Background(), lease, chat.NewID(chat.PrefixMessage), []string{fmt.Sprintf("dead%d ", r.crashes)}); err != nil {
				r.t.Fatal(err)
			}
			r.stats.deadWorkers++
			r.step("a dead worker %s took the run, streamed a delta and died", owner)
		}
	}
	r.startEngine()
}

// queue adds a message to the thread's queue while the run is active and
// either already being cancelled or about to be (the cancel follows at
// once, at a point of rest): the run can then only end cancelled, and the
// message must be paused by that end, never started (invariant 11),
// whatever the end's interleaving.
func (r *ilRun) queue(st string) {
	r.step("queue a message (%s)", st)
	ack, err := r.h.eng.QueueAdd(context.Background(), chat.QueueAdd{UserID: ilUser, ThreadID: r.thread,
		UserMessage: "queued", RequestedBy: "tab:seed"})
	if err != nil || ack.Position != r.queued+1 || ack.RunID != "" {
		r.fail("queue.add while the run is active: %+v, %v", ack, err)
		return
	}
	r.queued++
	r.stats.queued++
}
