// The random crash test's harness (main_crash_test.go): the prompts, the
// ledger of what the server acknowledged, the watchers that check every
// event a tab sees, and the workers that drive runs until the kill.

package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

var (
	crashSeed   = flag.Int64("crash.seed", 0, "TestBinaryCrashRestartRandom: seed of the random workload (0: from the clock)")
	crashCycles = flag.Int("crash.cycles", 12, "TestBinaryCrashRestartRandom: number of kill/restart cycles")
)

// crashPrompts are the new requests a worker picks from: tools (search,
// email in a few drafts so that keys repeat across runs of a thread), a
// card, long and short plain replies.
var crashPrompts = []string{
	"search the catalog for a hiking backpack",
	"search the catalog for a rain jacket",
	"send an email to anna@example.com about the order",
	"send an email to bob@example.com about the invoice",
	"send an email to anna@example.com about the order",
	"I want to order 2 backpacks",
	"Explain goroutines and channels and how cancellation travels through them",
	"Describe durable checkpoints, leases and recovery after crashes",
	"short answer please: what is a checkpoint",
	"short: say hello",
}

// ---------------------------------------------------------------------------
// Commands race with the SIGKILL: the workers' protocol client reports
// errors instead of failing the test, and an unanswered command is simply
// not acknowledged.

// crashAPI is the workers' protocol client of one server: each request
// bounded by 10 s.
func crashAPI(t *testing.T, base string) *client.Client {
	t.Helper()
	return apptest.NewAPI(t, base, 10*time.Second, nil)
}

// ---------------------------------------------------------------------------
// The ledger: every acknowledged command and its answer, the counters, and
// the violations found.

type fragmentRec struct {
	threadID, streamed string
	lastSeq            int64
	content            string
	contentKnown       bool
}

type crashLedger struct {
	mu         sync.Mutex
	runs       map[string]string // acked run.start: run -> thread
	cancels    map[string]string // acked cancel: run -> ack status
	fragments  map[string]fragmentRec
	confirms   map[string]string // acked confirm: operation -> run
	rejects    map[string]string // acked reject: operation -> run
	queued     map[string]string // acked queue.add: item -> thread
	queueOps   map[string]int    // acked queue commands by kind
	continues  int
	stale      int
	codes      map[string]int // refusals by "command:code"
	violations []string
}

func newCrashLedger() *crashLedger {
	return &crashLedger{runs: map[string]string{}, cancels: map[string]string{}, fragments: map[string]fragmentRec{},
		confirms: map[string]string{}, rejects: map[string]string{}, codes: map[string]int{},
		queued: map[string]string{}, queueOps: map[string]int{}}
}

func (l *crashLedger) violate(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.violations = append(l.violations, fmt.Sprintf(format, args...))
}

func (l *crashLedger) refused(cmd string, e *client.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.codes[fmt.Sprintf("%s:%d:%s", cmd, e.Status, e.Code)]++
}

// ---------------------------------------------------------------------------
// A watcher: one event stream per thread per cycle, from after_seq=0. It
// checks the order of seqs, that a seq once seen (in any cycle) always
// names the same event, and invariant 4 (nothing of a run after its
// run.cancelled but tool.updated); it keeps the deltas for fragment saves
// and wakes workers waiting for progress.

type seenDelta struct {
	seq  int64
	text string
}

type threadHistory struct {
	mu   sync.Mutex
	sigs map[int64]string // seq -> signature, across cycles
}

func eventSignature(ev client.Event) string {
	msgID, text := "", ""
	switch b := ev.Body.(type) {
	case *chat.MessageDeltaBody:
		msgID, text = b.MessageID, b.Text
	case *chat.MessageDeletedBody:
		msgID = b.MessageID
	case *chat.MessagePublishedBody:
		msgID = "/" + b.Message.MessageID
	}
	return fmt.Sprintf("%s run=%s msg=%s sv=%d text=%q", ev.Type, ev.RunID, msgID, ev.StateVersion, text)
}

type watcher struct {
	threadID string
	hist     *threadHistory
	ledger   *crashLedger
	done     chan struct{}

	mu       sync.Mutex
	lastSeq  int64
	snapshot bool // the stream started with a thread.snapshot
	deltas   map[string][]seenDelta
	order    []string // streamed message ids, first seen first
	notify   chan struct{}
	events   int
}

func startWatcher(ctx context.Context, api *client.Client, threadID string, hist *threadHistory, l *crashLedger) (*watcher, error) {
	es, err := api.Events(ctx, threadID, 0)
	if err != nil {
		return nil, fmt.Errorf("event stream of %s: %w", threadID, err)
	}
	w := &watcher{threadID: threadID, hist: hist, ledger: l, done: make(chan struct{}),
		deltas: map[string][]seenDelta{}, notify: make(chan struct{})}
	go w.read(ctx, es)
	return w, nil
}

// checkEvent applies the per-event checks shared by the live watchers and
// the final replay: a snapshot may only come first, a seq is never
// renamed, invariant 4. (The client delivers every seq once and in order,
// and counts what it had to repair: checkStream.) prev is the last seq
// applied (-1 before the first event). cancelled holds the runs whose
// run.cancelled this stream delivered.
func checkEvent(l *crashLedger, hist *threadHistory, cancelled map[string]bool, where string, prev int64, ev client.Event) {
	if ev.Type == chat.EventThreadSnapshot {
		if prev != -1 {
			l.violate("%s: thread.snapshot (seq %d) in the middle of the stream after seq %d", where, ev.Seq, prev)
		}
		return
	}
	sig := eventSignature(ev)
	hist.mu.Lock()
	if old, ok := hist.sigs[ev.Seq]; ok && old != sig {
		l.violate("%s: seq %d was %s, now %s: a seq a client saw was reused", where, ev.Seq, old, sig)
	} else if !ok {
		hist.sigs[ev.Seq] = sig
	}
	hist.mu.Unlock()
	if ev.RunID != "" && cancelled[ev.RunID] && ev.Type != chat.EventToolUpdated {
		l.violate("%s: run %s emitted %s (seq %d) after its run.cancelled", where, ev.RunID, ev.Type, ev.Seq)
	}
	if ev.Type == chat.EventRunCancelled {
		cancelled[ev.RunID] = true
	}
}

// checkStream records as violations what the client had to repair or drop
// on an event stream: an SSE event whose id or event line disagrees with
// its data (or unreadable data), a duplicate, a gap, an event of another
// thread.
func checkStream(l *crashLedger, where string, st client.Stats) {
	if st.Malformed+st.Duplicates+st.Jumps+st.Stray > 0 {
		l.violate("%s: %d malformed SSE events, %d duplicates, %d gaps, %d events of another thread; the last: %s",
			where, st.Malformed, st.Duplicates, st.Jumps, st.Stray, st.LastAnomaly)
	}
}

// read follows the stream until ctx ends (the cycle's end).
func (w *watcher) read(ctx context.Context, es *client.Stream) {
	defer close(w.done)
	defer es.Close()
	where := "live " + w.threadID
	defer func() { checkStream(w.ledger, where, es.Stats()) }()
	prev := int64(-1)
	cancelled := map[string]bool{}
	for {
		ev, err := es.Next(ctx)
		if err != nil {
			return
		}
		checkEvent(w.ledger, w.hist, cancelled, where, prev, ev)
		w.mu.Lock()
		if ev.Type == chat.EventThreadSnapshot {
			w.snapshot = true
		}
		if d := ev.Delta(); d != nil {
			if _, ok := w.deltas[d.MessageID]; !ok {
				w.order = append(w.order, d.MessageID)
			}
			w.deltas[d.MessageID] = append(w.deltas[d.MessageID], seenDelta{seq: ev.Seq, text: d.Text})
		}
		prev, w.lastSeq = ev.Seq, ev.Seq
		w.events++
		close(w.notify)
		w.notify = make(chan struct{})
		w.mu.Unlock()
	}
}

// waitEvents waits until n more events arrived, stop closed, or a safety
// bound passed (a run may have ended: there is then nothing to wait for).
func (w *watcher) waitEvents(n int, stop <-chan struct{}) {
	w.mu.Lock()
	target := w.events + n
	w.mu.Unlock()
	bound := time.NewTimer(3 * time.Second)
	defer bound.Stop()
	for {
		w.mu.Lock()
		got, ch := w.events, w.notify
		w.mu.Unlock()
		if got >= target {
			return
		}
		select {
		case <-ch:
		case <-stop:
			return
		case <-w.done:
			return
		case <-bound.C:
			return
		}
	}
}

// pickFragment picks a streamed message and a delta of it this watcher
// displayed; content is the text up to that delta.
func (w *watcher) pickFragment(r *rand.Rand) (msgID string, lastSeq int64, content string, known bool, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.order) == 0 {
		return "", 0, "", false, false
	}
	// Prefer recent messages: they are the ones a user looks at.
	i := len(w.order) - 1 - r.Intn(min(3, len(w.order)))
	msgID = w.order[i]
	ds := w.deltas[msgID]
	k := r.Intn(len(ds))
	var b strings.Builder
	for _, d := range ds[:k+1] {
		b.WriteString(d.text)
	}
	return msgID, ds[k].seq, b.String(), !w.snapshot, true
}

// ---------------------------------------------------------------------------
// A worker drives one thread until stop is closed.

type crashWorker struct {
	api      *client.Client
	threadID string
	r        *rand.Rand
	w        *watcher
	l        *crashLedger
	stop     <-chan struct{}
}

func (cw *crashWorker) stopped() bool {
	select {
	case <-cw.stop:
		return true
	default:
		return false
	}
}

// answered sorts the outcome of a command: err nil (done), the server's
// refusal (returned), or no answer (ok false). No answer while the server
// should be alive is a violation (it died on its own), and so is a 5xx.
func (cw *crashWorker) answered(what string, err error) (refused *client.Error, ok bool) {
	if err == nil {
		return nil, true
	}
	e := apptest.Refusal(err)
	if e == nil {
		if !cw.stopped() {
			cw.l.violate("%s failed while the server should be alive: %v", what, err)
		}
		return nil, false
	}
	if e.Status >= 500 {
		cw.l.violate("%s: %d %v", what, e.Status, e)
	}
	return e, true
}

// read sorts the outcome of a read no refusal may answer, as answered
// does: it reports whether the read succeeded, and a refusal is a
// violation.
func (cw *crashWorker) read(what string, err error) bool {
	e, ok := cw.answered(what, err)
	if !ok {
		return false
	}
	if e != nil {
		cw.l.violate("%s: %d %v", what, e.Status, e)
		return false
	}
	return true
}

func (cw *crashWorker) run() {
	ctx := context.Background()
	for !cw.stopped() {
		snap, err := cw.api.Thread(ctx, cw.threadID)
		if !cw.read("GET thread "+cw.threadID, err) {
			return
		}
		p := cw.r.Intn(100)
		switch {
		case snap.ActiveRun == nil && snap.Queue != nil && snap.Queue.Paused && p < 30:
			cw.resume(snap)
		case snap.ActiveRun == nil && p < 65:
			cw.start(snap)
		case snap.ActiveRun == nil && p < 80:
			cw.fragment(snap)
		case snap.ActiveRun == nil && p < 90:
			cw.staleCommand(snap)
		case snap.ActiveRun == nil:
			cw.w.waitEvents(1+cw.r.Intn(3), cw.stop)
		default:
			cw.active(snap, p)
		}
	}
}

// active picks what to do while the thread has a run in flight.
func (cw *crashWorker) active(snap chat.Snapshot, p int) {
	waiting := snap.ActiveRun.Status == chat.RunWaitingConfirmation
	switch {
	case waiting && p < 45:
		cw.decide(snap, true)
	case waiting && p < 65:
		cw.decide(snap, false)
	case waiting && p < 85, !waiting && p < 10:
		cw.cancel(snap.ActiveRun.RunID, snap)
	case !waiting && p < 25:
		cw.fragment(snap)
	case !waiting && p < 31:
		cw.staleCommand(snap)
	case p < 40:
		cw.queueAdd(snap)
	case p < 44 && snap.Queue != nil && len(snap.Queue.Items) > 0:
		cw.queueRemove(snap)
	default:
		cw.w.waitEvents(1+cw.r.Intn(12), cw.stop)
	}
}

func (cw *crashWorker) start(snap chat.Snapshot) {
	req := client.StartRunRequest{ThreadID: cw.threadID, ExpectedStateVersion: snap.StateVersion}
	continuing := snap.LastRun != nil && (snap.LastRun.Status == chat.RunCancelled || snap.LastRun.Status == chat.RunFailed) && cw.r.Intn(2) == 0
	if !continuing {
		req.UserMessage = crashPrompts[cw.r.Intn(len(crashPrompts))]
	}
	ack, err := cw.api.StartRun(context.Background(), req)
	e, ok := cw.answered("run.start on "+cw.threadID, err)
	if !ok {
		return
	}
	if e != nil {
		cw.l.refused("run.start", e)
		switch c := e.Code; {
		case c == chat.CodeStateVersionConflict, c == chat.CodeRunAlreadyActive:
		case c == chat.CodeInvalidRequest && continuing: // nothing pending to continue
		default:
			cw.l.violate("run.start on %s at version %d: %d %v", cw.threadID, snap.StateVersion, e.Status, e)
		}
		return
	}
	if !strings.HasPrefix(ack.RunID, "run_") || ack.StateVersion <= snap.StateVersion {
		cw.l.violate("run.start ack %+v: want a run id and a state_version above %d", ack, snap.StateVersion)
	}
	cw.l.mu.Lock()
	cw.l.runs[ack.RunID] = cw.threadID
	if continuing {
		cw.l.continues++
	}
	cw.l.mu.Unlock()
	cw.w.waitEvents(1+cw.r.Intn(8), cw.stop)
}

func (cw *crashWorker) cancel(runID string, snap chat.Snapshot) {
	req := client.CancelRunRequest{RunID: runID}
	if cw.r.Intn(3) == 0 {
		req.ExpectedStateVersion = snap.StateVersion - 1 // a stale version never blocks a cancel
	}
	ack, err := cw.api.CancelRun(context.Background(), req)
	e, ok := cw.answered("cancel of "+runID, err)
	if !ok {
		return
	}
	if e != nil {
		cw.l.refused("run.cancel", e)
		if e.Code != chat.CodeRunNotActive {
			cw.l.violate("cancel of %s: %d %v, want 202 or run_not_active", runID, e.Status, e)
		}
		return
	}
	switch ack.Status {
	case chat.RunCancelRequested, chat.RunCancelling, chat.RunCancelled:
	default:
		cw.l.violate("cancel ack of %s: status %q: %+v", runID, ack.Status, ack)
	}
	cw.l.mu.Lock()
	cw.l.cancels[runID] = string(ack.Status)
	cw.l.mu.Unlock()
	cw.w.waitEvents(1+cw.r.Intn(4), cw.stop)
}

func (cw *crashWorker) decide(snap chat.Snapshot, confirm bool) {
	ops, err := cw.api.Operations(context.Background(), cw.threadID)
	if !cw.read("GET operations of "+cw.threadID, err) {
		return
	}
	for _, op := range ops {
		if op.Phase != "prepared" || op.RunID != snap.ActiveRun.RunID {
			continue
		}
		verb, decide := "reject", cw.api.RejectTool
		if confirm {
			verb, decide = "confirm", cw.api.ConfirmTool
		}
		ack, err := decide(context.Background(), op.OperationID, snap.StateVersion)
		e, ok := cw.answered(verb+" "+op.OperationID, err)
		if !ok {
			return
		}
		if e != nil {
			cw.l.refused("tool."+verb, e)
			if c := e.Code; c != chat.CodeStateVersionConflict && c != chat.CodeOperationNotPending {
				cw.l.violate("%s %s: %d %v", verb, op.OperationID, e.Status, e)
			}
			return
		}
		if ack.OperationID != op.OperationID || ack.Phase == "prepared" {
			cw.l.violate("%s ack of %s: %+v", verb, op.OperationID, ack)
		}
		cw.l.mu.Lock()
		if confirm {
			cw.l.confirms[op.OperationID] = op.RunID
		} else {
			cw.l.rejects[op.OperationID] = op.RunID
		}
		cw.l.mu.Unlock()
		cw.w.waitEvents(1+cw.r.Intn(6), cw.stop)
		return
	}
}

func (cw *crashWorker) fragment(snap chat.Snapshot) {
	msgID, lastSeq, content, known, ok := cw.w.pickFragment(cw.r)
	if !ok {
		cw.w.waitEvents(1+cw.r.Intn(4), cw.stop)
		return
	}
	ack, err := cw.api.SaveFragment(context.Background(), client.SaveFragmentRequest{ThreadID: cw.threadID,
		MessageID: msgID, LastSeq: lastSeq, ExpectedStateVersion: snap.StateVersion})
	e, ok := cw.answered("fragment.save of "+msgID, err)
	if !ok {
		return
	}
	if e != nil {
		cw.l.refused("fragment.save", e)
		if c := e.Code; c != chat.CodeStateVersionConflict && c != chat.CodeFragmentUnavailable {
			cw.l.violate("fragment.save of %s up to seq %d (seen by this client): %d %v", msgID, lastSeq, e.Status, e)
		}
		return
	}
	if !strings.HasPrefix(ack.MessageID, "msg_") || ack.MessageID == msgID {
		cw.l.violate("fragment.save ack %+v: want the fragment's own message id", ack)
	}
	cw.l.mu.Lock()
	cw.l.fragments[ack.MessageID] = fragmentRec{threadID: cw.threadID, streamed: msgID, lastSeq: lastSeq, content: content, contentKnown: known}
	cw.l.mu.Unlock()
}

// staleCommand sends a command at a version older than the snapshot's: it
// must be refused with 409 state_version_conflict and change nothing.
func (cw *crashWorker) staleCommand(snap chat.Snapshot) {
	if snap.StateVersion <= 1 {
		return
	}
	stale := snap.StateVersion - 1 - int64(cw.r.Intn(int(min(snap.StateVersion-1, 3))))
	cmd, send := "run.start", func() error {
		_, err := cw.api.StartRun(context.Background(), client.StartRunRequest{ThreadID: cw.threadID, ExpectedStateVersion: stale, UserMessage: "stale tab says hi"})
		return err
	}
	if msgID, lastSeq, _, _, ok := cw.w.pickFragment(cw.r); ok && cw.r.Intn(2) == 0 {
		cmd, send = "fragment.save", func() error {
			_, err := cw.api.SaveFragment(context.Background(), client.SaveFragmentRequest{ThreadID: cw.threadID, MessageID: msgID, LastSeq: lastSeq, ExpectedStateVersion: stale})
			return err
		}
	}
	err := send()
	e, ok := cw.answered("stale "+cmd, err)
	if !ok {
		return
	}
	if e == nil || e.Status != http.StatusConflict || e.Code != chat.CodeStateVersionConflict {
		cw.l.violate("stale %s (expected_state_version %d, thread at %d or later): %v, want 409 state_version_conflict", cmd, stale, snap.StateVersion, err)
		return
	}
	cw.l.mu.Lock()
	cw.l.stale++
	cw.l.mu.Unlock()
}

// ---------------------------------------------------------------------------
// The test.

// queueAdd queues a message behind the active run (one in four an
// interrupt, which cancels it), with a client_request_id.
func (cw *crashWorker) queueAdd(snap chat.Snapshot) {
	req := client.QueueAddRequest{ThreadID: cw.threadID, UserMessage: crashPrompts[cw.r.Intn(len(crashPrompts))],
		ClientRequestID: fmt.Sprintf("q-%d", cw.r.Int63())}
	if cw.r.Intn(4) == 0 {
		req.Mode = chat.QueueInterrupt
	}
	if cw.r.Intn(3) == 0 {
		v := snap.StateVersion
		req.ExpectedStateVersion = &v
	}
	ack, err := cw.api.QueueAdd(context.Background(), req)
	e, ok := cw.answered("queue.add on "+cw.threadID, err)
	if !ok {
		return
	}
	if e != nil {
		cw.l.refused("queue.add", e)
		ok := e.Code == chat.CodeStateVersionConflict && req.ExpectedStateVersion != nil ||
			e.Code == chat.CodeInvalidRequest && strings.Contains(e.Message, "the most it may")
		if !ok {
			cw.l.violate("queue.add on %s: %d %v", cw.threadID, e.Status, e)
		}
		return
	}
	if !strings.HasPrefix(ack.ItemID, chat.PrefixQueueItem) || ack.StateVersion < snap.StateVersion {
		cw.l.violate("queue.add ack %+v", ack)
	}
	cw.l.mu.Lock()
	cw.l.queued[ack.ItemID] = cw.threadID
	cw.l.queueOps["add:"+req.Mode]++
	if ack.Interrupted != "" {
		cw.l.cancels[ack.Interrupted] = "interrupted"
	}
	cw.l.mu.Unlock()
	cw.w.waitEvents(1+cw.r.Intn(4), cw.stop)
}

// queueRemove removes a waiting item, which may start or be removed by
// the other tab meanwhile (then not_found).
func (cw *crashWorker) queueRemove(snap chat.Snapshot) {
	item := snap.Queue.Items[cw.r.Intn(len(snap.Queue.Items))].ItemID
	_, err := cw.api.QueueRemove(context.Background(), client.QueueItemRequest{ThreadID: cw.threadID, ItemID: item})
	e, ok := cw.answered("queue.remove of "+item, err)
	if !ok {
		return
	}
	if e != nil {
		cw.l.refused("queue.remove", e)
		if e.Code != chat.CodeNotFound {
			cw.l.violate("queue.remove of %s: %d %v", item, e.Status, e)
		}
		return
	}
	cw.l.mu.Lock()
	cw.l.queueOps["remove"]++
	cw.l.mu.Unlock()
}

// resume resumes a paused queue.
func (cw *crashWorker) resume(snap chat.Snapshot) {
	v := snap.StateVersion
	_, err := cw.api.QueueResume(context.Background(), client.QueueItemRequest{ThreadID: cw.threadID, ExpectedStateVersion: &v})
	e, ok := cw.answered("queue.resume of "+cw.threadID, err)
	if !ok {
		return
	}
	if e != nil {
		cw.l.refused("queue.resume", e)
		if e.Code != chat.CodeStateVersionConflict {
			cw.l.violate("queue.resume of %s: %d %v", cw.threadID, e.Status, e)
		}
		return
	}
	cw.l.mu.Lock()
	cw.l.queueOps["resume"]++
	cw.l.mu.Unlock()
	cw.w.waitEvents(1+cw.r.Intn(4), cw.stop)
}
