package gateway_test

// The message queue end to end (docs/protocol.md "Message queue"):
// queued messages start one after another as runs complete, in every tab
// alike; a cancel pauses the queue and nothing starts until a resume; an
// interrupt cancels with its receipt and starts from the resume point;
// edits and removals race a start without ever half-applying; limits and
// bad input get clear errors. The harness's closing `check` verifies
// invariant 11 on every test's database.

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
	"github.com/honestcancel/gateway/tools/email"
)

// heldRun creates a thread, subscribes tabs to it from seq 0 and starts a
// run from the first tab whose model stream stops after its first chunk
// until release is called. It returns once every tab saw the first delta.
func (h *harness) heldRun(t *testing.T, tabs int, userMessage string) (threadID, runID string, release func(), clients []*wsClient) {
	t.Helper()
	release = h.model.hold()
	t.Cleanup(release)
	threadID, runID, clients = h.tabsMidRun(t, tabs, userMessage, 1)
	return threadID, runID, release, clients
}

// queueOf returns the queue object of a queue.updated event or snapshot.
func queueOf(t *testing.T, m map[string]any) (items []map[string]any, paused bool, reason any) {
	t.Helper()
	q, ok := m["queue"].(map[string]any)
	if !ok {
		t.Fatalf("no queue object in %v", m)
	}
	for _, it := range q["items"].([]any) {
		items = append(items, it.(map[string]any))
	}
	return items, q["paused"] == true, q["paused_reason"]
}

func itemTexts(items []map[string]any) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, wsStr(it, "user_message"))
	}
	return out
}

// untilQueue waits until the tab's queue, as its latest queue.updated
// says, holds items whose texts are want, and returns that event.
func (c *wsClient) untilQueue(threadID string, want ...string) map[string]any {
	c.t.Helper()
	is := func(m map[string]any) bool {
		items, _, _ := queueOf(c.t, m)
		return strings.Join(itemTexts(items), "\x00") == strings.Join(want, "\x00")
	}
	evs := c.view(threadID).events
	for i := len(evs) - 1; i >= 0; i-- {
		if m := evs[i].m; m["type"] == chat.EventQueueUpdated {
			if is(m) {
				return m
			}
			break
		}
	}
	seen := c.until("queue "+strings.Join(want, ","), func(m map[string]any) bool {
		return m["type"] == chat.EventQueueUpdated && m["thread_id"] == threadID && is(m)
	})
	return seen[len(seen)-1]
}

// startedFrom returns the run.started of the run started from item,
// applied already or read now.
func (c *wsClient) startedFrom(threadID, itemID string) map[string]any {
	c.t.Helper()
	return c.seenOrUntil(threadID, "run.started from "+itemID, func(m map[string]any) bool {
		return m["type"] == chat.EventRunStarted && m["queue_item_id"] == itemID
	})
}

// endOf returns the run's event of typ, applied already (a command's
// answer read after it) or read now.
func (c *wsClient) endOf(threadID, typ, runID string) map[string]any {
	c.t.Helper()
	return c.seenOrUntil(threadID, typ+" "+runID, func(m map[string]any) bool {
		return m["type"] == typ && m["run_id"] == runID
	})
}

// seenOrUntil returns the first event of the thread matching pred among
// those applied, or reads until one comes: a command's answer may have
// been read after the event awaited (with a model at no pace, a run ends
// in milliseconds).
func (c *wsClient) seenOrUntil(threadID, what string, pred func(map[string]any) bool) map[string]any {
	c.t.Helper()
	for _, it := range c.view(threadID).events {
		if pred(it.m) {
			return it.m
		}
	}
	seen := c.until(what, func(m map[string]any) bool { return m["thread_id"] == threadID && !wsIsAnswer(m) && pred(m) })
	return seen[len(seen)-1]
}

// TestQueueStartsEachItemWhenTheRunBeforeCompletes: two tabs queue one
// message each while a reply streams; both tabs see the same queue; each
// item starts, in order, in the transaction that completes the run before
// it (run.completed, then the item's user message and run.started with
// queue_item_id, then queue.updated without it), and the conversation
// ends up as if each had been sent after the previous reply.
func TestQueueStartsEachItemWhenTheRunBeforeCompletes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 0)
	th, run1, release1, tabs := h.heldRun(t, 2, "Explain backpressure")
	a, b := tabs[0], tabs[1]

	add1 := a.ack(map[string]any{"type": "queue.add", "thread_id": th, "user_message": "And flow control?"})
	wsWantKeys(t, "queue.add ack", add1, "type", "re", "item_id", "position", "state_version")
	item1 := wsStr(add1, "item_id")
	if !strings.HasPrefix(item1, chat.PrefixQueueItem) || wsNum(add1, "position") != 1 {
		t.Fatalf("queue.add ack %v", add1)
	}
	for _, c := range tabs {
		ev := c.untilQueue(th, "And flow control?")
		items, paused, reason := queueOf(t, ev)
		if paused || reason != nil || items[0]["mode"] != chat.QueueAfter || !strings.HasPrefix(wsStr(items[0], "requested_by"), "tab:") ||
			wsNum(ev, "state_version") != wsNum(add1, "state_version") {
			t.Errorf("%s: queue.updated %v", c.name, ev)
		}
	}
	add2 := b.ack(map[string]any{"type": "queue.add", "thread_id": th, "user_message": "And credit-based schemes?", "mode": "after"})
	item2 := wsStr(add2, "item_id")
	if wsNum(add2, "position") != 2 {
		t.Fatalf("second queue.add ack %v", add2)
	}
	for _, c := range tabs {
		c.untilQueue(th, "And flow control?", "And credit-based schemes?")
	}
	if snap := h.snapshot(th); snap.Queue == nil || len(snap.Queue.Items) != 2 || snap.Queue.Items[1].ItemID != item2 ||
		snap.ActiveRun == nil || snap.ActiveRun.RunID != run1 {
		t.Fatalf("snapshot while two wait: queue %+v, active %+v", snap.Queue, snap.ActiveRun)
	}

	// Hold the next run too, so the test sees the second item wait.
	release2 := h.model.hold()
	t.Cleanup(release2)
	release1()
	var run2 string
	for _, c := range tabs {
		c.endOf(th, chat.EventRunCompleted, run1)
		started := c.startedFrom(th, item1)
		run2 = wsStr(started, "run_id")
		c.untilQueue(th, "And credit-based schemes?")
	}
	// The completion and the start are one transaction: no event between
	// run.completed and the start's own.
	var order []string
	for _, it := range a.view(th).events {
		if it.m["type"] != chat.EventMessageDelta {
			order = append(order, wsStr(it.m, "type"))
		}
	}
	joined := strings.Join(order, " ")
	if !strings.Contains(joined, "run.completed message.published checkpoint.created run.started queue.updated") {
		t.Errorf("events around the start: %s", joined)
	}
	if r := h.run(run2); r.QueueItemID != item1 {
		t.Errorf("run %s: queue_item_id %q, want %s", run2, r.QueueItemID, item1)
	}

	h.model.free()
	release2()
	for _, c := range tabs {
		c.endOf(th, chat.EventRunCompleted, run2)
		run3 := wsStr(c.startedFrom(th, item2), "run_id")
		c.untilQueue(th)
		c.endOf(th, chat.EventRunCompleted, run3)
	}
	snap := h.snapshot(th)
	var users []string
	for _, m := range snap.Messages {
		if m.Role == chat.RoleUser {
			users = append(users, m.Content)
		}
	}
	if strings.Join(users, "|") != "Explain backpressure|And flow control?|And credit-based schemes?" || len(snap.Messages) != 6 ||
		len(snap.Queue.Items) != 0 || snap.Queue.Paused {
		t.Errorf("conversation after the queue ran: users %q, %d messages, queue %+v", users, len(snap.Messages), snap.Queue)
	}
}

// TestQueueCancelPausesUntilResume: a Stop pauses the queue: the receipt
// counts what waits, nothing starts, a new tab's snapshot shows the pause;
// queue.resume starts the first item at once and the rest follow.
func TestQueueCancelPausesUntilResume(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 0)
	th, run1, _, tabs := h.heldRun(t, 2, "Explain backpressure")
	a, b := tabs[0], tabs[1]
	a.ack(map[string]any{"type": "queue.add", "thread_id": th, "user_message": "first queued"})
	a.ack(map[string]any{"type": "queue.add", "thread_id": th, "user_message": "second queued"})
	b.untilQueue(th, "first queued", "second queued")

	b.ack(map[string]any{"type": "run.cancel", "run_id": run1})
	for _, c := range tabs {
		done := c.endOf(th, chat.EventRunCancelled, run1)
		if wsNum(done, "queued_messages") != 2 {
			t.Errorf("%s: receipt %v: want queued_messages 2", c.name, done)
		}
		ev := c.seenOrUntil(th, "the pause", func(m map[string]any) bool {
			return m["type"] == chat.EventQueueUpdated && wsNum(m, "seq") > wsNum(done, "seq")
		})
		if items, paused, reason := queueOf(t, ev); !paused || reason != chat.PausedRunCancelled || len(items) != 2 ||
			wsNum(ev, "seq") != wsNum(done, "seq")+1 {
			t.Errorf("%s: queue after a cancel: %v", c.name, ev)
		}
	}
	// The end of the run and the pause are one transaction: at rest now,
	// and nothing was started.
	snap := h.snapshot(th)
	if snap.ActiveRun != nil || !snap.Queue.Paused || len(snap.Queue.Items) != 2 {
		t.Fatalf("after the cancel: active %+v, queue %+v", snap.ActiveRun, snap.Queue)
	}
	for _, it := range a.view(th).events {
		if it.m["type"] == chat.EventRunStarted && it.m["run_id"] != run1 {
			t.Errorf("a run started after the cancel: %s", it.raw)
		}
	}
	// A tab opened now sees the pause in its snapshot.
	c := h.dial(t)
	c.subscribe(th, nil)
	first := c.until("snapshot", func(m map[string]any) bool { return m["type"] == chat.EventThreadSnapshot })
	if items, paused, reason := queueOf(t, first[len(first)-1]); len(items) != 2 || !paused || reason != chat.PausedRunCancelled {
		t.Errorf("new tab's snapshot queue: %v", first[len(first)-1]["queue"])
	}

	// A stale resume is a conflict; a current one starts the first item.
	stale := a.cmd(map[string]any{"type": "queue.resume", "thread_id": th, "expected_state_version": snap.StateVersion - 1})
	if stale["error"] != chat.CodeStateVersionConflict {
		t.Errorf("stale resume: %v", stale)
	}
	h.model.free()
	res := a.ack(map[string]any{"type": "queue.resume", "thread_id": th, "expected_state_version": snap.StateVersion})
	run2 := wsStr(res, "run_id")
	if !strings.HasPrefix(run2, chat.PrefixRun) {
		t.Fatalf("resume ack %v: want the run it started", res)
	}
	for _, c := range tabs {
		ev := c.untilQueue(th, "second queued")
		if _, paused, _ := queueOf(t, ev); paused {
			t.Errorf("%s: queue still paused after resume: %v", c.name, ev)
		}
		c.endOf(th, chat.EventRunCompleted, run2)
		c.untilQueue(th)
	}
	if again := a.ack(map[string]any{"type": "queue.resume", "thread_id": th}); wsStr(again, "run_id") != "" {
		t.Errorf("resume of a queue not paused started %v", again)
	}
}

// TestQueueInterrupt: an interrupt item cancels the active run with its
// honest receipt (reason interrupted, requested by the tab), then starts
// from the cancel's resume point, in every tab; an after item queued
// before it keeps waiting (an interrupt does not pause the queue) and
// starts when the interrupt's run completes.
func TestQueueInterrupt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 0)
	th, run1, _, tabs := h.heldRun(t, 2, "endless: a story")
	// run1 stays held by its own gate; runs started from now on are not.
	// Freeing after the interrupt's ack would race its run's start, which
	// may take the gate first and hold forever.
	h.model.free()
	a, b := tabs[0], tabs[1]
	a.ack(map[string]any{"type": "queue.add", "thread_id": th, "user_message": "after one"})
	b.ack(map[string]any{"type": "hello", "tab_id": "tab-b"})
	add := b.ack(map[string]any{"type": "queue.add", "thread_id": th, "user_message": "Stop, answer this instead",
		"mode": "interrupt"})
	item := wsStr(add, "item_id")
	if wsNum(add, "position") != 1 || add["interrupted_run_id"] != run1 {
		t.Fatalf("interrupt ack %v", add)
	}
	var run2 string
	for _, c := range tabs {
		req := c.endOf(th, chat.EventRunCancelRequested, run1)
		if req["reason"] != chat.ReasonInterrupted || req["requested_by"] != "tab:tab-b" {
			t.Errorf("%s: cancel_requested %v", c.name, req)
		}
		done := c.endOf(th, chat.EventRunCancelled, run1)
		if wsNum(done, "queued_messages") != 1 || wsNum(done, "discarded_stream_chars") <= 0 {
			t.Errorf("%s: receipt %v: want 1 queued message and the discarded text counted", c.name, done)
		}
		started := c.startedFrom(th, item)
		run2 = wsStr(started, "run_id")
		if started["base_checkpoint_id"] == done["resume_checkpoint_id"] {
			t.Errorf("the interrupt's run starts from its own user message's checkpoint, not the resume point itself")
		}
		ev := c.untilQueue(th, "after one")
		if _, paused, _ := queueOf(t, ev); paused {
			t.Errorf("%s: an interrupt paused the queue: %v", c.name, ev)
		}
		c.endOf(th, chat.EventRunCompleted, run2)
		c.untilQueue(th)
	}
	run := h.run(run1)
	if run.Status != chat.RunCancelled || run.CancelReason == nil || *run.CancelReason != chat.ReasonInterrupted {
		t.Errorf("interrupted run: %+v", run)
	}
	msgs := h.snapshot(th).Messages
	var users []string
	for _, m := range msgs {
		if m.Role == chat.RoleUser {
			users = append(users, m.Content)
		}
	}
	if strings.Join(users, "|") != "endless: a story|Stop, answer this instead|after one" {
		t.Errorf("users' messages: %q", users)
	}
}

// TestQueueEditsAndRemovals: update (text, place) and remove in one tab
// show in the other; a stale expected_state_version is a conflict that
// changes nothing; an item that started or was removed is not_found,
// saying which.
func TestQueueEditsAndRemovals(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 0)
	th, run1, release, tabs := h.heldRun(t, 2, "Explain backpressure")
	a, b := tabs[0], tabs[1]
	var ids []string
	for _, text := range []string{"one", "two", "three"} {
		ids = append(ids, wsStr(a.ack(map[string]any{"type": "queue.add", "thread_id": th, "user_message": text}), "item_id"))
	}
	b.untilQueue(th, "one", "two", "three")
	up := b.ack(map[string]any{"type": "queue.update", "thread_id": th, "item_id": ids[2], "user_message": "THREE", "position": 1})
	wsWantKeys(t, "queue.update ack", up, "type", "re", "item_id", "state_version")
	a.untilQueue(th, "THREE", "one", "two")
	stale := a.cmd(map[string]any{"type": "queue.remove", "thread_id": th, "item_id": ids[0],
		"expected_state_version": wsNum(up, "state_version") - 1})
	if stale["error"] != chat.CodeStateVersionConflict {
		t.Errorf("stale remove: %v", stale)
	}
	a.ack(map[string]any{"type": "queue.remove", "thread_id": th, "item_id": ids[0],
		"expected_state_version": wsNum(up, "state_version")})
	b.untilQueue(th, "THREE", "two")
	if again := b.cmd(map[string]any{"type": "queue.remove", "thread_id": th, "item_id": ids[0]}); again["error"] != chat.CodeNotFound ||
		!strings.Contains(wsStr(again, "message"), "removed") {
		t.Errorf("remove of a removed item: %v", again)
	}
	if edit := b.cmd(map[string]any{"type": "queue.update", "thread_id": th, "item_id": ids[0], "user_message": "x"}); edit["error"] != chat.CodeNotFound {
		t.Errorf("edit of a removed item: %v", edit)
	}
	if unknown := b.cmd(map[string]any{"type": "queue.update", "thread_id": th, "item_id": "qi_nope", "position": 1}); unknown["error"] != chat.CodeNotFound {
		t.Errorf("unknown item: %v", unknown)
	}
	h.model.free()
	release()
	a.endOf(th, chat.EventRunCompleted, run1)
	started := a.startedFrom(th, ids[2])
	edited := a.cmd(map[string]any{"type": "queue.update", "thread_id": th, "item_id": ids[2], "user_message": "too late"})
	if edited["error"] != chat.CodeNotFound || !strings.Contains(wsStr(edited, "message"), wsStr(started, "run_id")) {
		t.Errorf("edit of a started item: %v", edited)
	}
	a.endOf(th, chat.EventRunCompleted, wsStr(started, "run_id"))
	last := a.startedFrom(th, ids[1])
	a.endOf(th, chat.EventRunCompleted, wsStr(last, "run_id"))
	var users []string
	for _, m := range h.snapshot(th).Messages {
		if m.Role == chat.RoleUser {
			users = append(users, m.Content)
		}
	}
	if strings.Join(users, "|") != "Explain backpressure|THREE|two" {
		t.Errorf("sent: %q (the edit and the order must hold, the removed item must not start)", users)
	}
}

// TestQueueLimitsAndBadInput: the 21st item, a text over 32 KiB, an unknown
// mode, an empty update and a foreign thread are refused clearly; nothing
// changes.
func TestQueueLimitsAndBadInput(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 0)
	th, _, _, tabs := h.heldRun(t, 1, "endless: hold")
	a := tabs[0]
	for i := range chat.MaxQueueItems {
		a.ack(map[string]any{"type": "queue.add", "thread_id": th, "user_message": "item " + string(rune('a'+i))})
	}
	before := h.snapshotBytes(th)
	full := a.cmd(map[string]any{"type": "queue.add", "thread_id": th, "user_message": "one too many"})
	if full["error"] != chat.CodeInvalidRequest || !strings.Contains(wsStr(full, "message"), "20") {
		t.Errorf("21st item: %v", full)
	}
	for name, fields := range map[string]map[string]any{
		"too long":     {"type": "queue.add", "thread_id": th, "user_message": strings.Repeat("x", chat.MaxUserMessageBytes+1)},
		"empty":        {"type": "queue.add", "thread_id": th, "user_message": ""},
		"no message":   {"type": "queue.add", "thread_id": th},
		"bad mode":     {"type": "queue.add", "thread_id": th, "user_message": "x", "mode": "later"},
		"empty update": {"type": "queue.update", "thread_id": th, "item_id": "qi_x"},
		"bad position": {"type": "queue.update", "thread_id": th, "item_id": "qi_x", "position": 0},
		"no item":      {"type": "queue.remove", "thread_id": th},
		"extra field":  {"type": "queue.resume", "thread_id": th, "paused": false},
	} {
		if r := a.cmd(fields); r["error"] != chat.CodeInvalidRequest {
			t.Errorf("%s: %v", name, r)
		}
	}
	if r := a.cmd(map[string]any{"type": "queue.add", "thread_id": "thr_someone_elses", "user_message": "x"}); r["error"] != chat.CodeNotFound {
		t.Errorf("foreign thread: %v", r)
	}
	if after := h.snapshotBytes(th); after != before {
		t.Errorf("refused commands changed the thread")
	}
}

// TestQueueIdleAddStartsAtOnceAndRetries: with no run active an added
// message starts at once (position 0, the run named); the same
// client_request_id returns the same item and starts nothing twice.
func TestQueueIdleAddStartsAtOnceAndRetries(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 0)
	snap := h.createThread("")
	a := h.dial(t)
	a.subscribe(snap.ThreadID, wsAfter(0))
	add := a.ack(map[string]any{"type": "queue.add", "thread_id": snap.ThreadID, "user_message": "hello there",
		"client_request_id": "r-1"})
	runID := wsStr(add, "run_id")
	if wsNum(add, "position") != 0 || !strings.HasPrefix(runID, chat.PrefixRun) {
		t.Fatalf("idle queue.add ack %v", add)
	}
	a.untilEvent(snap.ThreadID, chat.EventRunCompleted, runID)
	again := a.ack(map[string]any{"type": "queue.add", "thread_id": snap.ThreadID, "user_message": "hello there",
		"client_request_id": "r-1"})
	if again["item_id"] != add["item_id"] || again["run_id"] != runID {
		t.Errorf("retry %v, first %v", again, add)
	}
	if n := len(h.snapshot(snap.ThreadID).Messages); n != 2 {
		t.Errorf("%d messages after a retried add, want 2", n)
	}
}

// TestQueueOverHTTP: the HTTP routes answer the acks, and a removal that
// races the run's completion either removes the item or finds it started,
// never both, never neither.
func TestQueueOverHTTP(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 0)
	for round := range 8 {
		release := h.model.hold()
		snap := h.createThread("")
		th := snap.ThreadID
		ack := h.startRun(th, snap.StateVersion, "Explain backpressure")
		var add chat.QueueAddAck
		h.call(http.MethodPost, "/api/threads/"+th+"/queue", map[string]any{"user_message": "next"}, http.StatusCreated, &add)
		if add.Position != 1 {
			t.Fatalf("round %d: add over HTTP %+v", round, add)
		}
		var up chat.QueueItemAck
		h.call(http.MethodPatch, "/api/threads/"+th+"/queue/"+add.ItemID, map[string]any{"user_message": "next, edited"}, http.StatusOK, &up)
		h.model.free()
		var wg sync.WaitGroup
		var rm reply
		wg.Go(func() { rm = h.do(http.MethodDelete, "/api/threads/"+th+"/queue/"+add.ItemID, nil) })
		release()
		wg.Wait()
		h.pollRun(ack.RunID)
		snap = h.snapshot(th)
		var runs []string
		for _, m := range snap.Messages {
			if m.Role == chat.RoleUser && m.Content == "next, edited" {
				runs = append(runs, m.MessageID)
			}
		}
		switch rm.status {
		case http.StatusOK:
			if len(runs) != 0 {
				t.Errorf("round %d: removed, yet sent: %v", round, snap.Messages)
			}
		case http.StatusNotFound:
			if len(runs) != 1 {
				t.Errorf("round %d: remove said it started, but %d copies were sent", round, len(runs))
			}
			if snap.ActiveRun != nil {
				h.pollRun(snap.ActiveRun.RunID)
			}
		default:
			t.Errorf("round %d: remove answered %v", round, rm)
		}
	}
	snap := h.createThread("")
	if r := h.do(http.MethodPost, "/api/threads/"+snap.ThreadID+"/queue/resume", nil); r.status != http.StatusOK {
		t.Errorf("resume over HTTP: %v", r)
	}
}

// TestQueueBehindAConfirmation: a run waiting for a confirmation is active,
// so a queued message waits behind it; an interrupt then cancels it as a
// Stop does (the email never sent, its operation voided, not_started in the
// receipt) and the interrupt's run starts; the after item keeps waiting
// behind the new run and starts when it completes.
func TestQueueBehindAConfirmation(t *testing.T) {
	t.Parallel()
	h := newToolHarness(t, 0, email.OutboxConfig{})
	snap := h.createThread("")
	th := snap.ThreadID
	s := h.openSSE(th, "after_seq=0", "")
	ack, op, _ := h.askEmail(s, th, "ann@example.com", "Send an email to ann@example.com about the quote")
	var after chat.QueueAddAck
	h.call(http.MethodPost, "/api/threads/"+th+"/queue", map[string]any{"user_message": "then say hi"}, http.StatusCreated, &after)
	if after.Position != 1 || after.RunID != "" {
		t.Fatalf("add behind a confirmation: %+v", after)
	}
	var now chat.QueueAddAck
	h.call(http.MethodPost, "/api/threads/"+th+"/queue", map[string]any{"user_message": "never mind, tell me a joke",
		"mode": "interrupt"}, http.StatusCreated, &now)
	if now.Interrupted != ack.RunID || now.Position != 1 {
		t.Fatalf("interrupt of a run waiting for a confirmation: %+v", now)
	}
	var receipt, started *wireEvent
	s.waitFor("the interrupt's run", func(e *wireEvent) bool {
		if e.Type == chat.EventRunCancelled && e.RunID == ack.RunID {
			receipt = e
		}
		if e.Type == chat.EventRunStarted && strings.Contains(string(e.Data), now.ItemID) {
			started = e
		}
		return started != nil
	})
	if receipt == nil || !strings.Contains(string(receipt.Data), `"outcome":"not_started"`) ||
		!strings.Contains(string(receipt.Data), `"queued_messages":1`) {
		t.Fatalf("receipt %v: want the email not_started and one message waiting", receipt)
	}
	if got := h.onlyOp(th); got.OperationID != op.OperationID || got.Phase != chat.PhaseVoided {
		t.Errorf("the email after the interrupt: %+v", got)
	}
	if len(h.accepted()) != 0 {
		t.Errorf("the provider accepted %v", h.accepted())
	}
	s.waitFor("the after item's start", func(e *wireEvent) bool {
		return e.Type == chat.EventRunStarted && strings.Contains(string(e.Data), after.ItemID)
	})
}

// TestQueueRacesWithTheStart: an edit racing the completion that starts
// its item lands before the start (the run sends the edited text) or after
// it (not_found, the original text sent), never both, never half; two tabs
// adding at the same moment both get an item, at distinct places, and both
// tabs see one same queue.
func TestQueueRacesWithTheStart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 0)
	edited, late := 0, 0
	for round := range 8 {
		release := h.model.hold()
		snap := h.createThread("")
		th := snap.ThreadID
		ack := h.startRun(th, snap.StateVersion, "Explain backpressure")
		var add chat.QueueAddAck
		h.call(http.MethodPost, "/api/threads/"+th+"/queue", map[string]any{"user_message": "original"}, http.StatusCreated, &add)
		h.model.free()
		var wg sync.WaitGroup
		var up reply
		wg.Go(func() {
			up = h.do(http.MethodPatch, "/api/threads/"+th+"/queue/"+add.ItemID, map[string]any{"user_message": "edited"})
		})
		release()
		wg.Wait()
		h.pollRun(ack.RunID)
		var sent []string
		for _, m := range h.snapshot(th).Messages {
			if m.Role == chat.RoleUser && m.Content != "Explain backpressure" {
				sent = append(sent, m.Content)
			}
		}
		switch {
		case up.status == http.StatusOK && len(sent) == 1 && sent[0] == "edited":
			edited++
		case up.status == http.StatusNotFound && len(sent) == 1 && sent[0] == "original":
			late++
		default:
			t.Errorf("round %d: the edit answered %v and the conversation sent %q", round, up, sent)
		}
		if a := h.snapshot(th).ActiveRun; a != nil {
			h.pollRun(a.RunID)
		}
	}
	t.Logf("edits before the start: %d, after it: %d", edited, late)

	th, _, _, tabs := h.heldRun(t, 2, "endless: hold")
	a, b := tabs[0], tabs[1]
	for range 5 {
		ia := a.post(map[string]any{"type": "queue.add", "thread_id": th, "user_message": "from a"})
		ib := b.post(map[string]any{"type": "queue.add", "thread_id": th, "user_message": "from b"})
		pa, pb := wsNum(a.answer(ia), "position"), wsNum(b.answer(ib), "position")
		if pa == pb || pa < 1 || pb < 1 {
			t.Fatalf("two adds at once got places %d and %d", pa, pb)
		}
	}
	final := h.snapshot(th).Queue
	if len(final.Items) != 10 {
		t.Fatalf("%d items after 10 adds", len(final.Items))
	}
	var want []string
	for _, it := range final.Items {
		want = append(want, it.UserMessage)
	}
	for _, c := range tabs {
		c.untilQueue(th, want...)
	}
}

// TestQueueCommandsAreRateLimited: queue commands are charged to the same
// per-connection budget as every other command: past it they are refused
// rate_limited, and a refused add queues nothing.
func TestQueueCommandsAreRateLimited(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 0, withWS(gateway.WSConfig{CommandRate: 0.01, CommandBurst: 8}))
	th, _, _, tabs := h.heldRun(t, 1, "endless: hold") // hello-less tab: subscribe and run.start spent 2
	a := tabs[0]
	acked, limited := 0, 0
	for range 10 {
		r := a.cmd(map[string]any{"type": "queue.add", "thread_id": th, "user_message": "one more"})
		switch r["error"] {
		case nil:
			acked++
		case chat.CodeRateLimited:
			limited++
		default:
			t.Fatalf("queue.add: %v", r)
		}
	}
	if acked == 0 || limited == 0 {
		t.Fatalf("%d acked, %d rate_limited: want both", acked, limited)
	}
	if n := len(h.snapshot(th).Queue.Items); n != acked {
		t.Errorf("%d items queued after %d acked adds", n, acked)
	}
}
