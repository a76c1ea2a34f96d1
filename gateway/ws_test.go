package gateway_test

// WebSocket event delivery: several tabs see the same events, reconnecting
// after a seq, stale tabs, snapshots (live, after the buffer expired), and
// several threads on one connection.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
)

// ---- tests ----

// TestWSTwoTabsSeeTheSameEvents: two tabs on one thread apply identical
// event sequences, seq +1 each; each tab's commands are answered before
// any event they caused reaches that tab.
func TestWSTwoTabsSeeTheSameEvents(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("ws")
	th := snap.ThreadID
	a, b := h.dial(t), h.dial(t)
	for _, c := range []*wsClient{a, b} {
		ack := c.subscribe(th, wsAfter(0))
		if ack["recovered"] != true || wsNum(ack, "last_seq") != snap.LastSeq || wsNum(ack, "state_version") != snap.StateVersion {
			t.Fatalf("subscribe: %v", ack)
		}
		wsWantKeys(t, "subscribe ack", ack, "type", "re", "thread_id", "recovered", "state_version", "last_seq")
	}
	v := snap.StateVersion
	for i, c := range []*wsClient{a, b, a} {
		ack := c.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v,
			"user_message": fmt.Sprintf("question %d about websockets and tabs", i)})
		wsWantKeys(t, "run.start ack", ack, "type", "re", "run_id", "status", "state_version")
		runID := wsStr(ack, "run_id")
		// An idle server: the start claims its run for a free worker.
		if ack["status"] != string(chat.RunRunning) || !strings.HasPrefix(runID, chat.PrefixRun) || wsNum(ack, "state_version") <= v {
			t.Fatalf("run.start ack %v (expected version %d)", ack, v)
		}
		for _, o := range []*wsClient{a, b} {
			o.untilEvent(th, chat.EventRunCompleted, runID)
		}
		from, to := v, wsNum(ack, "state_version")
		n := c.causedAfter(wsStr(ack, "re"), func(m map[string]any) bool {
			sv := wsNum(m, "state_version")
			return m["thread_id"] == th && (m["run_id"] == runID || (sv > from && sv <= to))
		})
		if n < 5 {
			t.Errorf("run %s: %d events on the tab that started it", runID, n)
		}
		if a.view(th).version != b.view(th).version {
			t.Fatalf("tabs at versions %d and %d", a.view(th).version, b.view(th).version)
		}
		v = a.view(th).version
	}
	evA, evB := a.eventLines(th), b.eventLines(th)
	if !slices.Equal(evA, evB) || len(evA) < 15 {
		t.Fatalf("tabs saw different events: A %d, B %d", len(evA), len(evB))
	}
	final := h.snapshot(th)
	if a.view(th).last() != final.LastSeq || int64(len(evA)) != final.LastSeq {
		t.Errorf("tabs applied up to seq %d (%d events), thread is at %d", a.view(th).last(), len(evA), final.LastSeq)
	}
	// Every published run message is exactly its deltas.
	for _, it := range a.view(th).events {
		if it.m["type"] != chat.EventMessagePublished || it.m["run_id"] == nil {
			continue
		}
		msg, _ := it.m["message"].(map[string]any)
		if msg["role"] != string(chat.RoleAssistant) {
			continue
		}
		if got := a.text(th, wsStr(msg, "message_id"), wsNum(it.m, "seq")); got != wsStr(msg, "content") || got == "" {
			t.Errorf("published %q, deltas %q", wsStr(msg, "content"), got)
		}
	}
}

// TestWSReconnectWithAfterSeq: a tab closed mid-run and reopened with
// after_seq receives exactly what it missed, then live events; closing it
// never cancelled the run.
func TestWSReconnectWithAfterSeq(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 5*time.Millisecond)
	th, runID, a, b := h.twoTabsMidRun(t, "Explain how vector clocks order events across replicas", 3)
	last := b.view(th).last()
	if err := b.conn.Close(websocket.StatusGoingAway, "tab closed"); err != nil {
		t.Fatalf("close the tab: %v", err)
	}
	a.untilDeltas(th, runID, 6) // the run goes on without the tab

	b2 := h.dial(t)
	ack := b2.subscribe(th, wsAfter(last))
	if ack["recovered"] != true || wsNum(ack, "last_seq") < last {
		t.Fatalf("resubscribe after seq %d: %v", last, ack)
	}
	done := a.untilEvent(th, chat.EventRunCompleted, runID)
	b2.untilEvent(th, chat.EventRunCompleted, runID)
	if wsNum(done, "seq") <= wsNum(ack, "last_seq") {
		t.Errorf("the run ended (seq %d) before the tab came back (seq %d): nothing was live", wsNum(done, "seq"), wsNum(ack, "last_seq"))
	}
	got := append(b.eventLines(th), b2.eventLines(th)...)
	if want := a.eventLines(th); !slices.Equal(got, want) {
		t.Errorf("closed and reopened tab saw %d+%d events, the open tab %d", len(b.eventLines(th)), len(b2.eventLines(th)), len(want))
	}
	if first := b2.view(th).events[0].m; wsNum(first, "seq") != last+1 {
		t.Errorf("after reconnecting the first event is %v, want seq %d", first, last+1)
	}
	for _, it := range a.view(th).events {
		if strings.HasPrefix(wsStr(it.m, "type"), "run.cancel") {
			t.Errorf("closing a tab cancelled the run: %s", it.raw)
		}
	}
	if run := h.run(runID); run.Status != chat.RunCompleted || run.CancelRequestedAt != nil || run.RequestedBy != nil {
		t.Errorf("run after a tab closed: %+v", run)
	}
	// Live events keep coming on the reopened tab.
	v := b2.view(th).version
	next := wsStr(b2.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v, "user_message": "short follow-up"}), "run_id")
	b2.untilEvent(th, chat.EventRunCompleted, next)
}

// TestWSStaleTabGetsConflict: a tab that did not apply the latest events
// and starts a run is refused with state_version_conflict, offered reload
// and a fork from the checkpoint it was based on; nothing changes, and the
// tab recovers by catching up.
func TestWSStaleTabGetsConflict(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	th := h.createThread("").ThreadID
	a, b := h.dial(t), h.dial(t)
	ack := b.subscribe(th, nil)
	if ack["recovered"] != false {
		t.Fatalf("subscribe without after_seq: %v", ack)
	}
	first := b.untilEvent(th, chat.EventThreadSnapshot, "")
	staleVersion, staleHead := wsNum(first, "state_version"), wsStr(first, "head_checkpoint_id")

	a.subscribe(th, wsAfter(0))
	runID := wsStr(a.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": staleVersion, "user_message": "short first question"}), "run_id")
	a.untilEvent(th, chat.EventRunCompleted, runID)
	cur := h.snapshot(th)
	before := h.snapshotBytes(th)

	e := b.cmd(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": staleVersion, "user_message": "a question from a stale tab"})
	if e["type"] != "error" || e["error"] != chat.CodeStateVersionConflict || wsNum(e, "current_state_version") != cur.StateVersion ||
		e["current_checkpoint_id"] != cur.HeadCheckpointID {
		t.Fatalf("stale run.start: %v (thread at v%d head %s)", e, cur.StateVersion, cur.HeadCheckpointID)
	}
	if acts, _ := e["allowed_actions"].([]any); !slices.Equal(acts, []any{"reload", "fork_from_" + staleHead}) {
		t.Errorf("allowed_actions %v, want [reload fork_from_%s]", e["allowed_actions"], staleHead)
	}
	if got := h.snapshotBytes(th); got != before {
		t.Errorf("a refused run.start changed the thread:\n%s\n%s", before, got)
	}
	// Offered action: fork from the checkpoint the tab was based on.
	fork := b.ack(map[string]any{"type": "thread.fork", "thread_id": th, "from_checkpoint_id": staleHead})
	if forked := h.snapshot(wsStr(fork, "new_thread_id")); len(forked.Messages) != 0 {
		t.Errorf("fork from the stale head has %d messages", len(forked.Messages))
	}
	// Offered action: reload (catch up), then the same command succeeds.
	b.untilSeq(th, cur.LastSeq)
	if b.view(th).version != cur.StateVersion {
		t.Fatalf("caught-up tab at version %d, thread at %d", b.view(th).version, cur.StateVersion)
	}
	again := wsStr(b.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": cur.StateVersion, "user_message": "short retry"}), "run_id")
	b.untilEvent(th, chat.EventRunCompleted, again)
}

// TestWSSnapshotWhenBufferExpired: a reconnect whose missed deltas are no
// longer buffered gets recovered: false and a thread.snapshot at last_seq,
// then live events; a durable-only gap still replays.
func TestWSSnapshotWhenBufferExpired(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 5*time.Millisecond)
	th, runID, a, w := h.twoTabsMidRun(t, "Explain write-ahead logging", 3)
	last := a.view(th).last()
	a.conn.Close(websocket.StatusGoingAway, "tab closed")
	w.untilEvent(th, chat.EventRunCompleted, runID)
	n, err := h.st.Retention().PurgeStream(context.Background(), time.Now().Add(time.Minute))
	if err != nil || n == 0 {
		t.Fatalf("purge: %d deltas, %v", n, err)
	}
	cur := h.snapshot(th)

	a2 := h.dial(t)
	ack := a2.subscribe(th, wsAfter(last))
	if ack["recovered"] != false || wsNum(ack, "last_seq") != cur.LastSeq || wsNum(ack, "state_version") != cur.StateVersion {
		t.Fatalf("resubscribe over purged deltas: %v (thread at seq %d v%d)", ack, cur.LastSeq, cur.StateVersion)
	}
	ev := a2.read(time.Now().Add(waitTimeout))
	msgs, _ := ev["messages"].([]any)
	if ev["type"] != chat.EventThreadSnapshot || wsNum(ev, "seq") != cur.LastSeq || len(msgs) != 2 || ev["head_checkpoint_id"] != cur.HeadCheckpointID || ev["active_run"] != nil {
		t.Fatalf("after recovered false came %v", ev)
	}
	// The last three events are durable: that gap still replays.
	a3 := h.dial(t)
	if ack := a3.subscribe(th, wsAfter(cur.LastSeq-3)); ack["recovered"] != true {
		t.Errorf("durable-only gap: %v", ack)
	}
	a3.untilSeq(th, cur.LastSeq)
	// Then live.
	h.model.setPace(time.Millisecond)
	next := wsStr(a2.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": cur.StateVersion, "user_message": "short again"}), "run_id")
	for _, c := range []*wsClient{a2, a3} {
		c.untilEvent(th, chat.EventRunCompleted, next)
	}
	if !slices.Equal(a2.eventLines(th)[1:], a3.eventLines(th)[3:]) {
		t.Errorf("live events differ between the tabs")
	}
}

// TestWSSubscribeSnapshotThenLive: subscribe without after_seq mid-run:
// ack (recovered false), a thread.snapshot whose partial_text is exactly
// the deltas so far, then live events from the next seq.
func TestWSSubscribeSnapshotThenLive(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 5*time.Millisecond)
	th, runID, tabs := h.tabsMidRun(t, 1, "Explain how gossip protocols spread state", 3)
	a := tabs[0]

	b := h.dial(t)
	ack := b.subscribe(th, nil)
	wsWantKeys(t, "subscribe ack", ack, "type", "re", "thread_id", "recovered", "state_version", "last_seq")
	ev := b.read(time.Now().Add(waitTimeout))
	if ev["type"] != chat.EventThreadSnapshot || wsNum(ev, "seq") != wsNum(ack, "last_seq") || wsNum(ev, "state_version") != wsNum(ack, "state_version") {
		t.Fatalf("after the ack (%v) came %v", ack, ev)
	}
	active, _ := ev["active_run"].(map[string]any)
	if active == nil || active["run_id"] != runID || wsNum(active, "last_seq") != wsNum(ev, "seq") {
		t.Fatalf("snapshot of a running thread: active_run %v", ev["active_run"])
	}
	a.untilSeq(th, wsNum(ev, "seq"))
	if want := a.text(th, wsStr(active, "message_id"), wsNum(active, "last_seq")); wsStr(active, "partial_text") != want || want == "" {
		t.Errorf("partial_text %q, deltas %q", active["partial_text"], want)
	}
	b.untilEvent(th, chat.EventRunCompleted, runID)
	a.untilEvent(th, chat.EventRunCompleted, runID)
	la, lb := a.eventLines(th), b.eventLines(th)[1:]
	if len(lb) == 0 || !slices.Equal(la[len(la)-len(lb):], lb) {
		t.Errorf("live events after the snapshot differ from the other tab's")
	}
}

// TestWSTwoThreadsAndUnsubscribe: one connection watching two threads gets
// each thread's events in its own seq order; unsubscribing one stops its
// events (and never its run) while the other continues.
func TestWSTwoThreadsAndUnsubscribe(t *testing.T) {
	t.Parallel()
	// Frequent pings: keep-alive runs alongside the traffic.
	h := newHarness(t, 5*time.Millisecond, withWS(gateway.WSConfig{PingInterval: 2 * time.Millisecond}))
	t1, t2 := h.createThread("one").ThreadID, h.createThread("two").ThreadID
	c := h.dial(t)
	c.subscribe(t1, wsAfter(0))
	c.subscribe(t2, wsAfter(0))
	r1 := wsStr(c.ack(map[string]any{"type": "run.start", "thread_id": t1, "expected_state_version": 1, "user_message": "Explain quorum reads"}), "run_id")
	r2 := wsStr(c.ack(map[string]any{"type": "run.start", "thread_id": t2, "expected_state_version": 1, "user_message": "Explain leader leases"}), "run_id")
	c.untilDeltas(t1, r1, 3)
	c.untilDeltas(t2, r2, 3)
	interleaved := 0
	for i := 1; i < len(c.items); i++ {
		if p, q := wsStr(c.items[i-1].m, "thread_id"), wsStr(c.items[i].m, "thread_id"); p != "" && q != "" && p != q {
			interleaved++
		}
	}
	if interleaved == 0 {
		t.Errorf("the two runs' events did not interleave on the connection")
	}
	u := c.ack(map[string]any{"type": "unsubscribe", "thread_id": t1})
	wsWantKeys(t, "unsubscribe ack", u, "type", "re")
	stoppedAt := c.view(t1).last()
	c.untilEvent(t2, chat.EventRunCompleted, r2) // observe fails on any t1 event after the ack
	s1 := h.openSSE(t1, "after_seq=0", "")
	s1.waitType(chat.EventRunCompleted, r1)
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("events after unsubscribe: %v", extra)
	}
	if run := h.run(r1); run.Status != chat.RunCompleted {
		t.Errorf("run of the unsubscribed thread: %s", run.Status)
	}
	// Resubscribing where it stopped fills the gap exactly.
	if ack := c.subscribe(t1, wsAfter(stoppedAt)); ack["recovered"] != true {
		t.Fatalf("resubscribe: %v", ack)
	}
	final := h.snapshot(t1)
	c.untilSeq(t1, final.LastSeq)
	var want []string
	for _, e := range s1.events {
		want = append(want, string(e.Data))
	}
	if got := c.eventLines(t1); !slices.Equal(got, want) {
		t.Errorf("t1 over the connection: %d events, over SSE %d", len(got), len(want))
	}
}
