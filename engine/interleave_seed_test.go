// One TestInterleavings seed (ilRun): its state, the events it observed,
// how it waits until the engine is parked again, and starting and stopping
// its engine.

package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
)

// ---------------------------------------------------------------------------
// One seed.

type ilStats struct {
	seeds, steps, cancels, hookCancels, confirms, rejects, completes, lost int
	crashes, deadWorkers, reconnects, releases, queued                     int
	ended                                                                  map[chat.RunStatus]int
	phases                                                                 map[string]int
	violations                                                             int
}

type ilReconnect struct {
	from, last int64
	events     []*chat.Event
	sub        *bus.Subscription
}

type ilRun struct {
	t     *testing.T
	h     *harness
	rng   *rand.Rand
	seed  int64
	stats *ilStats

	steps []string
	viol  []string
	stuck bool

	m        *ilModel
	runner   *fakeRunner
	mail     *fakeMailer
	toolKind string // "", "runner", "mail"
	ws       *ilStore
	thread   string
	runID    string
	baseSeq  int64

	sub     *bus.Subscription
	events  []*chat.Event
	bySeq   map[int64]*chat.Event
	lastSeq int64
	seen    map[string]bool // delta texts seen
	recon   []*ilReconnect

	terminal       bool
	wcOp           string // the operation waiting for a decision
	wcSeq          int64
	cancellingSeen bool

	wait       ilWait
	waiting    bool
	staleBound int // waits of streams up to this one are stale (before a crash)

	entered     int // tool calls that reached the runner or the provider
	toolBlocked bool
	gateOpen    bool
	deadReached bool

	cmu      sync.Mutex // guards the cancel record (the hook writes it on a worker)
	hookViol []string
	cancel   struct {
		accepted bool
		how      string
		touched  bool // the tool had been called (or the provider reached) at that moment
	}
	crashes int
	queued  int // messages queued after the cancel was accepted
}

func (r *ilRun) step(format string, args ...any) {
	r.steps = append(r.steps, fmt.Sprintf(format, args...))
}

func (r *ilRun) fail(format string, args ...any) {
	r.viol = append(r.viol, fmt.Sprintf(format, args...))
}

func (r *ilRun) failStuck(format string, args ...any) {
	r.fail(format, args...)
	r.stuck = true
}

// touched reports whether the tool was called or the provider reached.
func (r *ilRun) touched() bool {
	if r.runner != nil {
		for _, n := range r.runner.callCounts() {
			if n > 0 {
				return true
			}
		}
	}
	if r.mail != nil {
		r.mail.mu.Lock()
		defer r.mail.mu.Unlock()
		for _, n := range r.mail.commits {
			if n > 0 {
				return true
			}
		}
		return len(r.mail.accepted) > 0
	}
	return false
}

func (r *ilRun) noteCancel(how string) {
	touched := r.touched()
	r.cmu.Lock()
	defer r.cmu.Unlock()
	if !r.cancel.accepted {
		r.cancel.accepted, r.cancel.how, r.cancel.touched = true, how, touched
	}
}

func (r *ilRun) cancelAccepted() bool {
	r.cmu.Lock()
	defer r.cmu.Unlock()
	return r.cancel.accepted
}

// observe takes one event of the primary subscription.
func (r *ilRun) observe(ev *chat.Event) {
	r.events = append(r.events, ev)
	r.bySeq[ev.Seq] = ev
	r.lastSeq = ev.Seq
	if ev.RunID != r.runID && ev.RunID != "" {
		r.fail("event %s seq %d of a foreign run %s on the thread", ev.Type, ev.Seq, ev.RunID)
	}
	switch ev.Type {
	case chat.EventMessageDelta:
		r.seen[ev.Body.(chat.MessageDeltaBody).Text] = true
	case chat.EventRunWaitingConfirmation:
		r.wcOp, r.wcSeq = ev.Body.(chat.RunWaitingConfirmationBody).OperationID, ev.Seq
	case chat.EventToolUpdated:
		if op := ev.Body.(chat.ToolBody).Operation; op.OperationID == r.wcOp && op.Phase != chat.PhasePrepared {
			r.wcOp = "" // decided (or voided) already
		}
	case chat.EventRunCancelling:
		r.cancellingSeen = true
	case chat.EventRunCancelled, chat.EventRunCompleted, chat.EventRunFailed:
		r.terminal = true
		r.wcOp = ""
	}
}

// drain takes every event already delivered, without waiting.
func (r *ilRun) drain() {
	for {
		select {
		case ev, ok := <-r.sub.Events():
			if !ok {
				r.failStuck("primary subscription ended: %v", r.sub.Err())
				return
			}
			r.observe(ev)
		default:
			return
		}
	}
}

type ilMark struct {
	seq     int64
	wait    ilWait
	waiting bool
	entered int
}

func (r *ilRun) mark() ilMark {
	return ilMark{seq: r.lastSeq, wait: r.wait, waiting: r.waiting, entered: r.entered}
}

// parked reports whether the engine reached its next point of rest since
// mk: the run ended, waits for a decision, a tool call waits, or the model
// waits for its next chunk with every chunk released so far buffered.
func (r *ilRun) parked(mk ilMark) bool {
	switch {
	case r.terminal:
		return true
	case r.ws.busy.Load() > 0:
		return false
	case r.cancelAccepted():
		// A cancel ends the run, but a tool call in flight is waited for:
		// the run reports cancelling meanwhile.
		return r.toolBlocked && r.cancellingSeen
	case r.wcOp != "" && r.wcSeq > mk.seq:
		return true
	case r.entered > mk.entered && r.toolBlocked:
		return true
	case r.waiting && r.wait.stream > r.staleBound && (!mk.waiting || r.wait != mk.wait) &&
		(r.wait.prev == "" || r.seen[r.wait.prev]):
		return true
	}
	return false
}

// settle waits (bounded) until the engine is parked again.
func (r *ilRun) settle(mk ilMark, what string) {
	var started, entered <-chan string
	if r.runner != nil {
		started = r.runner.started
	}
	if r.mail != nil {
		entered = r.mail.entered
	}
	deadline := time.NewTimer(ilWaitT)
	defer deadline.Stop()
	for {
		r.drain() // judge on every event already delivered
		if r.stuck || r.parked(mk) {
			break
		}
		select {
		case ev, ok := <-r.sub.Events():
			if !ok {
				r.failStuck("primary subscription ended after %s: %v", what, r.sub.Err())
				return
			}
			r.observe(ev)
		case w := <-r.m.waits:
			if w.stream > r.staleBound {
				r.wait, r.waiting = w, true
			}
		case <-started:
			r.entered++
			r.toolBlocked = !r.gateOpen
		case <-entered:
			r.entered++
			r.toolBlocked = !r.gateOpen
		case <-r.ws.idle:
		case <-deadline.C:
			r.failStuck("after %s the engine never came to rest (status events: %s)", what, r.eventTypes())
			return
		}
	}
}

func (r *ilRun) eventTypes() string {
	var out []string
	for _, ev := range r.events {
		out = append(out, ev.Type)
	}
	return strings.Join(out, " ")
}

func (r *ilRun) startEngine() {
	cfg := r.h.config()
	cfg.Store, cfg.LeaseTTL = r.ws, time.Hour // no maintenance tick: only the seed moves things
	eng := engine.New(cfg)
	r.ws.mu.Lock()
	r.ws.fire = func(point string) {
		if r.cancelAccepted() {
			return
		}
		ack, err := eng.CancelRun(context.Background(), chat.CancelRun{UserID: ilUser, RunID: r.runID,
			Reason: chat.ReasonUserRequested, RequestedBy: "tab:hook"})
		if err != nil || ack.AlreadyRequested || ack.Status != chat.RunCancelRequested {
			r.cmu.Lock()
			r.hookViol = append(r.hookViol, fmt.Sprintf("hook cancel at %s = %+v, %v", point, ack, err))
			r.cmu.Unlock()
			return
		}
		r.noteCancel("hook:" + point)
	}
	r.ws.mu.Unlock()
	if err := eng.Start(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	r.h.eng = eng
}

// stopEngine closes the engine; a tool call in flight is let go (shutdown
// waits for it).
func (r *ilRun) stopEngine() {
	stopped := make(chan struct{})
	go func() { r.h.stop(); close(stopped) }()
	if r.toolBlocked {
		r.openTool()
	}
	select {
	case <-stopped:
	case <-time.After(ilWaitT):
		r.t.Fatalf("seed %d: the engine did not close\n%s", r.seed, r.report())
	}
}

func (r *ilRun) openTool() {
	if r.runner != nil {
		r.runner.gate.open()
	}
	if r.mail != nil {
		r.mail.gate.open()
	}
	r.gateOpen, r.toolBlocked = true, false
}
