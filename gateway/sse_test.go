package gateway_test

// The Server-Sent Events stream: replay and reconnect with Last-Event-ID,
// the snapshot it starts with, JSON errors, a disconnect that cancels
// nothing, and clients that stall, fall behind or miss events.

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
)

// ---- SSE tests ----

// TestSSEReplayAndReconnect: a replay from 0 is byte-for-byte the live
// stream; Last-Event-ID resumes exactly after N (and wins over after_seq);
// then live events follow with no gap.
func TestSSEReplayAndReconnect(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("")
	live := h.openSSE(snap.ThreadID, "after_seq=0", "")
	ack := h.startRun(snap.ThreadID, snap.StateVersion, "Explain SQLite write ahead logging")
	live.waitType(chat.EventRunCompleted, ack.RunID)
	after := h.snapshot(snap.ThreadID)
	if live.lastSeq != after.LastSeq {
		t.Fatalf("live stream at seq %d, thread at %d", live.lastSeq, after.LastSeq)
	}

	// Replay from the start: every event, in order, identical bytes.
	replay := h.openSSE(snap.ThreadID, "after_seq=0", "")
	got := replay.waitSeq(after.LastSeq)
	if len(got) != len(live.events) {
		t.Fatalf("replay has %d events, live had %d", len(got), len(live.events))
	}
	for i, e := range got {
		if e.Seq != int64(i+1) || string(e.Data) != string(live.events[i].Data) {
			t.Errorf("replay event %d = %s, live was %s", i+1, e.Data, live.events[i].Data)
		}
	}

	// Reconnect in the middle of the deltas: Last-Event-ID wins over
	// after_seq; exactly N+1.. follows.
	var mid int64
	for _, e := range live.events {
		if e.Type == chat.EventMessageDelta {
			mid = e.Seq + 2
			break
		}
	}
	re := h.openSSE(snap.ThreadID, "after_seq=1", strconv.FormatInt(mid, 10))
	got = re.waitSeq(after.LastSeq)
	if got[0].Seq != mid+1 || int64(len(got)) != after.LastSeq-mid {
		t.Fatalf("reconnect after %d: first seq %d, %d events; want %d..%d", mid, got[0].Seq, len(got), mid+1, after.LastSeq)
	}
	for i, e := range got {
		if string(e.Data) != string(live.events[mid+int64(i)].Data) {
			t.Errorf("reconnect event %d differs from live", e.Seq)
		}
	}
	// Last-Event-ID wins even over an after_seq that would be refused.
	re2 := h.openSSE(snap.ThreadID, "after_seq=bogus", strconv.FormatInt(after.LastSeq-1, 10))
	if e := re2.next(); e.Seq != after.LastSeq || e.Type != chat.EventRunCompleted {
		t.Errorf("Last-Event-ID %d with a bad after_seq gave %v", after.LastSeq-1, e)
	}
	re2.close()

	// Then live events: the next run continues at last_seq + 1 on every
	// stream (the observers check the seqs).
	ack2 := h.startRun(snap.ThreadID, after.StateVersion, "short one more")
	for _, s := range []*sseStream{live, replay, re} {
		if first := s.next(); first.Seq != after.LastSeq+1 {
			t.Errorf("live event after replay has seq %d, want %d", first.Seq, after.LastSeq+1)
		}
		s.waitType(chat.EventRunCompleted, ack2.RunID)
	}
	if len(re.events) != len(live.events)-int(mid) {
		t.Errorf("reconnected stream saw %d events, want %d", len(re.events), len(live.events)-int(mid))
	}
}

// TestSSESnapshotStart: without a position, or with one beyond the thread's
// end, the stream starts with a thread.snapshot whose seq is last_seq; a
// snapshot taken mid-run holds the partial text, which the following deltas
// complete into the published message.
func TestSSESnapshotStart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("snapshots")
	ack := h.startRun(snap.ThreadID, snap.StateVersion, "short hello")
	h.openSSE(snap.ThreadID, "after_seq=0", "").waitType(chat.EventRunCompleted, ack.RunID)
	cur := h.snapshot(snap.ThreadID)

	for _, q := range []string{"", "after_seq=" + strconv.FormatInt(cur.LastSeq+5, 10)} {
		s := h.openSSE(snap.ThreadID, q, "")
		s.lastSeq = -1 // must start with a snapshot whatever was asked
		first := s.next()
		if first.Type != chat.EventThreadSnapshot || first.Seq != cur.LastSeq || first.StateVersion != cur.StateVersion ||
			first.HeadCheckpointID != cur.HeadCheckpointID || len(first.Messages) != 2 || first.ActiveRun != nil || first.Title != "snapshots" {
			t.Errorf("query %q: first event %s, want the snapshot at seq %d", q, first.Data, cur.LastSeq)
		}
	}

	// Mid-run: the snapshot's partial_text plus the later deltas is the
	// published message.
	h.model.setPace(50 * time.Millisecond)
	watch := h.openSSE(snap.ThreadID, "after_seq="+strconv.FormatInt(cur.LastSeq, 10), "")
	ack = h.startRun(snap.ThreadID, cur.StateVersion, "Tell me about event sourcing")
	watch.waitDeltas(ack.RunID, 3)
	h.model.setPace(time.Millisecond) // later runs only
	s := h.openSSE(snap.ThreadID, "", "")
	first := s.next()
	if first.Type != chat.EventThreadSnapshot || first.ActiveRun == nil || first.ActiveRun.RunID != ack.RunID || first.ActiveRun.MessageID == nil {
		t.Fatalf("mid-run snapshot without the active run: %s", first.Data)
	}
	ar := first.ActiveRun
	if ar.LastSeq != first.Seq {
		t.Errorf("active_run.last_seq %d != snapshot seq %d", ar.LastSeq, first.Seq)
	}
	watch.catchUp(first.Seq)
	if want := watch.text(*ar.MessageID, ar.LastSeq); ar.PartialText != want || want == "" {
		t.Errorf("partial_text %q, want the deltas up to seq %d: %q", ar.PartialText, ar.LastSeq, want)
	}
	h.cancel(ack.RunID, nil)
	s.waitType(chat.EventRunCancelled, ack.RunID)
	watch.waitType(chat.EventRunCancelled, ack.RunID)
	all := watch.text(*ar.MessageID, watch.lastSeq)
	if got := ar.PartialText + s.text(*ar.MessageID, s.lastSeq); got != all {
		t.Errorf("partial_text + later deltas = %q, want %q", got, all)
	}
}

// TestSSEErrorsAreJSON: errors before streaming are JSON in the error shape.
func TestSSEErrorsAreJSON(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("")
	base := "/api/threads/" + snap.ThreadID + "/events"
	cases := []struct {
		name, path, lastEventID string
		status                  int
		code                    string
	}{
		{"unknown thread", "/api/threads/thr_00000000000000000000000000/events", "", 404, chat.CodeNotFound},
		{"run id as thread", "/api/threads/run_00000000000000000000000000/events?after_seq=0", "", 404, chat.CodeNotFound},
		{"negative after_seq", base + "?after_seq=-1", "", 400, chat.CodeInvalidRequest},
		{"after_seq not a number", base + "?after_seq=abc", "", 400, chat.CodeInvalidRequest},
		{"bad Last-Event-ID", base, "x1", 400, chat.CodeInvalidRequest},
		{"negative Last-Event-ID", base + "?after_seq=0", "-5", 400, chat.CodeInvalidRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := h.with(t)
			var hdr []string
			if c.lastEventID != "" {
				hdr = []string{"Last-Event-ID", c.lastEventID}
			}
			r := h.do(http.MethodGet, c.path, nil, hdr...)
			h.wantError(t, r, c.status, c.code)
		})
	}
	h.requireUnchanged(snap)
}

// TestClientDisconnectNeverCancels: closing the event stream mid-run leaves
// the run running; a new stream from the last seen seq sees it complete.
func TestClientDisconnectNeverCancels(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10*time.Millisecond, withKeepAlive(20*time.Millisecond))
	snap := h.createThread("")
	first := h.openSSE(snap.ThreadID, "after_seq=0", "")
	ack := h.startRun(snap.ThreadID, snap.StateVersion, "Describe how TCP congestion control works")
	seen := first.waitDeltas(ack.RunID, 3)
	msgID := seen[0].MessageID
	lastSeen := first.lastSeq
	before := first.text(msgID, lastSeen)
	first.close()

	second := h.openSSE(snap.ThreadID, "", strconv.FormatInt(lastSeen, 10))
	done := second.waitType(chat.EventRunCompleted, ack.RunID)
	if done.Seq <= lastSeen {
		t.Fatalf("run.completed at seq %d, not after %d", done.Seq, lastSeen)
	}
	var published *chat.Message
	for _, e := range second.events {
		if e.Type == chat.EventMessagePublished && e.Message.RunID != nil && *e.Message.RunID == ack.RunID {
			published = e.Message
		}
		if e.Type == chat.EventRunCancelRequested || e.Type == chat.EventRunCancelled {
			t.Errorf("the disconnect cancelled the run: %v", e)
		}
	}
	if published == nil || published.MessageID != msgID {
		t.Fatalf("no published message %s after the reconnect", msgID)
	}
	if got := before + second.text(msgID, second.lastSeq); got != published.Content {
		t.Errorf("deltas before and after the disconnect = %q, published %q", got, published.Content)
	}
	run := h.run(ack.RunID)
	if run.Status != chat.RunCompleted || run.CancelRequestedAt != nil || run.FinishedAt == nil {
		t.Errorf("run after disconnect: %+v", run)
	}
	// The run took far longer than the keep-alive interval: comments came
	// and the stream went on around them.
	if second.comments.Load() == 0 {
		t.Errorf("no keep-alive comment during a %d-event stream", len(second.events))
	}
}

// stalledSSE is an event stream whose client reads nothing after the
// headers (over stalledClient, so that the kernel holds little) until
// resume.
type stalledSSE struct {
	h               *harness
	ctx             context.Context
	cancel          context.CancelFunc
	resp            *http.Response
	threadID, query string
}

func (h *harness) openStalledSSE(threadID, query string) *stalledSSE {
	h.t.Helper()
	ctx, cancel, resp := h.requestSSE(stalledClient(h.t), threadID, query, "")
	h.t.Cleanup(func() {
		cancel()
		resp.Body.Close()
	})
	return &stalledSSE{h: h, ctx: ctx, cancel: cancel, resp: resp, threadID: threadID, query: query}
}

// resume starts reading: the returned stream has everything from the
// start, checked as openSSE's.
func (s *stalledSSE) resume() *sseStream {
	return s.h.readSSE(s.ctx, s.cancel, s.resp, s.threadID, s.query, "")
}

// streamStatus opens an event stream of the thread and returns the status
// of the answer; an accepted stream is closed at once.
func (h *harness) streamStatus(threadID string) int {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.srv.URL+"/api/threads/"+threadID+"/events?after_seq=0", nil)
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		h.t.Fatalf("open event stream: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// publishWhileStalled runs runs on the thread, watched by live, until more
// than bytes were published (as live counts them) and then for at least
// busy more, and returns the thread's state after them. Every run
// completing on live while another stream of the thread does not read is
// the proof that no stream ever makes the publisher wait.
func (h *harness) publishWhileStalled(live *sseStream, snap chat.Snapshot, bytes int, busy time.Duration) chat.Snapshot {
	h.t.Helper()
	v, total := snap.StateVersion, 0
	var filled time.Time
	for i := 0; filled.IsZero() || time.Since(filled) < busy; i++ {
		if i == 300 {
			h.t.Fatalf("%d runs published only %d bytes", i, total)
		}
		n := len(live.events)
		ack := h.startRun(snap.ThreadID, v, fmt.Sprintf("question %d about readers that stall: %s", i, strings.Repeat("stalls ", 200)))
		live.waitType(chat.EventRunCompleted, ack.RunID)
		for _, e := range live.events[n:] {
			total += len(e.Data)
		}
		v = live.lastVersion
		if filled.IsZero() && total >= bytes {
			filled = time.Now()
		}
	}
	final := h.snapshot(snap.ThreadID)
	if live.lastSeq != final.LastSeq {
		h.t.Fatalf("the reading stream is at seq %d, the thread at %d", live.lastSeq, final.LastSeq)
	}
	h.t.Logf("published %d bytes in %d events", total, final.LastSeq)
	return final
}

// resumeAfter checks the end of a stream the server gave up on: what it
// received (prefix, up to seq last) is a gap-free beginning of the thread,
// cut before its end, and a reconnect with Last-Event-ID, admitted once
// the ended stream's connection slot is free, gets exactly the rest, so
// that together they are what the stream that read everything (live) saw.
func (h *harness) resumeAfter(prefix []*wireEvent, last int64, live *sseStream, final chat.Snapshot) {
	h.t.Helper()
	if last >= final.LastSeq {
		h.t.Fatalf("the stalled stream got all %d events: the test did not stall it", final.LastSeq)
	}
	re := h.openSSEAdmitted(final.ThreadID, "after_seq=0", strconv.FormatInt(last, 10))
	got := append(prefix, re.waitSeq(final.LastSeq)...)
	if len(got) != len(live.events) {
		h.t.Fatalf("prefix (%d events, to seq %d) + reconnect = %d events, the thread has %d", len(prefix), last, len(got), len(live.events))
	}
	for i, e := range got {
		if string(e.Data) != string(live.events[i].Data) {
			h.t.Errorf("event %d after the reconnect is %s, live was %s", i+1, e, live.events[i])
		}
	}
	h.t.Logf("stalled stream cut at seq %d of %d", last, final.LastSeq)
}

// TestSSEStuckWriterIsDropped: a client that stops reading while the
// thread keeps publishing holds its stream only until a write has been
// stuck for StuckWrite. Then the handler returns: the stream ends, its
// connection slot admits a new stream, the slow close is counted. The
// publisher and a reading stream never waited for it; what it received is
// a gap-free prefix, and a reconnect with Last-Event-ID resumes exactly
// after it.
func TestSSEStuckWriterIsDropped(t *testing.T) {
	t.Parallel()
	const stuck = 200 * time.Millisecond
	ml := newMetricsLog()
	h := newHarness(t, 0, withMetrics(ml), withWS(gateway.WSConfig{StuckWrite: stuck, MaxConnsPerUser: 2,
		UserCommandRate: 1000, UserCommandBurst: 1000}))
	snap := h.createThread("")
	stalled := h.openStalledSSE(snap.ThreadID, "after_seq=0")
	live := h.openSSE(snap.ThreadID, "after_seq=0", "")
	if got := h.streamStatus(snap.ThreadID); got != http.StatusTooManyRequests {
		t.Fatalf("a third stream: status %d, want 429 while the stalled one holds its slot", got)
	}

	// More than the stalled client's path holds (a few tens of KiB with
	// its socket options; say at most 256 KiB), then the thread stays busy
	// for several times StuckWrite: by then the handler must be gone.
	final := h.publishWhileStalled(live, snap, 256<<10, 4*stuck)
	// Its write has been stuck for about 4×StuckWrite by now: the handler
	// is gone, give or take scheduling (without a deadline it never is).
	if got := ml.waitCountFor("open:sse", 1, stuck+time.Second); got != 1 {
		t.Fatalf("%d event streams counted open, want the reading one: the stuck stream was not ended", got)
	}
	if q, st, m := ml.count("slow:sse:queue_overflow"), ml.count("slow:sse:stuck_write"), ml.count("slow:sse:missed_events"); q != 0 || st != 1 || m != 0 {
		t.Errorf("slow closes counted: %d queue_overflow, %d stuck_write, %d missed_events; want 0, 1, 0", q, st, m)
	}

	// Its connection slot is free: the reconnect is admitted.
	s := stalled.resume()
	prefix, err := s.rest()
	t.Logf("the stuck stream ended with %v after %d bytes", err, dataBytes(prefix))
	h.resumeAfter(prefix, s.lastSeq, live, final)
}

// TestSSESlowStreamIsEnded: a stream that falls more than QueueBytes behind
// the live feed is ended as too slow. It is counted at once, the publisher
// never waits for it, and it holds no more than the bound meanwhile; as
// soon as its writer gets through it ends with a comment saying why. What
// it received is a gap-free prefix, and a reconnect with Last-Event-ID
// resumes exactly after it.
func TestSSESlowStreamIsEnded(t *testing.T) {
	t.Parallel()
	const queue = 32 << 10
	ml := newMetricsLog()
	h := newHarness(t, 0, withMetrics(ml), withWS(gateway.WSConfig{QueueBytes: queue, StuckWrite: time.Minute,
		MaxConnsPerUser: 2, UserCommandRate: 1000, UserCommandBurst: 1000}))
	snap := h.createThread("")
	th := snap.ThreadID
	stalled := h.openStalledSSE(th, "after_seq=0")

	// More than what the stalled client's path holds, the write its
	// handler is blocked in and the queue bound, with a wide margin, as
	// the store counts it. The runs are not watched live: a stream that
	// reads may fall 32 KiB behind for a moment too.
	ctx, user := context.Background(), chat.LocalPrincipal().UserID
	v, last, total := snap.StateVersion, snap.LastSeq, 0
	for i := 0; total < 2*queue+384<<10; i++ {
		ack := h.startRun(th, v, fmt.Sprintf("question %d about slow readers: %s", i, strings.Repeat("slow ", 1<<10)))
		if run := h.pollRun(ack.RunID); run.Status != chat.RunCompleted {
			t.Fatalf("run %s is %s", ack.RunID, run.Status)
		}
		replay, err := h.st.Events(ctx, user, th, last)
		if err != nil || !replay.Complete {
			t.Fatalf("replay after %d: %v (complete %v)", last, err, replay.Complete)
		}
		for _, ev := range replay.Events {
			total += len(ev.Raw)
		}
		v, last = replay.StateVersion, replay.LastSeq
	}
	if got := ml.waitCount("slow:sse:queue_overflow", 1); got != 1 {
		t.Fatalf("%d queue overflows counted, want 1", got)
	}
	final := h.snapshot(th)
	all := h.openSSE(th, "after_seq=0", "") // a replay: never held to the bound
	all.waitSeq(final.LastSeq)
	s := stalled.resume()
	prefix, err := s.rest()
	if err == nil || !strings.Contains(err.Error(), "ended by the server") {
		t.Errorf("the slow stream ended with %v, want the server ending it", err)
	}
	if s.comments.Load() == 0 {
		t.Errorf("the slow stream ended without a comment saying why")
	}
	if got := ml.waitCount("open:sse", 1); got != 1 {
		t.Errorf("%d event streams counted open, want the reading one", got)
	}
	if st, m := ml.count("slow:sse:stuck_write"), ml.count("slow:sse:missed_events"); st != 0 || m != 0 {
		t.Errorf("slow closes counted: %d stuck_write, %d missed_events; want none", st, m)
	}
	h.resumeAfter(prefix, s.lastSeq, all, final)
}

// TestSSELostEventsEndTheStream: when the bus reports events of the thread
// lost for good, the stream ends like one that missed an event, counted,
// and the reconnect starts over from the store.
func TestSSELostEventsEndTheStream(t *testing.T) {
	t.Parallel()
	spy := &feedSpy{}
	ml := newMetricsLog()
	h := newHarness(t, 0, withFeedSpy(spy), withMetrics(ml))
	snap := h.createThread("")
	s := h.openSSE(snap.ThreadID, "after_seq=0", "")
	s.catchUp(snap.LastSeq)
	sinks := spy.added(snap.ThreadID)
	if len(sinks) != 1 {
		t.Fatalf("%d sinks added for the thread, want the stream's one", len(sinks))
	}
	lossAware, ok := sinks[0].(bus.LossAware)
	if !ok {
		t.Fatal("an event stream is not bus.LossAware: a bus could not tell it about lost events")
	}
	if lossAware.Lost(snap.ThreadID, snap.LastSeq+1) {
		t.Error("the stream stays subscribed after losing events")
	}
	if _, err := s.rest(); err == nil || !strings.Contains(err.Error(), "ended by the server") {
		t.Errorf("the stream ended with %v, want the server ending it", err)
	}
	if got := ml.waitCount("slow:sse:missed_events", 1); got != 1 {
		t.Errorf("%d missed_events counted, want 1", got)
	}
	re := h.openSSE(snap.ThreadID, "", strconv.FormatInt(s.lastSeq, 10))
	ack := h.startRun(snap.ThreadID, snap.StateVersion, "short after the loss")
	re.waitType(chat.EventRunCompleted, ack.RunID)
}

// dataBytes sums the data lines of some events.
func dataBytes(evs []*wireEvent) int {
	n := 0
	for _, e := range evs {
		n += len(e.Data)
	}
	return n
}
