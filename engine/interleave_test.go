package engine_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/model"
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
// The gated model.

// ilWait says that stream (numbered from 1 in creation order) waits for the
// token of chunk; prev is the text of the chunk before it ("" for none).
type ilWait struct {
	stream, chunk int
	prev          string
	last          bool // chunk is the stream's last
}

// ilModel streams a user turn of nText unique text chunks, then (when the
// request offers it) one tool call; a turn after a tool result streams
// nAnswer chunks. Every chunk waits for a token on gate; before waiting,
// the stream reports on waits where it stands.
type ilModel struct {
	nText, nAnswer int
	tool           string
	args           []byte

	gate  chan struct{}
	waits chan ilWait

	mu      sync.Mutex
	streams int
}

func (m *ilModel) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	m.mu.Lock()
	m.streams++
	n := m.streams
	m.mu.Unlock()
	var chunks []model.Chunk
	if len(req.Messages) > 0 && req.Messages[len(req.Messages)-1].Role == model.RoleTool {
		for i := range m.nAnswer {
			chunks = append(chunks, model.Chunk{Text: fmt.Sprintf("s%dA%d ", n, i)})
		}
	} else {
		for i := range m.nText {
			chunks = append(chunks, model.Chunk{Text: fmt.Sprintf("s%dT%d ", n, i)})
		}
		if m.tool != "" && slices.ContainsFunc(req.Tools, func(s model.ToolSpec) bool { return s.Name == m.tool }) {
			chunks = append(chunks, model.Chunk{Call: &model.ToolCall{ID: "call_1", Name: m.tool, Arguments: m.args}})
		}
	}
	return &ilStream{m: m, n: n, ctx: ctx, chunks: chunks, closed: make(chan struct{})}, nil
}

func (m *ilModel) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.streams
}

type ilStream struct {
	m         *ilModel
	n, i      int
	ctx       context.Context
	chunks    []model.Chunk
	closed    chan struct{}
	closeOnce sync.Once
}

func (s *ilStream) Next(ctx context.Context) (model.Chunk, error) {
	if s.i >= len(s.chunks) {
		return model.Chunk{}, model.EOF
	}
	w := ilWait{stream: s.n, chunk: s.i, last: s.i == len(s.chunks)-1}
	if s.i > 0 {
		w.prev = s.chunks[s.i-1].Text
	}
	select {
	case s.m.waits <- w:
	case <-ctx.Done():
		return model.Chunk{}, ctx.Err()
	case <-s.ctx.Done():
		return model.Chunk{}, s.ctx.Err()
	}
	if err := waitGate(ctx, s.ctx, s.closed, s.m.gate, nil); err != nil {
		return model.Chunk{}, err
	}
	c := s.chunks[s.i]
	s.i++
	return c, nil
}

func (s *ilStream) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return nil
}

// ---------------------------------------------------------------------------
// A store that cancels at a chosen boundary.

// ilStore is a hookStore-style wrapper: once, at the chosen point of the
// chosen run, it cancels through the engine from the worker's goroutine,
// just before (or, for "after-publish", just after) the store call.
type ilStore struct {
	engine.Store

	mu      sync.Mutex
	runID   string
	point   string // append, before-publish, after-publish, committing, record, complete
	nth     int    // for append: the nth AppendDeltas call of the run
	appends int
	fired   bool
	inHand  int64 // characters of the batch the append hook stopped
	fire    func(point string)

	busy atomic.Int32  // worker calls inside this wrapper (hooks included)
	idle chan struct{} // a call left the wrapper
}

// enter and leave bracket a wrapped call: the seed judges the engine at
// rest only while no worker is inside one (a hook may be cancelling).
func (s *ilStore) enter() { s.busy.Add(1) }

func (s *ilStore) leave() {
	s.busy.Add(-1)
	select {
	case s.idle <- struct{}{}:
	default:
	}
}

func (s *ilStore) hit(runID, point string, texts []string) {
	s.mu.Lock()
	match := !s.fired && s.point == point && runID == s.runID
	if point == "append" && runID == s.runID {
		s.appends++
		match = match && s.appends == s.nth
	}
	if match {
		s.fired = true
		for _, t := range texts {
			s.inHand += int64(utf8.RuneCountInString(t))
		}
	}
	fire := s.fire
	s.mu.Unlock()
	if match && fire != nil {
		fire(point)
	}
}

func (s *ilStore) AppendDeltas(ctx context.Context, lease chat.Lease, messageID string, texts []string) error {
	runID := lease.RunID
	s.enter()
	defer s.leave()
	s.hit(runID, "append", texts)
	return s.Store.AppendDeltas(ctx, lease, messageID, texts)
}

func (s *ilStore) PublishStep(ctx context.Context, lease chat.Lease, out chat.StepOutput) error {
	runID := lease.RunID
	s.enter()
	defer s.leave()
	s.hit(runID, "before-publish", nil)
	err := s.Store.PublishStep(ctx, lease, out)
	if err == nil {
		s.hit(runID, "after-publish", nil)
	}
	return err
}

// CompleteWith is split into PublishStep and Complete here, each with its
// hook points, so the interleavings include a cancel or a crash between
// the two: a superset of the engine's one transaction (a database an
// earlier version wrote may hold a run published and not completed).
func (s *ilStore) CompleteWith(ctx context.Context, lease chat.Lease, out chat.StepOutput) error {
	if err := s.PublishStep(ctx, lease, out); err != nil {
		return err
	}
	return s.Complete(ctx, lease)
}

func (s *ilStore) SetOperationPhase(ctx context.Context, lease chat.Lease, opID, phase, outcome string, needRunning bool) error {
	runID := lease.RunID
	s.enter()
	defer s.leave()
	if phase == chat.PhaseCommitting {
		s.hit(runID, "committing", nil)
	}
	return s.Store.SetOperationPhase(ctx, lease, opID, phase, outcome, needRunning)
}

func (s *ilStore) RecordToolResult(ctx context.Context, lease chat.Lease, opID string, out chat.ToolOutcome) error {
	runID := lease.RunID
	s.enter()
	defer s.leave()
	s.hit(runID, "record", nil)
	return s.Store.RecordToolResult(ctx, lease, opID, out)
}

func (s *ilStore) Complete(ctx context.Context, lease chat.Lease) error {
	runID := lease.RunID
	s.enter()
	defer s.leave()
	s.hit(runID, "complete", nil)
	return s.Store.Complete(ctx, lease)
}

// ---------------------------------------------------------------------------
// One seed.

type ilStats struct {
	seeds, steps, cancels, hookCancels, confirms, rejects, completes, lost int
	crashes, deadWorkers, reconnects, releases                             int
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
		if cancelled >= 0 {
			r.fail("%s (seq %d) published after run.cancelled", ev.Type, ev.Seq)
		}
		if cancelReq >= 0 {
			switch ev.Type {
			case chat.EventToolUpdated, chat.EventCheckpointCreated, chat.EventRunCancelling, chat.EventRunCancelled:
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
	t.Logf("interleavings: seeds=%d steps=%d releases=%d cancels=%d (at store boundaries: %d) confirms=%d rejects=%d tool_completions=%d lost_answers=%d crashes=%d dead_workers=%d reconnects=%d violations=%d in %v",
		stats.seeds, stats.steps, stats.releases, stats.cancels, stats.hookCancels, stats.confirms, stats.rejects, stats.completes, stats.lost,
		stats.crashes, stats.deadWorkers, stats.reconnects, stats.violations, time.Since(start).Round(time.Millisecond))
	t.Logf("runs ended: %v; operations ended: %v", stats.ended, stats.phases)
}
