package main

// The crash-restart test against the real binary: a seeded random workload
// over HTTP on a few threads (runs with search, email, card and plain
// prompts, cancels, confirms and rejects, fragment saves of streamed
// messages, continues from the saved point, stale commands), and a SIGKILL
// at a random moment of every cycle. After the last cycle the database is
// restarted without a kill, recovery settles, and the test asserts that
// every acknowledged command's effect survived, that no idempotency key was
// accepted twice by the email provider, that every thread's event log
// replays with seqs +1 each (and never rewrites a seq a client already saw),
// that no run is left non-terminal, and that `gateway check` is clean after
// every kill and at the end.
//
// Defaults fit CI (12 cycles, well under a minute on 2 cores). The long
// variant:
//
//	go test -race -count=1 -run TestBinaryCrashRestartRandom -crash.cycles=200 -v .
//
// A failure prints its seed; replay it with -crash.seed=N (the workload's
// random choices are the same; the exact interleaving with the server is
// not, since it runs in another process).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
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
// An HTTP client that reports errors instead of failing the test: commands
// race with the SIGKILL, and an unanswered command is simply not
// acknowledged.

var crashHTTP = &http.Client{Timeout: 10 * time.Second}

func crashCall(base, method, path string, body, out any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := crashHTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	if out != nil && resp.StatusCode/100 == 2 && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, raw, fmt.Errorf("decode %s %s answer: %v: %s", method, path, err, raw)
		}
	}
	return resp.StatusCode, raw, nil
}

func errorCode(raw []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(raw, &e)
	return e.Error
}

type crashSnapshot struct {
	ThreadID     string `json:"thread_id"`
	StateVersion int64  `json:"state_version"`
	LastSeq      int64  `json:"last_seq"`
	ActiveRun    *struct {
		RunID  string `json:"run_id"`
		Status string `json:"status"`
	} `json:"active_run"`
	LastRun *struct {
		RunID  string `json:"run_id"`
		Status string `json:"status"`
	} `json:"last_run"`
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
	continues  int
	stale      int
	codes      map[string]int // refusals by "command:code"
	violations []string
}

func newCrashLedger() *crashLedger {
	return &crashLedger{runs: map[string]string{}, cancels: map[string]string{}, fragments: map[string]fragmentRec{},
		confirms: map[string]string{}, rejects: map[string]string{}, codes: map[string]int{}}
}

func (l *crashLedger) violate(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.violations = append(l.violations, fmt.Sprintf(format, args...))
}

func (l *crashLedger) refused(cmd string, status int, raw []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.codes[fmt.Sprintf("%s:%d:%s", cmd, status, errorCode(raw))]++
}

// ---------------------------------------------------------------------------
// A watcher: one SSE stream per thread per cycle, from after_seq=0. It
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

func eventSignature(ev map[string]any) string {
	typ, _ := ev["type"].(string)
	runID, _ := ev["run_id"].(string)
	msgID, _ := ev["message_id"].(string)
	text, _ := ev["text"].(string)
	sv, _ := ev["state_version"].(float64)
	if m, ok := ev["message"].(map[string]any); ok {
		id, _ := m["message_id"].(string)
		msgID += "/" + id
	}
	return fmt.Sprintf("%s run=%s msg=%s sv=%d text=%q", typ, runID, msgID, int64(sv), text)
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

func startWatcher(ctx context.Context, base, threadID string, hist *threadHistory, l *crashLedger) (*watcher, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/api/threads/"+threadID+"/events?after_seq=0", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("event stream of %s: %s %s", threadID, resp.Status, b)
	}
	w := &watcher{threadID: threadID, hist: hist, ledger: l, done: make(chan struct{}),
		deltas: map[string][]seenDelta{}, notify: make(chan struct{})}
	go w.read(resp.Body)
	return w, nil
}

// readSSE calls fn with every event's data; it returns when the body ends
// or fn returns false.
func readSSE(body io.Reader, fn func(id, typ string, data []byte) bool) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	var id, typ string
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) > 0 && !fn(id, typ, []byte(strings.Join(data, "\n"))) {
				return nil
			}
			id, typ, data = "", "", nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id:"):
			id = strings.TrimSpace(strings.TrimPrefix(line, "id:"))
		case strings.HasPrefix(line, "event:"):
			typ = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	return sc.Err()
}

// checkEvent applies the per-event checks shared by the live watchers and
// the final replay: SSE framing, +1 seqs (a snapshot may only come first),
// a seq never renamed, invariant 4. prev is the last seq applied (-1 before
// the first event); it returns the new one.
// cancelled holds the runs whose run.cancelled this stream delivered.
func checkEvent(l *crashLedger, hist *threadHistory, cancelled map[string]bool, where, threadID string, prev int64, id, typ string, data []byte) (map[string]any, int64) {
	var ev map[string]any
	if err := json.Unmarshal(data, &ev); err != nil {
		l.violate("%s: event data is not JSON: %v: %s", where, err, data)
		return nil, prev
	}
	evType, _ := ev["type"].(string)
	seqF, _ := ev["seq"].(float64)
	seq := int64(seqF)
	if typ != evType || id != strconv.FormatInt(seq, 10) {
		l.violate("%s: SSE frame id %q event %q, data seq %d type %q", where, id, typ, seq, evType)
	}
	if tid, _ := ev["thread_id"].(string); tid != threadID {
		l.violate("%s: event %s seq %d has thread_id %q", where, evType, seq, tid)
	}
	if evType == "thread.snapshot" {
		if prev != -1 {
			l.violate("%s: thread.snapshot (seq %d) in the middle of the stream after seq %d", where, seq, prev)
		}
		return ev, seq
	}
	if want := prev + 1; prev == -1 && seq != 1 || prev != -1 && seq != want {
		l.violate("%s: event %s has seq %d after seq %d: a gap or a duplicate", where, evType, seq, prev)
	}
	sig := eventSignature(ev)
	runID, _ := ev["run_id"].(string)
	hist.mu.Lock()
	if old, ok := hist.sigs[seq]; ok && old != sig {
		l.violate("%s: seq %d was %s, now %s: a seq a client saw was reused", where, seq, old, sig)
	} else if !ok {
		hist.sigs[seq] = sig
	}
	hist.mu.Unlock()
	if runID != "" && cancelled[runID] && evType != "tool.updated" {
		l.violate("%s: run %s emitted %s (seq %d) after its run.cancelled", where, runID, evType, seq)
	}
	if evType == "run.cancelled" {
		cancelled[runID] = true
	}
	return ev, seq
}

func (w *watcher) read(body io.ReadCloser) {
	defer close(w.done)
	defer body.Close()
	prev := int64(-1)
	cancelled := map[string]bool{}
	_ = readSSE(body, func(id, typ string, data []byte) bool {
		ev, seq := checkEvent(w.ledger, w.hist, cancelled, "live "+w.threadID, w.threadID, prev, id, typ, data)
		if ev == nil {
			return false
		}
		w.mu.Lock()
		if ev["type"] == "thread.snapshot" {
			w.snapshot = true
		}
		if ev["type"] == "message.delta" {
			msgID, _ := ev["message_id"].(string)
			text, _ := ev["text"].(string)
			if _, ok := w.deltas[msgID]; !ok {
				w.order = append(w.order, msgID)
			}
			w.deltas[msgID] = append(w.deltas[msgID], seenDelta{seq: seq, text: text})
		}
		prev, w.lastSeq = seq, seq
		w.events++
		close(w.notify)
		w.notify = make(chan struct{})
		w.mu.Unlock()
		return true
	})
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
	base     string
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

// call is crashCall; a transport error while the server should be alive is
// a violation (it died on its own).
func (cw *crashWorker) call(method, path string, body, out any) (int, []byte, bool) {
	status, raw, err := crashCall(cw.base, method, path, body, out)
	if err != nil {
		if !cw.stopped() {
			cw.l.violate("%s %s failed while the server should be alive: %d %v", method, path, status, err)
		}
		return status, raw, false
	}
	if status >= 500 {
		cw.l.violate("%s %s: %d %s", method, path, status, raw)
	}
	return status, raw, true
}

func (cw *crashWorker) run() {
	for !cw.stopped() {
		var snap crashSnapshot
		status, raw, ok := cw.call("GET", "/api/threads/"+cw.threadID, nil, &snap)
		if !ok {
			return
		}
		if status != http.StatusOK {
			cw.l.violate("GET thread %s: %d %s", cw.threadID, status, raw)
			return
		}
		p := cw.r.Intn(100)
		switch {
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
func (cw *crashWorker) active(snap crashSnapshot, p int) {
	waiting := snap.ActiveRun.Status == "waiting_confirmation"
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
	default:
		cw.w.waitEvents(1+cw.r.Intn(12), cw.stop)
	}
}

func (cw *crashWorker) start(snap crashSnapshot) {
	body := map[string]any{"expected_state_version": snap.StateVersion}
	continuing := snap.LastRun != nil && (snap.LastRun.Status == "cancelled" || snap.LastRun.Status == "failed") && cw.r.Intn(2) == 0
	if !continuing {
		body["user_message"] = crashPrompts[cw.r.Intn(len(crashPrompts))]
	}
	var ack startAck
	status, raw, ok := cw.call("POST", "/api/threads/"+cw.threadID+"/runs", body, &ack)
	if !ok {
		return
	}
	if status != http.StatusCreated {
		cw.l.refused("run.start", status, raw)
		switch c := errorCode(raw); {
		case c == "state_version_conflict", c == "run_already_active":
		case c == "invalid_request" && continuing: // nothing pending to continue
		default:
			cw.l.violate("run.start on %s at version %d: %d %s", cw.threadID, snap.StateVersion, status, raw)
		}
		return
	}
	if !strings.HasPrefix(ack.RunID, "run_") || ack.StateVersion <= snap.StateVersion {
		cw.l.violate("run.start ack %s: want a run id and a state_version above %d", raw, snap.StateVersion)
	}
	cw.l.mu.Lock()
	cw.l.runs[ack.RunID] = cw.threadID
	if continuing {
		cw.l.continues++
	}
	cw.l.mu.Unlock()
	cw.w.waitEvents(1+cw.r.Intn(8), cw.stop)
}

func (cw *crashWorker) cancel(runID string, snap crashSnapshot) {
	body := map[string]any{}
	if cw.r.Intn(3) == 0 {
		body["expected_state_version"] = snap.StateVersion - 1 // a stale version never blocks a cancel
	}
	var ack cancelAck
	status, raw, ok := cw.call("POST", "/api/runs/"+runID+"/cancel", body, &ack)
	if !ok {
		return
	}
	if status != http.StatusAccepted {
		cw.l.refused("run.cancel", status, raw)
		if errorCode(raw) != "run_not_active" {
			cw.l.violate("cancel of %s: %d %s, want 202 or run_not_active", runID, status, raw)
		}
		return
	}
	switch ack.Status {
	case "cancel_requested", "cancelling", "cancelled":
	default:
		cw.l.violate("cancel ack of %s: status %q: %s", runID, ack.Status, raw)
	}
	cw.l.mu.Lock()
	cw.l.cancels[runID] = ack.Status
	cw.l.mu.Unlock()
	cw.w.waitEvents(1+cw.r.Intn(4), cw.stop)
}

func (cw *crashWorker) decide(snap crashSnapshot, confirm bool) {
	var ops struct {
		Operations []operation `json:"operations"`
	}
	status, raw, ok := cw.call("GET", "/api/threads/"+cw.threadID+"/operations", nil, &ops)
	if !ok {
		return
	}
	if status != http.StatusOK {
		cw.l.violate("GET operations of %s: %d %s", cw.threadID, status, raw)
		return
	}
	for _, op := range ops.Operations {
		if op.Phase != "prepared" || op.RunID != snap.ActiveRun.RunID {
			continue
		}
		verb := "reject"
		if confirm {
			verb = "confirm"
		}
		var ack struct {
			OperationID string `json:"operation_id"`
			Phase       string `json:"phase"`
		}
		status, raw, ok := cw.call("POST", "/api/operations/"+op.OperationID+"/"+verb, map[string]any{"expected_state_version": snap.StateVersion}, &ack)
		if !ok {
			return
		}
		if status != http.StatusOK {
			cw.l.refused("tool."+verb, status, raw)
			if c := errorCode(raw); c != "state_version_conflict" && c != "operation_not_pending" {
				cw.l.violate("%s %s: %d %s", verb, op.OperationID, status, raw)
			}
			return
		}
		if ack.OperationID != op.OperationID || ack.Phase == "prepared" {
			cw.l.violate("%s ack of %s: %s", verb, op.OperationID, raw)
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

func (cw *crashWorker) fragment(snap crashSnapshot) {
	msgID, lastSeq, content, known, ok := cw.w.pickFragment(cw.r)
	if !ok {
		cw.w.waitEvents(1+cw.r.Intn(4), cw.stop)
		return
	}
	var ack struct {
		MessageID    string `json:"message_id"`
		CheckpointID string `json:"checkpoint_id"`
		StateVersion int64  `json:"state_version"`
	}
	status, raw, ok := cw.call("POST", "/api/threads/"+cw.threadID+"/fragments", map[string]any{
		"message_id": msgID, "last_seq": lastSeq, "expected_state_version": snap.StateVersion,
	}, &ack)
	if !ok {
		return
	}
	if status != http.StatusCreated {
		cw.l.refused("fragment.save", status, raw)
		if c := errorCode(raw); c != "state_version_conflict" && c != "fragment_unavailable" {
			cw.l.violate("fragment.save of %s up to seq %d (seen by this client): %d %s", msgID, lastSeq, status, raw)
		}
		return
	}
	if !strings.HasPrefix(ack.MessageID, "msg_") || ack.MessageID == msgID {
		cw.l.violate("fragment.save ack %s: want the fragment's own message id", raw)
	}
	cw.l.mu.Lock()
	cw.l.fragments[ack.MessageID] = fragmentRec{threadID: cw.threadID, streamed: msgID, lastSeq: lastSeq, content: content, contentKnown: known}
	cw.l.mu.Unlock()
}

// staleCommand sends a command at a version older than the snapshot's: it
// must be refused with 409 state_version_conflict and change nothing.
func (cw *crashWorker) staleCommand(snap crashSnapshot) {
	if snap.StateVersion <= 1 {
		return
	}
	stale := snap.StateVersion - 1 - int64(cw.r.Intn(int(min(snap.StateVersion-1, 3))))
	path, body, cmd := "/api/threads/"+cw.threadID+"/runs", map[string]any{"expected_state_version": stale, "user_message": "stale tab says hi"}, "run.start"
	if msgID, lastSeq, _, _, ok := cw.w.pickFragment(cw.r); ok && cw.r.Intn(2) == 0 {
		path, body, cmd = "/api/threads/"+cw.threadID+"/fragments", map[string]any{"message_id": msgID, "last_seq": lastSeq, "expected_state_version": stale}, "fragment.save"
	}
	status, raw, ok := cw.call("POST", path, body, nil)
	if !ok {
		return
	}
	if status != http.StatusConflict || errorCode(raw) != "state_version_conflict" {
		cw.l.violate("stale %s (expected_state_version %d, thread at %d or later): %d %s, want 409 state_version_conflict", cmd, stale, snap.StateVersion, status, raw)
		return
	}
	cw.l.mu.Lock()
	cw.l.stale++
	cw.l.mu.Unlock()
}

// ---------------------------------------------------------------------------
// The test.

func TestBinaryCrashRestartRandom(t *testing.T) {
	seed := *crashSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	cycles := *crashCycles
	t.Logf("crash-restart: seed %d, %d cycles (replay with -crash.seed=%d -crash.cycles=%d)", seed, cycles, seed, cycles)
	rng := rand.New(rand.NewSource(seed))
	defer func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: replay with -run TestBinaryCrashRestartRandom -crash.seed=%d -crash.cycles=%d", seed, seed, cycles)
		}
	}()

	db := filepath.Join(t.TempDir(), "gw.db")
	l := newCrashLedger()
	flags := []string{"-outbox-latency", "30ms", "-search-latency", "30ms"}
	pace := func() string { return fmt.Sprintf("%dms", 10+rng.Intn(11)) }

	// A few threads, each driven by two tabs that race each other (stale
	// versions, run_already_active, operation_not_pending).
	const nThreads, tabsPerThread = 3, 2
	var threads []string
	hists := map[string]*threadHistory{}
	kills := 0

	for cycle := range cycles {
		srv := startServerWith(t, db, pace(), flags...)
		if cycle == 0 {
			for range nThreads {
				id := srv.createThread().ThreadID
				threads = append(threads, id)
				hists[id] = &threadHistory{sigs: map[int64]string{}}
			}
		}
		ctx, cancelWatch := context.WithCancel(context.Background())
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var watchers []*watcher
		for _, tid := range threads {
			w, err := startWatcher(ctx, srv.base, tid, hists[tid], l)
			if err != nil {
				cancelWatch()
				t.Fatalf("cycle %d: %v", cycle, err)
			}
			watchers = append(watchers, w)
			for range tabsPerThread {
				cw := &crashWorker{base: srv.base, threadID: tid, r: rand.New(rand.NewSource(rng.Int63())), w: w, l: l, stop: stop}
				wg.Add(1)
				go func() {
					defer wg.Done()
					cw.run()
				}()
			}
		}
		// The one timer that is not a synchronisation: when to kill.
		delay := 150*time.Millisecond + time.Duration(rng.Int63n(int64(2500*time.Millisecond)))
		kill := time.NewTimer(delay)
		select {
		case <-kill.C:
		case <-srv.exited:
			l.violate("cycle %d: the gateway exited on its own (%v)", cycle, srv.waitErr)
		}
		close(stop)
		srv.kill()
		kills++
		wg.Wait()
		cancelWatch()
		for _, w := range watchers {
			<-w.done
		}
		checkDB(t, db) // the invariants hold whenever the process dies
		if len(l.violations) > 0 {
			t.Fatalf("cycle %d (killed after %v): violations:\n%s", cycle, delay, strings.Join(l.violations, "\n"))
		}
	}

	// The last restart: no kill; recovery settles.
	srv := startServerWith(t, db, pace(), flags...)
	audit := auditDB(t, db)
	defer audit.Close()
	var allRuns []string
	rows, err := audit.Query(`SELECT run_id FROM runs ORDER BY created_at`)
	if err != nil {
		t.Fatalf("list runs: %v", err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		allRuns = append(allRuns, id)
	}
	rows.Close()
	for id := range l.runs {
		if !containsStr(allRuns, id) {
			l.violate("acknowledged run.start %s has no row", id)
		}
	}

	status := map[string]runInfo{}
	settle := func() {
		deadline := time.Now().Add(45 * time.Second)
		for _, id := range allRuns {
			for {
				var r runInfo
				code, raw, err := crashCall(srv.base, "GET", "/api/runs/"+id, nil, &r)
				if err != nil || code != http.StatusOK {
					t.Fatalf("GET /api/runs/%s: %d %s %v", id, code, raw, err)
				}
				status[id] = r
				if isTerminal(r.Status) || r.Status == "waiting_confirmation" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("run %s is still %s 45s after the restart", id, r.Status)
				}
				time.Sleep(25 * time.Millisecond) // bounded poll: recovery has no event to wait on over this API
			}
		}
	}
	settledWaiting := 0
	for round := 0; ; round++ {
		settle()
		var waiting []runInfo
		for _, id := range allRuns {
			if r := status[id]; r.Status == "waiting_confirmation" {
				waiting = append(waiting, r)
			}
		}
		if len(waiting) == 0 {
			break
		}
		if round == 5 {
			t.Fatalf("runs still waiting for a confirmation after %d rounds of rejects/cancels: %+v", round, waiting)
		}
		for _, r := range waiting {
			settledWaiting++
			if rng.Intn(2) == 0 {
				if code, raw, err := crashCall(srv.base, "POST", "/api/runs/"+r.RunID+"/cancel", map[string]any{}, nil); err != nil || code != http.StatusAccepted {
					t.Fatalf("cancel waiting run %s: %d %s %v", r.RunID, code, raw, err)
				}
				l.mu.Lock()
				l.cancels[r.RunID] = "settle"
				l.mu.Unlock()
				continue
			}
			var ops struct {
				Operations []operation `json:"operations"`
			}
			var snap crashSnapshot
			crashCall(srv.base, "GET", "/api/threads/"+r.ThreadID, nil, &snap)
			crashCall(srv.base, "GET", "/api/threads/"+r.ThreadID+"/operations", nil, &ops)
			for _, op := range ops.Operations {
				if op.RunID == r.RunID && op.Phase == "prepared" {
					code, raw, err := crashCall(srv.base, "POST", "/api/operations/"+op.OperationID+"/reject", map[string]any{"expected_state_version": snap.StateVersion}, nil)
					if err != nil || code != http.StatusOK {
						t.Fatalf("reject %s of waiting run %s: %d %s %v", op.OperationID, r.RunID, code, raw, err)
					}
					l.mu.Lock()
					l.rejects[op.OperationID] = r.RunID
					l.mu.Unlock()
				}
			}
		}
	}

	// Every run terminal; every acknowledged command's effect present.
	completed, cancelled, failed := 0, 0, 0
	for _, id := range allRuns {
		switch r := status[id]; r.Status {
		case "completed":
			completed++
		case "cancelled":
			cancelled++
		case "failed":
			failed++
		default:
			l.violate("run %s left %s after recovery settled", id, r.Status)
		}
	}
	for id, ackStatus := range l.cancels {
		if r := status[id]; r.Status != "cancelled" {
			l.violate("run %s: cancel acknowledged (%s), but it ended %s", id, ackStatus, r.Status)
		}
	}
	for id, f := range l.fragments {
		var kind, content, thread string
		if err := audit.QueryRow(`SELECT kind, content, thread_id FROM messages WHERE message_id = ?`, id).Scan(&kind, &content, &thread); err != nil {
			l.violate("acknowledged fragment %s (of %s up to seq %d): %v", id, f.streamed, f.lastSeq, err)
			continue
		}
		if kind != "fragment" || thread != f.threadID {
			l.violate("acknowledged fragment %s is kind %s in thread %s", id, kind, thread)
		}
		if f.contentKnown && content != f.content {
			l.violate("fragment %s of %s up to seq %d holds %q, but the deltas this client displayed were %q", id, f.streamed, f.lastSeq, content, f.content)
		}
	}
	for verb, m := range map[string]map[string]string{"confirm": l.confirms, "reject": l.rejects} {
		for op := range m {
			phase := queryString(t, audit, `SELECT phase FROM operations WHERE operation_id = ?`, op)
			if phase == "prepared" {
				l.violate("operation %s: %s acknowledged, but it is still prepared", op, verb)
			}
			if verb == "reject" && phase != "rejected" {
				l.violate("operation %s: reject acknowledged, but its phase is %s", op, phase)
			}
		}
	}

	// No duplicate external action.
	dups, err := audit.Query(`SELECT idempotency_key, COUNT(*) FROM outbox_attempts WHERE result = 'accepted' GROUP BY 1 HAVING COUNT(*) > 1`)
	if err != nil {
		t.Fatalf("outbox audit: %v", err)
	}
	for dups.Next() {
		var key string
		var n int
		if err := dups.Scan(&key, &n); err != nil {
			t.Fatal(err)
		}
		l.violate("the email provider accepted key %s %d times", key, n)
	}
	dups.Close()
	sent := queryInt(t, audit, `SELECT COUNT(*) FROM outbox_attempts WHERE result = 'accepted'`)
	retried := queryInt(t, audit, `SELECT COUNT(*) FROM runs WHERE attempt > 1`)
	opsByPhase := map[string]int{}
	prow, err := audit.Query(`SELECT phase, COUNT(*) FROM operations GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for prow.Next() {
		var ph string
		var n int
		if err := prow.Scan(&ph, &n); err != nil {
			t.Fatal(err)
		}
		opsByPhase[ph] = n
	}
	prow.Close()

	// Every thread replays from seq 0 with +1 seqs, renaming no seq a
	// client saw, one terminal event per run, one message.published per
	// message.
	for _, tid := range threads {
		replayThread(t, l, srv.base, tid, hists[tid])
	}

	srv.stop()
	checkDB(t, db)

	l.mu.Lock()
	defer l.mu.Unlock()
	var codes []string
	for c, n := range l.codes {
		codes = append(codes, fmt.Sprintf("%s=%d", c, n))
	}
	sort.Strings(codes)
	t.Logf("refusals (command:status:code): %s", strings.Join(codes, " "))
	t.Logf("operations by phase: %v; emails accepted by the provider: %d", opsByPhase, sent)
	t.Logf("crash-restart summary: seed=%d cycles=%d kills=%d threads=%d tabs=%d runs=%d (acked run.start %d, continues %d; completed %d cancelled %d failed %d; re-run after a kill %d) cancels=%d confirms=%d rejects=%d fragments=%d stale409=%d settled_waiting=%d violations=%d",
		seed, cycles, kills, len(threads), len(threads)*tabsPerThread, len(allRuns), len(l.runs), l.continues, completed, cancelled, failed, retried,
		len(l.cancels), len(l.confirms), len(l.rejects), len(l.fragments), l.stale, settledWaiting, len(l.violations))
	if len(l.violations) > 0 {
		t.Errorf("%d violations:\n%s", len(l.violations), strings.Join(l.violations, "\n"))
	}
}

func isTerminal(status string) bool {
	return status == "completed" || status == "failed" || status == "cancelled"
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// replayThread reads GET /api/threads/{id}/events?after_seq=0 up to the
// thread's last seq and checks it.
func replayThread(t *testing.T, l *crashLedger, base, threadID string, hist *threadHistory) {
	t.Helper()
	var snap crashSnapshot
	if code, raw, err := crashCall(base, "GET", "/api/threads/"+threadID, nil, &snap); err != nil || code != http.StatusOK {
		t.Fatalf("GET thread %s: %d %s %v", threadID, code, raw, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/api/threads/"+threadID+"/events?after_seq=0", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("replay %s: %v", threadID, err)
	}
	defer resp.Body.Close()
	cancelled := map[string]bool{}
	prev := int64(-1)
	terminal := map[string]int{}
	published := map[string]int{}
	_ = readSSE(resp.Body, func(id, typ string, data []byte) bool {
		ev, seq := checkEvent(l, hist, cancelled, "replay "+threadID, threadID, prev, id, typ, data)
		if ev == nil {
			return false
		}
		prev = seq
		runID, _ := ev["run_id"].(string)
		switch ev["type"] {
		case "run.completed", "run.failed", "run.cancelled":
			terminal[runID]++
		case "message.published":
			if m, ok := ev["message"].(map[string]any); ok {
				id, _ := m["message_id"].(string)
				published[id]++
			}
		}
		return seq < snap.LastSeq
	})
	if prev != snap.LastSeq {
		l.violate("replay %s ended at seq %d, the thread's last_seq is %d", threadID, prev, snap.LastSeq)
	}
	for run, n := range terminal {
		if n != 1 {
			l.violate("replay %s: run %s has %d terminal events", threadID, run, n)
		}
	}
	for msg, n := range published {
		if n != 1 {
			l.violate("replay %s: message %s published %d times", threadID, msg, n)
		}
	}
}
