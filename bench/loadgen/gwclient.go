package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// gwEnv is what every gateway client of one scenario shares.
type gwEnv struct {
	base      string   // http://127.0.0.1:PORT: threads are created here
	bases     []string // every instance's base; tab k of thread i dials bases[(i+k) % len]
	auth      string   // "header" (a user per thread) or "none"
	scenario  string
	errs      *errorLog
	http      *http.Client
	dialSem   chan struct{} // bounds concurrent dials
	measuring atomic.Bool   // latency samples are taken while true
	start     time.Time     // monotonic base of spread measurements
}

func newGWEnv(base, auth, scenario string) *gwEnv {
	return &gwEnv{
		base: base, bases: []string{base}, auth: auth, scenario: scenario, errs: newErrorLog(),
		http:    &http.Client{Timeout: 30 * time.Second},
		dialSem: make(chan struct{}, 32), start: time.Now(),
	}
}

// tabInstance is the instance (index into bases) that tab k of thread idx
// connects to: a thread's tabs alternate over the instances, and so do
// the threads' tab 0 (the tab that starts runs).
func tabInstance(idx, k, instances int) int {
	if instances <= 1 {
		return 0
	}
	return (idx + k) % instances
}

// authHeader is how a client names its user: in -auth header mode the
// gateway believes X-Forwarded-User from 127.0.0.1.
func (e *gwEnv) header(user string) http.Header {
	h := http.Header{}
	if e.auth == "header" {
		h.Set("X-Forwarded-User", user)
	}
	return h
}

// threadInfo is the part of a snapshot the generator needs.
type threadInfo struct {
	ThreadID     string `json:"thread_id"`
	StateVersion int64  `json:"state_version"`
	LastSeq      int64  `json:"last_seq"`
}

func (e *gwEnv) do(ctx context.Context, method, path, user string, body any, want int, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.base+path, rd)
	if err != nil {
		return err
	}
	req.Header = e.header(user)
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	return json.Unmarshal(data, out)
}

// createThreads creates n threads over HTTP, one user per thread in header
// mode, a few requests at a time.
func (e *gwEnv) createThreads(ctx context.Context, n int) ([]*gwThread, error) {
	threads := make([]*gwThread, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := atomic.Int64{}
	for range min(n, 8) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				user := fmt.Sprintf("bench-%s-%d", e.scenario, i)
				var info threadInfo
				err := e.do(ctx, http.MethodPost, "/api/threads", user, map[string]string{"title": fmt.Sprintf("bench %s %d", e.scenario, i)}, http.StatusCreated, &info)
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				threads[i] = &gwThread{env: e, idx: i, id: info.ThreadID, user: user, version: info.StateVersion,
					createdSeq: info.LastSeq, notes: make(chan note, 256)}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return nil, fmt.Errorf("create threads: %w", first)
	}
	return threads, nil
}

// lastSeq asks the server for a thread's last seq.
func (e *gwEnv) lastSeq(ctx context.Context, th *gwThread) (int64, error) {
	var info threadInfo
	err := e.do(ctx, http.MethodGet, "/api/threads/"+th.id, th.user, nil, http.StatusOK, &info)
	return info.LastSeq, err
}

// gwThread is one conversation and the tabs that watch it. Its driver
// (one goroutine of the scenario) starts and cancels runs through its
// tabs; the tabs' readers tell it what happened through notes.
type gwThread struct {
	env        *gwEnv
	idx        int
	id, user   string
	version    int64 // the state_version the driver knows (driver-owned after setup)
	createdSeq int64
	tabs       []*gwTab
	notes      chan note

	// fan-out spread: when the first tab of this thread received a seq
	spreadMu sync.Mutex
	ring     [spreadRing]struct{ seq, at int64 }

	// counted by tab 0 while measuring
	deltasProduced atomic.Int64
	deltaBytes     atomic.Int64
}

const spreadRing = 1024

// spread records that a tab received seq at (µs since env.start) and
// returns how long after the thread's first receipt of seq that was.
func (th *gwThread) spread(seq, at int64) int64 {
	return spreadOf(&th.spreadMu, &th.ring, seq, at)
}

func spreadOf(mu *sync.Mutex, ring *[spreadRing]struct{ seq, at int64 }, seq, at int64) int64 {
	mu.Lock()
	defer mu.Unlock()
	s := &ring[seq%spreadRing]
	if s.seq != seq {
		s.seq, s.at = seq, at
		return 0
	}
	return at - s.at
}

// note tells a thread's driver about an event one of its tabs received.
type note struct {
	tab          int
	typ          string // an event type, or noteFirstDelta
	runID        string
	stateVersion int64
	at           time.Time
}

const noteFirstDelta = "first-delta"

// gwTab is one WebSocket client watching one thread. Its goroutine (run)
// dials, says hello, subscribes, and reads until the scenario ends; a tab
// with a planned drop closes its connection once and resubscribes with
// after_seq. Commands sent by the driver (do) are answered through the
// pending map.
type gwTab struct {
	th    *gwThread
	k     int  // index among the thread's tabs; tab 0 is the driver's
	inst  int  // index of the instance it connects to (env.bases)
	notes bool // send run notes to the driver
	tabID string

	dropMu   sync.Mutex
	dropConn *websocket.Conn // the connection drop ends
	dropping atomic.Bool     // the current connection ends by drop

	conn    atomic.Pointer[websocket.Conn]
	nextID  atomic.Int64
	pmu     sync.Mutex
	pending map[string]chan reply

	ready     chan struct{} // closed at the first subscribe ack
	readyOnce sync.Once

	lastSeqA             atomic.Int64 // mirror of lastSeq for the scenario
	deliveries, deltas   atomic.Int64 // events received
	reconnects, resyncs  atomic.Int64
	replayed, unexpected atomic.Int64

	// owned by the tab's goroutine
	lastSeq       int64
	liveAfter     int64 // events with seq <= liveAfter are a replay
	subID         string
	helloID       string
	subscribed    bool
	cancelled     map[string]bool
	lastDeltaRun  string
	lastDeltaAt   time.Time
	lat, spreadUs samples
	publishUs     samples
}

type reply struct {
	msg wireMsg
	at  time.Time
}

func newGWTab(th *gwThread, k int) *gwTab {
	t := &gwTab{th: th, k: k, inst: tabInstance(th.idx, k, len(th.env.bases)), tabID: fmt.Sprintf("bench.%s.%d.%d", th.env.scenario, th.idx, k),
		pending: map[string]chan reply{}, ready: make(chan struct{}), cancelled: map[string]bool{},
		lastSeq: th.createdSeq}
	t.lastSeqA.Store(th.createdSeq)
	return t
}

// maxConnects bounds one tab's connections (the first, a planned drop,
// and recoveries from unexpected closes).
const maxConnects = 4

// maxFrames bounds the frames one connection reads.
const maxFrames = 50_000_000

// run serves the tab until ctx ends.
func (t *gwTab) run(ctx context.Context) {
	e := t.th.env
	for attempt := 0; attempt < maxConnects && ctx.Err() == nil; attempt++ {
		planned, err := t.session(ctx, attempt)
		if ctx.Err() != nil {
			return
		}
		if planned {
			t.reconnects.Add(1)
			continue
		}
		kind := "connection_lost"
		if code := websocket.CloseStatus(err); code != -1 {
			kind = "close_" + strconv.Itoa(int(code))
		} else if strings.Contains(fmt.Sprint(err), "dial") {
			kind = "dial"
		}
		e.errs.add(kind, fmt.Sprintf("tab %s: %v", t.tabID, err))
		t.unexpected.Add(1)
		select { // a short pause before resubscribing, as a client would
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// session runs one connection. It reports planned = true when it ended
// because of the tab's planned drop.
func (t *gwTab) session(ctx context.Context, attempt int) (planned bool, err error) {
	e := t.th.env
	select {
	case e.dialSem <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	dialCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	conn, _, err := websocket.Dial(dialCtx, "ws"+strings.TrimPrefix(e.bases[t.inst], "http")+"/ws", &websocket.DialOptions{
		HTTPHeader: e.header(t.th.user), CompressionMode: websocket.CompressionDisabled,
	})
	cancel()
	<-e.dialSem
	if err != nil {
		return false, fmt.Errorf("dial: %w", err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(16 << 20)
	t.conn.Store(conn)
	defer t.conn.Store(nil)

	t.subscribed = false
	t.helloID, t.subID = fmt.Sprintf("h%d", attempt), fmt.Sprintf("s%d", attempt)
	for _, cmd := range []map[string]any{
		{"type": "hello", "id": t.helloID, "tab_id": t.tabID},
		{"type": "subscribe", "id": t.subID, "thread_id": t.th.id, "after_seq": t.lastSeq},
	} {
		b, _ := json.Marshal(cmd)
		if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
			return false, err
		}
	}

	// Reads take no context (one registration per read costs the generator
	// CPU it shares with the server): the end of ctx, or a drop, closes the
	// connection instead, which ends the read.
	defer closeOnDone(ctx, conn)()
	t.dropMu.Lock()
	t.dropConn = conn
	t.dropMu.Unlock()
	defer func() {
		t.dropMu.Lock()
		t.dropConn = nil
		t.dropMu.Unlock()
	}()
	var buf bytes.Buffer
	for range maxFrames {
		_, rd, err := conn.Reader(context.Background())
		if err == nil {
			buf.Reset()
			_, err = buf.ReadFrom(rd)
		}
		if err != nil {
			if t.dropping.Swap(false) && ctx.Err() == nil {
				return true, nil
			}
			return false, err
		}
		now := time.Now()
		splitFrame(buf.Bytes(), func(obj []byte) { t.handle(obj, now) })
	}
	return false, errors.New("frame bound reached")
}

// drop ends the tab's connection abruptly, as a lost network would; the
// tab reconnects and resubscribes with after_seq. It reports whether there
// was a connection to drop.
func (t *gwTab) drop() bool {
	t.dropMu.Lock()
	defer t.dropMu.Unlock()
	if t.dropConn == nil {
		return false
	}
	t.dropping.Store(true)
	t.dropConn.CloseNow()
	return true
}

// closeOnDone closes conn when ctx ends; the returned function stops that
// and waits for a close already under way.
func closeOnDone(ctx context.Context, conn *websocket.Conn) (stop func()) {
	closed := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		defer close(closed)
		conn.CloseNow()
	})
	return func() {
		if !stopAfter() {
			<-closed
		}
	}
}

// handle applies one server object.
func (t *gwTab) handle(obj []byte, now time.Time) {
	e := t.th.env
	var m wireMsg
	if err := decodeMsg(obj, &m); err != nil {
		e.errs.add("bad_json", fmt.Sprintf("%v: %.200s", err, obj))
		return
	}
	switch m.Type {
	case typeAck, typeError:
		t.answer(&m, obj, now)
		return
	case typeSnapshot:
		if m.ThreadID != t.th.id {
			e.errs.add("foreign_thread", fmt.Sprintf("%.200s", obj))
			return
		}
		t.lastSeq = m.Seq
		t.lastSeqA.Store(m.Seq)
		t.resyncs.Add(1)
		return
	}
	if !t.subscribed {
		e.errs.add("event_before_subscribe_ack", fmt.Sprintf("%.200s", obj))
	}
	if m.ThreadID != t.th.id {
		e.errs.add("foreign_thread", fmt.Sprintf("%.200s", obj))
		return
	}
	switch {
	case m.Seq == t.lastSeq+1:
	case m.Seq <= t.lastSeq:
		e.errs.add("seq_duplicate", fmt.Sprintf("tab %s: seq %d after %d", t.tabID, m.Seq, t.lastSeq))
		return
	default:
		e.errs.add("seq_gap", fmt.Sprintf("tab %s: seq %d after %d", t.tabID, m.Seq, t.lastSeq))
	}
	t.lastSeq = m.Seq
	t.lastSeqA.Store(m.Seq)
	t.deliveries.Add(1)
	if m.RunID != "" && t.cancelled[m.RunID] && m.Type != typeToolUpdated {
		e.errs.add("event_after_run_cancelled", fmt.Sprintf("tab %s: %s seq %d of %s", t.tabID, m.Type, m.Seq, m.RunID))
	}
	live := m.Seq > t.liveAfter
	if !live {
		t.replayed.Add(1)
	}
	switch m.Type {
	case typeDelta:
		t.deltas.Add(1)
		if live && e.measuring.Load() {
			t.lat.add(now.UnixMicro() - m.TS*1000)
			t.spreadUs.add(t.th.spread(m.Seq, now.Sub(e.start).Microseconds()))
			if t.k == 0 {
				t.th.deltasProduced.Add(1)
				t.th.deltaBytes.Add(int64(len(obj)))
			}
		}
		if t.k == 0 {
			if m.RunID != t.lastDeltaRun && t.notes {
				t.note(note{tab: t.k, typ: noteFirstDelta, runID: m.RunID, at: now})
			}
			t.lastDeltaRun, t.lastDeltaAt = m.RunID, now
		}
	case typePublished:
		if t.k == 0 && m.RunID != "" && m.RunID == t.lastDeltaRun && !t.lastDeltaAt.IsZero() {
			if live && e.measuring.Load() {
				t.publishUs.add(now.Sub(t.lastDeltaAt).Microseconds())
			}
			t.lastDeltaAt = time.Time{}
		}
	case typeRunCancelled:
		t.cancelled[m.RunID] = true
		if t.notes {
			t.note(note{tab: t.k, typ: m.Type, runID: m.RunID, stateVersion: m.StateVersion, at: now})
		}
	case typeRunFailed:
		e.errs.add("run_failed", fmt.Sprintf("%.300s", obj))
		if t.notes {
			t.note(note{tab: t.k, typ: m.Type, runID: m.RunID, stateVersion: m.StateVersion, at: now})
		}
	case typeRunCompleted:
		if t.notes {
			t.note(note{tab: t.k, typ: m.Type, runID: m.RunID, stateVersion: m.StateVersion, at: now})
		}
	}
}

// answer routes an ack or error to its command.
func (t *gwTab) answer(m *wireMsg, obj []byte, now time.Time) {
	e := t.th.env
	switch m.Re {
	case t.helloID:
		if m.Type == typeError {
			e.errs.add("hello_"+m.Error, fmt.Sprintf("%.200s", obj))
		}
		return
	case t.subID:
		if m.Type == typeError {
			e.errs.add("subscribe_"+m.Error, fmt.Sprintf("%.200s", obj))
			return
		}
		t.subscribed = true
		t.liveAfter = m.LastSeq
		t.readyOnce.Do(func() { close(t.ready) })
		return
	}
	t.pmu.Lock()
	ch := t.pending[m.Re]
	delete(t.pending, m.Re)
	t.pmu.Unlock()
	if ch != nil {
		ch <- reply{msg: *m, at: now}
		return
	}
	e.errs.add("unexpected_"+m.Type, fmt.Sprintf("%.200s", obj))
}

func (t *gwTab) note(n note) {
	select {
	case t.th.notes <- n:
	default:
		t.th.env.errs.add("note_overflow", "")
	}
}

// commandTimeout bounds the wait for one command's answer.
const commandTimeout = 10 * time.Second

// do sends a command on the tab's connection and waits for its answer. It
// returns the answer, when the command was sent, and an error when none
// came (an error frame is an answer: the caller judges it).
func (t *gwTab) do(ctx context.Context, cmd map[string]any) (reply, time.Time, error) {
	conn := t.conn.Load()
	if conn == nil {
		return reply{}, time.Time{}, errors.New("not connected")
	}
	id := "c" + strconv.FormatInt(t.nextID.Add(1), 10)
	cmd["id"] = id
	b, err := json.Marshal(cmd)
	if err != nil {
		return reply{}, time.Time{}, err
	}
	ch := make(chan reply, 1)
	t.pmu.Lock()
	t.pending[id] = ch
	t.pmu.Unlock()
	forget := func() {
		t.pmu.Lock()
		delete(t.pending, id)
		t.pmu.Unlock()
	}
	sent := time.Now()
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		forget()
		return reply{}, sent, err
	}
	timer := time.NewTimer(commandTimeout)
	defer timer.Stop()
	select {
	case r := <-ch:
		return r, sent, nil
	case <-timer.C:
		forget()
		return reply{}, sent, fmt.Errorf("%s: no answer within %s", cmd["type"], commandTimeout)
	case <-ctx.Done():
		forget()
		return reply{}, sent, ctx.Err()
	}
}
