package gateway_test

// WebSocket clients that fall behind: lost events, stalled readers and
// stuck writers are closed or dropped; subscriptions, replays and
// resubscribes stay bounded.

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
)

// When the bus reports events of a thread lost for good (neither NATS nor
// the event log holds them), the connection closes like one that missed an
// event, and the page starts over from after_seq.
func TestWSLostEventsCloseTheConnection(t *testing.T) {
	t.Parallel()
	spy := &feedSpy{}
	h := newHarness(t, 0, withFeedSpy(spy))
	th := h.createThread("").ThreadID
	other := h.createThread("").ThreadID
	a := h.dial(t)
	a.subscribe(th, wsAfter(0))
	sinks := spy.added(th)
	if len(sinks) != 1 {
		t.Fatalf("%d sinks added for the thread, want the connection's one", len(sinks))
	}
	lossAware, ok := sinks[0].(bus.LossAware)
	if !ok {
		t.Fatal("a WebSocket connection is not bus.LossAware: a bus could not tell it about lost events")
	}
	if lossAware.Lost(other, 1) { // a thread it does not watch: nothing happens
		t.Error("a connection kept a thread it does not watch")
	}
	a.subscribe(other, wsAfter(0))
	// Seqs it already has (it caught up from the log before the bus gave
	// them up): it misses nothing and stays.
	last := h.snapshot(th).LastSeq
	if !lossAware.Lost(th, last) {
		t.Errorf("a connection that has every seq through %d was dropped for losing them", last)
	}
	a.subscribe(th, nil) // still open: it answers
	if lossAware.Lost(th, last+3) {
		t.Error("a connection that misses seqs stays subscribed")
	}
	ce := a.closed()
	if ce.Code != websocket.StatusTryAgainLater || !strings.Contains(ce.Reason, "after_seq") {
		t.Errorf("closed with %d %q, want 1013 and a reason naming after_seq", ce.Code, ce.Reason)
	}
}

// A loss the bus reports while a subscribe is still catching up (another
// instance gave seqs up between the connection's Add and its read of the
// log) is judged by what the catch-up brings: a connection whose catch-up
// reaches past the loss stays, one left short of it is closed like one
// that missed an event.
func TestWSLossDuringSubscribeIsJudgedByTheCatchUp(t *testing.T) {
	t.Parallel()
	spy := &feedSpy{}
	var through atomic.Int64 // what the bus reports lost at the next Add
	spy.onAdd = func(threadID string, sink chat.EventSink) {
		if la, ok := sink.(bus.LossAware); ok && !la.Lost(threadID, through.Load()) {
			t.Error("a subscribing connection was dropped before its catch-up said what it has")
		}
	}
	h := newHarness(t, 0, withFeedSpy(spy))
	th := h.createThread("").ThreadID
	last := h.snapshot(th).LastSeq
	through.Store(last)
	a := h.dial(t)
	a.subscribe(th, wsAfter(0)) // the catch-up brings every seq through last
	a.subscribe(th, nil)        // still open: it answers
	through.Store(last + 3)
	a.post(map[string]any{"type": "subscribe", "thread_id": th, "after_seq": int64(0)})
	ce := a.closed()
	if ce.Code != websocket.StatusTryAgainLater || !strings.Contains(ce.Reason, "after_seq") {
		t.Errorf("closed with %d %q, want 1013 and a reason naming after_seq", ce.Code, ce.Reason)
	}
}

// TestWSStalledClientIsClosed: a client that stops reading is closed with
// 1013 and a reason that says to resubscribe with after_seq, while the
// other tabs on the thread keep up and receive everything. What the
// stalled client did receive is a gap-free prefix, and after_seq recovers
// exactly the rest.
func TestWSStalledClientIsClosed(t *testing.T) {
	t.Parallel()
	const queue = 32 << 10
	ml := newMetricsLog()
	h := newHarness(t, 0, withWS(gateway.WSConfig{QueueBytes: queue, StuckWrite: time.Minute}), withMetrics(ml))
	snap := h.createThread("")
	th := snap.ThreadID
	s := h.dialStalled(t)
	s.post(map[string]any{"type": "subscribe", "thread_id": th, "after_seq": int64(0)}) // and never reads again
	a, b := h.dial(t), h.dial(t)
	a.subscribe(th, wsAfter(0))
	b.subscribe(th, wsAfter(0))

	// Enough traffic to fill what the kernel holds for the stalled client
	// (a few tens of KiB with its socket options), the frame its writer
	// is stuck in, and the queue bound, with a wide margin.
	v, total := snap.StateVersion, 0
	for i := 0; total < 2*queue+384<<10; i++ {
		if i == 60 {
			t.Fatalf("%d runs did not produce %d bytes", i, 2*queue+384<<10)
		}
		n := len(a.items)
		runID := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v,
			"user_message": fmt.Sprintf("question %d about readers that stall", i)}), "run_id")
		for _, c := range []*wsClient{a, b} {
			c.untilEvent(th, chat.EventRunCompleted, runID)
		}
		for _, it := range a.items[n:] {
			total += len(it.raw)
		}
		v = a.view(th).version
	}
	final := h.snapshot(th)
	for _, c := range []*wsClient{a, b} {
		if c.view(th).last() != final.LastSeq {
			t.Errorf("a reading tab applied up to %d of %d", c.view(th).last(), final.LastSeq)
		}
		if extra := c.sync(); len(extra) != 0 {
			t.Errorf("a reading tab got more after the last run: %v", extra)
		}
	}
	if !slices.Equal(a.eventLines(th), b.eventLines(th)) {
		t.Errorf("the reading tabs saw different events")
	}

	ce := s.closed()
	if ce.Code != websocket.StatusTryAgainLater || !strings.Contains(ce.Reason, "after_seq") {
		t.Errorf("stalled client closed with %d %q, want 1013 and a reason naming after_seq", ce.Code, ce.Reason)
	}
	if q, st := ml.count("slow:websocket:queue_overflow"), ml.count("slow:websocket:stuck_write"); q != 1 || st != 0 {
		t.Errorf("slow closes counted: %d queue_overflow, %d stuck_write; want 1 and 0", q, st)
	}
	if got := ml.waitCount("open:websocket", 2); got != 2 {
		t.Errorf("%d WebSocket connections counted open after the slow close, want the 2 reading tabs", got)
	}
	last := s.view(th).last()
	if last >= final.LastSeq {
		t.Fatalf("the stalled client got all %d events: the test did not stall it", last)
	}
	got := s.eventLines(th)
	if want := a.eventLines(th); len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
		t.Errorf("the stalled client's %d events are not a prefix of the thread's", len(got))
	}
	t.Logf("stalled client cut at seq %d of %d after %d bytes to the others", last, final.LastSeq, total)

	s2 := h.dial(t)
	if ack := s2.subscribe(th, wsAfter(last)); ack["recovered"] != true {
		t.Fatalf("resubscribe after the slow close: %v", ack)
	}
	s2.untilSeq(th, final.LastSeq)
	if got := append(got, s2.eventLines(th)...); !slices.Equal(got, a.eventLines(th)) {
		t.Errorf("prefix + recovery = %d events, the thread has %d", len(got), len(a.eventLines(th)))
	}
}

// TestWSStuckWriterIsDropped: a client that stops reading while the queue
// bound is not reached is dropped by the sweeper once a write has been
// blocked for StuckWrite (no close frame can get through a full pipe);
// what it received is a gap-free prefix that after_seq completes.
func TestWSStuckWriterIsDropped(t *testing.T) {
	t.Parallel()
	const stuck = 150 * time.Millisecond
	ml := newMetricsLog()
	h := newHarness(t, 0, withWS(gateway.WSConfig{StuckWrite: stuck, CommandRate: 1000, CommandBurst: 1000}), withMetrics(ml))
	snap := h.createThread("")
	th := snap.ThreadID
	s := h.dialStalled(t)
	s.post(map[string]any{"type": "subscribe", "thread_id": th, "after_seq": int64(0)}) // and never reads again
	a := h.dial(t)
	a.subscribe(th, wsAfter(0))
	// Fill the stalled client's path (a few tens of KiB, say at most
	// 256 KiB), then keep the thread busy for several times StuckWrite.
	v, total := snap.StateVersion, 0
	var filled time.Time
	for i := 0; filled.IsZero() || time.Since(filled) < 4*stuck; i++ {
		if i == 200 {
			t.Fatalf("%d runs", i)
		}
		if filled.IsZero() && total >= 256<<10 {
			filled = time.Now()
		}
		n := len(a.items)
		runID := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v,
			"user_message": fmt.Sprintf("question %d about stuck writes", i)}), "run_id")
		a.untilEvent(th, chat.EventRunCompleted, runID)
		for _, it := range a.items[n:] {
			total += len(it.raw)
		}
		v = a.view(th).version
	}
	final := h.snapshot(th)
	deadline := time.Now().Add(waitTimeout)
	var err error
	for err == nil {
		_, err = s.readItem(deadline)
	}
	if code := websocket.CloseStatus(err); code != -1 {
		t.Errorf("stuck client ended with close code %d (%v), want a dropped connection", code, err)
	}
	if q, st := ml.count("slow:websocket:queue_overflow"), ml.count("slow:websocket:stuck_write"); q != 0 || st != 1 {
		t.Errorf("slow closes counted: %d queue_overflow, %d stuck_write; want 0 and 1", q, st)
	}
	last := s.view(th).last()
	if last >= final.LastSeq {
		t.Fatalf("the stuck client got all %d events", last)
	}
	s2 := h.dial(t)
	if ack := s2.subscribe(th, wsAfter(last)); ack["recovered"] != true {
		t.Fatalf("resubscribe: %v", ack)
	}
	s2.untilSeq(th, final.LastSeq)
	if got := append(s.eventLines(th), s2.eventLines(th)...); !slices.Equal(got, a.eventLines(th)) {
		t.Errorf("prefix + recovery = %d events, the thread has %d", len(got), len(a.eventLines(th)))
	}
}

// TestWSMaxSubscriptions: past MaxSubscriptions a subscribe is refused
// (rate_limited) and changes nothing; resubscribing a watched thread and
// subscribing after an unsubscribe work.
func TestWSMaxSubscriptions(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond, withWS(gateway.WSConfig{MaxSubscriptions: 2}))
	t1, t2, t3 := h.createThread("").ThreadID, h.createThread("").ThreadID, h.createThread("").ThreadID
	c := h.dial(t)
	c.subscribe(t1, wsAfter(1))
	c.subscribe(t2, wsAfter(1))
	if e := c.cmd(map[string]any{"type": "subscribe", "thread_id": t3, "after_seq": int64(1)}); e["type"] != "error" || e["error"] != chat.CodeRateLimited {
		t.Errorf("third subscribe: %v", e)
	}
	c.subscribe(t1, wsAfter(1))
	c.ack(map[string]any{"type": "unsubscribe", "thread_id": t2})
	c.subscribe(t3, wsAfter(1))
	// t3 is watched, t2 is not.
	r3 := wsStr(c.ack(map[string]any{"type": "run.start", "thread_id": t3, "expected_state_version": 1, "user_message": "short three"}), "run_id")
	r2 := h.startRun(t2, 1, "short two").RunID
	c.untilEvent(t3, chat.EventRunCompleted, r3)
	h.openSSE(t2, "after_seq=0", "").waitType(chat.EventRunCompleted, r2)
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("events after the runs: %v", extra)
	}
}

// TestWSLongReplayIsNotTooSlow: a subscribe whose replay or snapshot is
// larger than the queue bound is delivered whole to a client that reads;
// the bound is for live events a client falls behind on, so a reconnect is
// not closed as too slow again and again.
func TestWSLongReplayIsNotTooSlow(t *testing.T) {
	t.Parallel()
	const queue = 16 << 10
	h := newHarness(t, 0, withWS(gateway.WSConfig{QueueBytes: queue}))
	snap := h.createThread("")
	th := snap.ThreadID
	// Not watched live: with so small a bound a live stream may be ended
	// as too slow (the bound doing its job); this test is about replays.
	_, msg := h.runUnwatched(th, 1, "Explain consistent hashing with virtual nodes")
	cur := h.snapshot(th)
	h.runUnwatched(th, cur.StateVersion, "Explain "+strings.Repeat("replicas ", queue/9))
	cur = h.snapshot(th)
	if len(h.snapshotBytes(th)) < queue {
		t.Fatalf("the snapshot is only %d bytes", len(h.snapshotBytes(th)))
	}

	c := h.dial(t)
	c.subscribe(th, wsAfter(0))
	c.untilSeq(th, cur.LastSeq)
	if got := c.text(th, msg.MessageID, cur.LastSeq); got != msg.Content {
		t.Errorf("replayed deltas %q, published %q", got, msg.Content)
	}
	d := h.dial(t)
	d.subscribe(th, nil)
	if ev := d.untilEvent(th, chat.EventThreadSnapshot, ""); wsNum(ev, "seq") != cur.LastSeq {
		t.Errorf("snapshot at %d, thread at %d", wsNum(ev, "seq"), cur.LastSeq)
	}
	for _, x := range []*wsClient{c, d} {
		x.sync()
	}
}

// TestWSStalledResubscribesAreBounded: replays are exempt from the queue
// bound one at a time only; a client that stops reading and keeps
// subscribing is closed as too slow instead of making the server hold
// replay after replay.
func TestWSStalledResubscribesAreBounded(t *testing.T) {
	t.Parallel()
	const queue = 32 << 10
	h := newHarness(t, 0, withWS(gateway.WSConfig{QueueBytes: queue, StuckWrite: time.Minute, CommandRate: 1000, CommandBurst: 1000}))
	th := h.createThread("").ThreadID
	for v := int64(1); len(h.snapshotBytes(th)) < 2*queue; v = h.snapshot(th).StateVersion {
		h.runUnwatched(th, v, "Explain "+strings.Repeat("backlogs ", 2<<10))
	}
	s := h.dialStalled(t)
	for range 40 { // 40 replays of the whole thread if nothing stopped it
		s.post(map[string]any{"type": "subscribe", "thread_id": th, "after_seq": int64(0)})
	}
	// Only now does it read: the connection was closed as too slow.
	if ce := s.closed(); ce.Code != websocket.StatusTryAgainLater {
		t.Errorf("closed with %d %q, want 1013", ce.Code, ce.Reason)
	}
	if n := len(s.answered); n >= 40 {
		t.Errorf("all %d subscribes were answered", n)
	}
}
