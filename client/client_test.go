package client_test

import (
	"errors"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// A run started over the WebSocket streams its reply to the tab that
// subscribed, delta by delta, up to run.completed; the published reply is
// exactly its deltas, and the subscription knows the thread's version.
func TestRunOverWebSocket(t *testing.T) {
	c, th := newThread(t, "")
	conn := connect(t, c, "tab-ws")
	if !strings.HasPrefix(conn.ConnectionID(), "con_") {
		t.Errorf("connection id %q after hello", conn.ConnectionID())
	}
	sub := subscribe(t, conn, th.ThreadID, 0)
	if a := sub.Ack(); !a.Recovered || a.ThreadID != th.ThreadID || a.LastSeq != th.LastSeq || a.StateVersion != th.StateVersion {
		t.Fatalf("subscribe ack %+v for thread %+v", a, th)
	}
	r := newReader(t, sub, th.ThreadID, 0)
	ack, err := conn.StartRun(bounded(t), client.StartRunRequest{ThreadID: th.ThreadID,
		ExpectedStateVersion: th.StateVersion, UserMessage: "Explain goroutines and channels", ClientRequestID: "req-1"})
	if err != nil {
		t.Fatal(err)
	}
	// The server is idle: the start claims its run for a free worker.
	if !strings.HasPrefix(ack.RunID, chat.PrefixRun) || ack.Status != chat.RunRunning || ack.StateVersion <= th.StateVersion {
		t.Fatalf("run.start ack %+v; want a new run, running", ack)
	}
	// A retry with the same client_request_id is the same run.
	again, err := conn.StartRun(bounded(t), client.StartRunRequest{ThreadID: th.ThreadID,
		ExpectedStateVersion: th.StateVersion, UserMessage: "Explain goroutines and channels", ClientRequestID: "req-1"})
	if err != nil || again.RunID != ack.RunID {
		t.Fatalf("retried run.start: %+v, %v; want run %s", again, err, ack.RunID)
	}
	msg, _ := r.deltasOf(ack.RunID, 3)
	r.runEvent(chat.EventRunCompleted, ack.RunID)
	snap, err := c.Thread(bounded(t), th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	last := snap.Messages[len(snap.Messages)-1]
	if last.MessageID != msg || last.Content != r.text(msg) || last.Content == "" {
		t.Fatalf("history ends with %+v; the tab streamed %s: %q", last, msg, r.text(msg))
	}
	if sub.StateVersion() != snap.StateVersion || sub.LastSeq() != snap.LastSeq {
		t.Fatalf("subscription at version %d seq %d; the thread is at %d, %d", sub.StateVersion(), sub.LastSeq(), snap.StateVersion, snap.LastSeq)
	}
	run, err := c.Run(bounded(t), ack.RunID)
	if err != nil || run.Status != chat.RunCompleted || run.ThreadID != th.ThreadID {
		t.Fatalf("GET run: %+v, %v", run, err)
	}
	wantClean(t, conn.Stats())
}

// The same over Server-Sent Events: a run started over HTTP, read on the
// thread's event stream up to run.completed.
func TestRunOverEventStream(t *testing.T) {
	c, th := newThread(t, "sse")
	stream := events(t, c, th.ThreadID, 0)
	r := newReader(t, stream, th.ThreadID, 0)
	ack := startRun(t, c, th, "Explain goroutines and channels")
	msg, _ := r.deltasOf(ack.RunID, 3)
	pub := r.until("the reply", func(ev client.Event) bool {
		p := ev.Published()
		return p != nil && p.Message.MessageID == msg
	})
	if pub.RunID != ack.RunID || pub.Published().Message.Content != r.text(msg) {
		t.Fatalf("published %s", pub.Raw)
	}
	r.runEvent(chat.EventRunCompleted, ack.RunID)
	snap, err := c.Thread(bounded(t), th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	if stream.StateVersion() != snap.StateVersion || stream.LastSeq() != snap.LastSeq {
		t.Fatalf("stream at version %d seq %d; the thread is at %d, %d", stream.StateVersion(), stream.LastSeq(), snap.StateVersion, snap.LastSeq)
	}
	if st := stream.Stats(); st.Connects != 1 {
		t.Fatalf("stream stats %+v, want one connection", st)
	}
	wantClean(t, stream.Stats())
}

// A tab cancels a reply mid-stream over the WebSocket: the ack comes at
// once, run.cancel_requested names the tab, and run.cancelled carries the
// receipt: nothing of the reply published, everything streamed counted as
// discarded, the checkpoint to continue from. A second cancel, over HTTP,
// changes nothing and says so.
func TestCancelMidReply(t *testing.T) {
	c, th := newThread(t, "", client.WithClientName("cli-test"))
	conn := connect(t, c, "tab-cancel")
	r := newReader(t, subscribe(t, conn, th.ThreadID, 0), th.ThreadID, 0)
	run := startRun(t, c, th, longRequest)
	reply, _ := r.deltasOf(run.RunID, 2)
	ack, err := conn.CancelRun(bounded(t), client.CancelRunRequest{RunID: run.RunID, Reason: "enough"})
	if err != nil {
		t.Fatal(err)
	}
	if ack.RunID != run.RunID || ack.Status != chat.RunCancelRequested || ack.AlreadyRequested ||
		ack.AcceptedStateVersion <= run.StateVersion || ack.ResumeCheckpointID == "" || ack.PublishedMessageID == nil {
		t.Fatalf("cancel ack %+v", ack)
	}
	req := r.runEvent(chat.EventRunCancelRequested, run.RunID)
	if b := req.Body.(*chat.RunCancelRequestedBody); b.Reason != "enough" || b.RequestedBy != "tab:tab-cancel" || req.StateVersion != ack.AcceptedStateVersion {
		t.Fatalf("run.cancel_requested %s: want reason enough, requested_by tab:tab-cancel, version %d", req.Raw, ack.AcceptedStateVersion)
	}
	var got *chat.RunCancelledBody
	r.until("run.cancelled", func(ev client.Event) bool {
		if p := ev.Published(); p != nil && p.Message.MessageID == reply {
			t.Fatalf("the reply of the cancelled run was published: %s", ev.Raw)
		}
		if ev.RunID == run.RunID && ev.Type == chat.EventRunCancelled {
			got = ev.Cancelled()
			return true
		}
		return false
	})
	streamed := int64(utf8.RuneCountInString(r.text(reply)))
	if got.DiscardedStreamChars < streamed || streamed == 0 || got.ResumeCheckpointID != ack.ResumeCheckpointID ||
		got.PublishedMessageID == nil || *got.PublishedMessageID != *ack.PublishedMessageID || *got.PublishedMessageID == reply ||
		got.ResumePolicy != chat.ResumePolicyRegenerate || got.Operations == nil {
		t.Fatalf("receipt %+v: want ≥ %d characters discarded, the ack's checkpoint %s and message %s (the request), regenerate, operations", got, streamed, ack.ResumeCheckpointID, *ack.PublishedMessageID)
	}
	again, err := c.CancelRun(bounded(t), client.CancelRunRequest{RunID: run.RunID})
	if err != nil || !again.AlreadyRequested || again.Status != chat.RunCancelled {
		t.Fatalf("second cancel: %+v, %v; want already_requested, cancelled", again, err)
	}
	info, err := c.Run(bounded(t), run.RunID)
	if err != nil || info.Status != chat.RunCancelled || info.CancelReason == nil || *info.CancelReason != "enough" ||
		info.RequestedBy == nil || *info.RequestedBy != "tab:tab-cancel" {
		t.Fatalf("GET run: %+v, %v", info, err)
	}
	wantClean(t, conn.Stats())
}

// A command based on a stale state_version is refused with
// state_version_conflict over both transports, as a *client.Error that
// carries the current version, the current checkpoint and what the server
// can do instead; other refusals carry their own details.
func TestStateVersionConflict(t *testing.T) {
	c, th := newThread(t, "")
	conn := connect(t, c, "tab-conflict")
	r := newReader(t, subscribe(t, conn, th.ThreadID, 0), th.ThreadID, 0)
	run := startRun(t, c, th, "Say hello")
	r.runEvent(chat.EventRunCompleted, run.RunID)
	snap, err := c.Thread(bounded(t), th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	stale := client.StartRunRequest{ThreadID: th.ThreadID, ExpectedStateVersion: th.StateVersion, UserMessage: "And again"}
	for name, cmd := range map[string]client.Commander{"http": c, "ws": conn} {
		_, err := cmd.StartRun(bounded(t), stale)
		e := wantError(t, err, chat.CodeStateVersionConflict, http.StatusConflict)
		if e.CurrentStateVersion != snap.StateVersion || e.CurrentCheckpointID != snap.HeadCheckpointID || len(e.AllowedActions) == 0 {
			t.Fatalf("%s: conflict %+v; the thread is at version %d, head %s", name, e, snap.StateVersion, snap.HeadCheckpointID)
		}
		if (name == "ws") != (e.Re != "") {
			t.Fatalf("%s: re %q", name, e.Re)
		}
		var v int64
		if !e.Detail("current_state_version", &v) || v != snap.StateVersion {
			t.Fatalf("%s: Detail(current_state_version) = %d", name, v)
		}
		// A cancel of a run that completed: run_not_active with its status.
		_, err = cmd.CancelRun(bounded(t), client.CancelRunRequest{RunID: run.RunID})
		if e := wantError(t, err, chat.CodeRunNotActive, http.StatusConflict); e.RunID != run.RunID || e.RunStatus != chat.RunCompleted {
			t.Fatalf("%s: run_not_active %+v", name, e)
		}
	}
	// Nothing changed.
	if after, err := c.Thread(bounded(t), th.ThreadID); err != nil || after.StateVersion != snap.StateVersion {
		t.Fatalf("after the refusals: %+v, %v", after.StateVersion, err)
	}
	wantClean(t, conn.Stats())
}

// Every command of the protocol, through the Commander interface, over
// HTTP (events read on the event stream) and over the WebSocket (events
// read on the same connection).
func TestEveryCommand(t *testing.T) {
	base, _ := serve(t)
	c := newClient(t, base, client.WithClientName("cli-test"))
	t.Run("http", func(t *testing.T) {
		th := createThread(t, c, "over http")
		stream := events(t, c, th.ThreadID, 0)
		everyCommand(t, c, c, newReader(t, stream, th.ThreadID, 0), th, "api:cli-test", false)
		wantClean(t, stream.Stats())
	})
	t.Run("ws", func(t *testing.T) {
		th := createThread(t, c, "over ws")
		conn := connect(t, c, "tab-all")
		sub := subscribe(t, conn, th.ThreadID, 0)
		everyCommand(t, c, conn, newReader(t, sub, th.ThreadID, 0), th, "tab:tab-all", true)
		if _, err := sub.Next(bounded(t)); !errors.Is(err, client.ErrThreadDeleted) {
			t.Fatalf("after thread.deleted: %v, want ErrThreadDeleted", err)
		}
		wantClean(t, conn.Stats())
	})
}

func everyCommand(t *testing.T, c *client.Client, cmd client.Commander, r *reader, th chat.Snapshot, requestedBy string, confirm bool) {
	ctx := bounded(t)
	thread := th.ThreadID

	// run.start, then run.cancel after a few deltas.
	run := startRun(t, cmd, th, longRequest)
	msg, lastSeq := r.deltasOf(run.RunID, 3)
	cancel, err := cmd.CancelRun(ctx, client.CancelRunRequest{RunID: run.RunID, Reason: "stop"})
	if err != nil || cancel.Status != chat.RunCancelRequested {
		t.Fatalf("cancel: %+v, %v", cancel, err)
	}
	if ev := r.runEvent(chat.EventRunCancelRequested, run.RunID); ev.Body.(*chat.RunCancelRequestedBody).RequestedBy != requestedBy {
		t.Fatalf("run.cancel_requested %s, want requested_by %s", ev.Raw, requestedBy)
	}
	r.runEvent(chat.EventRunCancelled, run.RunID)

	// fragment.save of what was streamed up to the third delta.
	saved, err := cmd.SaveFragment(ctx, client.SaveFragmentRequest{ThreadID: thread, MessageID: msg, LastSeq: lastSeq, ExpectedStateVersion: r.version})
	if err != nil {
		t.Fatalf("fragment.save: %v", err)
	}
	var want strings.Builder
	for _, ev := range r.events {
		if d := ev.Delta(); d != nil && d.MessageID == msg && ev.Seq <= lastSeq {
			want.WriteString(d.Text)
		}
	}
	pub := r.until("the fragment", func(ev client.Event) bool {
		p := ev.Published()
		return p != nil && p.Message.MessageID == saved.MessageID
	})
	if m := pub.Published().Message; m.Kind != chat.KindFragment || m.Content != want.String() || m.FragmentOf == nil || m.FragmentOf.MessageID != msg || pub.RunID != "" {
		t.Fatalf("fragment %s, want kind fragment of %s with %q", pub.Raw, msg, want.String())
	}
	r.until("the fragment's checkpoint", func(ev client.Event) bool { return ev.StateVersion == saved.StateVersion })

	// draft.delete of that fragment.
	draft, err := cmd.DeleteDraft(ctx, client.DeleteDraftRequest{ThreadID: thread, MessageID: saved.MessageID, ExpectedStateVersion: saved.StateVersion})
	if err != nil {
		t.Fatalf("draft.delete: %v", err)
	}
	del := r.until("message.deleted", func(ev client.Event) bool { return ev.Type == chat.EventMessageDeleted })
	if b := del.Body.(*chat.MessageDeletedBody); b.MessageID != saved.MessageID || b.CheckpointID != draft.CheckpointID || del.StateVersion > draft.StateVersion {
		t.Fatalf("message.deleted %s, want %s at %s, version up to %d", del.Raw, saved.MessageID, draft.CheckpointID, draft.StateVersion)
	}
	if r.version < draft.StateVersion {
		r.until("the draft's last event", func(ev client.Event) bool { return ev.StateVersion == draft.StateVersion })
	}

	// thread.fork from the head, and the checkpoints list.
	fork, err := cmd.Fork(ctx, thread, draft.CheckpointID)
	if err != nil || !strings.HasPrefix(fork.NewThreadID, chat.PrefixThread) || fork.NewThreadID == thread {
		t.Fatalf("thread.fork: %+v, %v", fork, err)
	}
	forked, err := c.Thread(ctx, fork.NewThreadID)
	if err != nil || forked.HeadCheckpointID != fork.HeadCheckpointID {
		t.Fatalf("the fork: %+v, %v", forked, err)
	}
	cps, err := c.Checkpoints(ctx, thread)
	if err != nil || cps.HeadCheckpointID != draft.CheckpointID || len(cps.Checkpoints) < 3 {
		t.Fatalf("checkpoints: %+v, %v", cps, err)
	}

	// The history, read back one message a page, is the snapshot's.
	snap, err := c.Thread(ctx, thread)
	if err != nil || len(snap.Messages) == 0 {
		t.Fatalf("the thread: %+v, %v", snap, err)
	}
	var paged []string
	for before := ""; ; {
		page, err := c.History(ctx, thread, before, 1)
		if err != nil || len(page.Messages) != 1 || page.HeadCheckpointID != snap.HeadCheckpointID {
			t.Fatalf("history before %q: %+v, %v", before, page, err)
		}
		paged = append([]string{page.Messages[0].MessageID}, paged...)
		if page.NextBefore == nil {
			break
		}
		before = *page.NextBefore
	}
	for i, m := range snap.Messages {
		if i >= len(paged) || paged[i] != m.MessageID {
			t.Fatalf("history paged %v, the snapshot holds %d messages", paged, len(snap.Messages))
		}
	}

	// thread.checkout of the thread's first checkpoint.
	first := cps.Checkpoints[0].CheckpointID
	co, err := cmd.Checkout(ctx, client.CheckoutRequest{ThreadID: thread, CheckpointID: first, ExpectedStateVersion: draft.StateVersion})
	if err != nil || co.HeadCheckpointID != first {
		t.Fatalf("thread.checkout: %+v, %v", co, err)
	}
	moved := r.until("thread.head_moved", func(ev client.Event) bool { return ev.Type == chat.EventThreadHeadMoved })
	if b := moved.Body.(*chat.ThreadHeadMovedBody); b.HeadCheckpointID != first || b.PreviousHeadCheckpointID != draft.CheckpointID {
		t.Fatalf("thread.head_moved %s", moved.Raw)
	}

	// A consequential tool call, confirmed (or rejected).
	email, err := cmd.StartRun(ctx, client.StartRunRequest{ThreadID: thread, ExpectedStateVersion: co.StateVersion,
		UserMessage: "Please send an email to ann@example.com about the delivery schedule for next week"})
	if err != nil {
		t.Fatal(err)
	}
	prepared := r.runEvent(chat.EventToolPrepared, email.RunID).Body.(*chat.ToolBody).Operation
	waiting := r.runEvent(chat.EventRunWaitingConfirmation, email.RunID)
	if op := waiting.Body.(*chat.RunWaitingConfirmationBody).OperationID; op != prepared.OperationID || prepared.Phase != chat.PhasePrepared || prepared.Tool != "send_email" {
		t.Fatalf("waiting for %s; prepared %+v", op, prepared)
	}
	decide, wantPhase := cmd.RejectTool, chat.PhaseRejected
	if confirm {
		decide, wantPhase = cmd.ConfirmTool, chat.PhaseConfirmed
	}
	decided, err := decide(ctx, prepared.OperationID, waiting.StateVersion)
	if err != nil || decided.OperationID != prepared.OperationID || decided.Phase != wantPhase {
		t.Fatalf("decision: %+v, %v; want phase %s", decided, err, wantPhase)
	}
	r.runEvent(chat.EventRunCompleted, email.RunID)
	// Deciding again, at the current version: operation_not_pending, with
	// the phase it is in.
	_, err = decide(ctx, prepared.OperationID, r.version)
	if e := wantError(t, err, chat.CodeOperationNotPending, http.StatusConflict); e.OperationID != prepared.OperationID || e.Phase == "" {
		t.Fatalf("second decision: %+v", e)
	}
	ops, err := c.Operations(ctx, thread)
	if err != nil || len(ops) != 1 || ops[0].OperationID != prepared.OperationID {
		t.Fatalf("operations: %+v, %v", ops, err)
	}
	if want := map[bool]string{true: chat.PhaseCommitted, false: chat.PhaseRejected}[confirm]; ops[0].Phase != want {
		t.Fatalf("operation phase %s, want %s", ops[0].Phase, want)
	}

	// thread.delete: thread.deleted is the thread's last event.
	gone, err := cmd.DeleteThread(ctx, client.DeleteThreadRequest{ThreadID: thread, ExpectedStateVersion: r.version})
	if err != nil || gone.ThreadID != thread {
		t.Fatalf("thread.delete: %+v, %v", gone, err)
	}
	r.until("thread.deleted", func(ev client.Event) bool { return ev.Type == chat.EventThreadDeleted })
	_, err = c.Thread(ctx, thread)
	wantError(t, err, chat.CodeNotFound, http.StatusNotFound)
}

// The thread list: pages by cursor, and q searches titles.
func TestListThreads(t *testing.T) {
	base, _ := serve(t)
	c := newClient(t, base)
	for _, title := range []string{"alpha notes", "beta zebra", "gamma notes"} {
		createThread(t, c, title)
	}
	seen := map[string]bool{}
	page, err := c.ListThreads(bounded(t), client.ListThreadsOptions{Limit: 2})
	if err != nil || len(page.Threads) != 2 || page.NextCursor == "" {
		t.Fatalf("first page: %+v, %v", page, err)
	}
	for _, th := range page.Threads {
		seen[th.Title] = true
	}
	page, err = c.ListThreads(bounded(t), client.ListThreadsOptions{Limit: 2, Cursor: page.NextCursor})
	if err != nil || len(page.Threads) != 1 || page.NextCursor != "" || seen[page.Threads[0].Title] {
		t.Fatalf("second page: %+v, %v", page, err)
	}
	page, err = c.ListThreads(bounded(t), client.ListThreadsOptions{Query: "zebra"})
	if err != nil || len(page.Threads) != 1 || page.Threads[0].Title != "beta zebra" {
		t.Fatalf("search: %+v, %v", page, err)
	}
	_, err = c.ListThreads(bounded(t), client.ListThreadsOptions{Limit: 500})
	wantError(t, err, chat.CodeInvalidRequest, http.StatusBadRequest)
}

// A dropped connection loses nothing: the network is cut under a
// WebSocket and under an event stream in the middle of a reply, and each
// reconnects by itself and goes on after the last seq it received, each
// seq once and in order, up to run.completed; the published reply is
// exactly the deltas read across the cut.
func TestReplayAfterForcedDisconnect(t *testing.T) {
	base, _ := serve(t)
	c := newClient(t, base) // commands
	for _, transport := range []string{"ws", "sse"} {
		t.Run(transport, func(t *testing.T) {
			k := newCutter(t)
			watcher := newClient(t, base, client.WithHTTPClient(k.client()), client.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
			th := createThread(t, c, "")
			var src source
			var stats func() client.Stats
			if transport == "ws" {
				conn := connect(t, watcher, "tab-cut")
				src, stats = subscribe(t, conn, th.ThreadID, 0), conn.Stats
			} else {
				stream := events(t, watcher, th.ThreadID, 0)
				src, stats = stream, stream.Stats
			}
			r := newReader(t, src, th.ThreadID, 0)
			run := startRun(t, c, th, longRequest)
			msg, _ := r.deltasOf(run.RunID, 3)
			for cut := 0; cut < 2; cut++ {
				if n := k.cut(); n == 0 {
					t.Fatal("no connection to cut")
				}
				r.deltasOf(run.RunID, 3)
			}
			pub := r.until("the reply", func(ev client.Event) bool {
				p := ev.Published()
				return p != nil && p.Message.MessageID == msg
			})
			if pub.Published().Message.Content != r.text(msg) {
				t.Fatalf("published %q; read across the cuts %q", pub.Published().Message.Content, r.text(msg))
			}
			r.runEvent(chat.EventRunCompleted, run.RunID)
			for i, ev := range r.events {
				if ev.Seq != int64(i+1) {
					t.Fatalf("event %d has seq %d: every seq once, in order, from 1", i, ev.Seq)
				}
			}
			st := stats()
			if st.Connects < 3 || st.Resyncs != 0 {
				t.Fatalf("stats %+v: want 3 connections (two cuts) and no resync (the deltas are still held)", st)
			}
			wantClean(t, st)
			if transport == "ws" {
				// The connection commands again after the cuts.
				conn := connect(t, watcher, "tab-cut-2")
				_, err := conn.CancelRun(bounded(t), client.CancelRunRequest{RunID: run.RunID})
				wantError(t, err, chat.CodeRunNotActive, http.StatusConflict)
			}
		})
	}
}

// A gap the server cannot fill is surfaced, never hidden: a position past
// the thread's end (seqs this server never sent) is answered with a
// snapshot, delivered with Event.Gap; live events follow from its seq.
func TestGapIsSurfaced(t *testing.T) {
	c, th := newThread(t, "")
	beyond := th.LastSeq + 100
	conn := connect(t, c, "tab-gap")
	sub := subscribe(t, conn, th.ThreadID, beyond)
	if sub.Ack().Recovered {
		t.Fatalf("subscribe ack %+v: want recovered false", sub.Ack())
	}
	stream := events(t, c, th.ThreadID, beyond)
	fresh := events(t, c, th.ThreadID, client.FromSnapshot)
	for name, src := range map[string]source{"ws": sub, "sse": stream} {
		ev, err := src.Next(bounded(t))
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type != chat.EventThreadSnapshot || ev.Gap == nil || ev.Gap.After != beyond || ev.Gap.Through != th.LastSeq || ev.Snapshot().ThreadID != th.ThreadID {
			t.Fatalf("%s: first event %v gap %+v, want a snapshot with the gap (%d, %d]", name, ev, ev.Gap, beyond, th.LastSeq)
		}
	}
	if ev, err := fresh.Next(bounded(t)); err != nil || ev.Type != chat.EventThreadSnapshot || ev.Gap != nil {
		t.Fatalf("a stream from a snapshot starts with %v (gap %+v), %v: want a snapshot without a gap", ev, ev.Gap, err)
	}
	if conn.Stats().Resyncs != 1 || stream.Stats().Resyncs != 1 {
		t.Fatalf("resyncs: ws %+v, sse %+v", conn.Stats(), stream.Stats())
	}
	// Live events go on from the snapshot's seq.
	r := newReader(t, sub, th.ThreadID, th.LastSeq)
	run := startRun(t, conn, th, "Say hello")
	r.runEvent(chat.EventRunCompleted, run.RunID)
	if r.events[0].Seq != th.LastSeq+1 {
		t.Fatalf("after the snapshot: seq %d, want %d", r.events[0].Seq, th.LastSeq+1)
	}
}

// The server's refusals arrive as *client.Error with the protocol's code
// and status: unknown ids, invalid requests, a host the server does not
// answer to, a foreign origin.
func TestErrors(t *testing.T) {
	base, _ := serve(t)
	c := newClient(t, base)
	ctx := bounded(t)
	_, err := c.Thread(ctx, "thr_nope")
	wantError(t, err, chat.CodeNotFound, http.StatusNotFound)
	_, err = c.Events(ctx, "thr_nope", 0)
	wantError(t, err, chat.CodeNotFound, http.StatusNotFound)
	conn := connect(t, c, "tab-errors")
	_, err = conn.Subscribe(ctx, "thr_nope", 0)
	if e := wantError(t, err, chat.CodeNotFound, http.StatusNotFound); e.Re == "" {
		t.Fatalf("a WebSocket error without re: %+v", e)
	}
	th := createThread(t, c, "")
	tooLong := strings.Repeat("x", chat.MaxUserMessageBytes+1)
	for name, cmd := range map[string]client.Commander{"http": c, "ws": conn} {
		_, err = cmd.StartRun(ctx, client.StartRunRequest{ThreadID: th.ThreadID, ExpectedStateVersion: th.StateVersion, UserMessage: tooLong})
		if e := wantError(t, err, chat.CodeInvalidRequest, http.StatusBadRequest); !strings.Contains(e.Message, "user_message") {
			t.Fatalf("%s: %+v", name, e)
		}
	}
	wantClean(t, conn.Stats())

	// DNS rebinding: a Host the server does not answer to.
	evil := newClient(t, base, client.WithHost("evil.example"))
	_, err = evil.CreateThread(ctx, "")
	wantError(t, err, chat.CodeForbidden, http.StatusForbidden)
	_, err = evil.Connect(ctx, client.ConnOptions{})
	wantError(t, err, chat.CodeForbidden, http.StatusForbidden)
	// A foreign page's origin is refused; the server's own is not.
	foreign := newClient(t, base, client.WithOrigin("http://evil.example"))
	_, err = foreign.Connect(ctx, client.ConnOptions{})
	wantError(t, err, chat.CodeForbidden, http.StatusForbidden)
	own := newClient(t, base, client.WithOrigin(base))
	connect(t, own, "tab-own-origin")
}

// Close stops everything the client started and waits for it: readers
// blocked in Next return ErrClosed, the Conn's goroutine is gone when
// Close returns, and once the gateway stopped too no goroutine is left.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	before := goleak.IgnoreCurrent()
	base, stop := serve(t)
	c, err := client.New(base)
	if err != nil {
		t.Fatal(err)
	}
	ctx := bounded(t)
	th := createThread(t, c, "")
	conn, err := c.Connect(ctx, client.ConnOptions{TabID: "tab-close"})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := conn.Subscribe(ctx, th.ThreadID, 0)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := c.Events(ctx, th.ThreadID, 0)
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 2)
	for _, src := range []source{sub, stream} {
		go func() {
			for {
				if _, err := src.Next(ctx); err != nil {
					ended <- err
					return
				}
			}
		}()
	}
	// Something to read while they close: a run in flight.
	if _, err := conn.StartRun(ctx, client.StartRunRequest{ThreadID: th.ThreadID, ExpectedStateVersion: th.StateVersion, UserMessage: "Say hello"}); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if stacks := goroutines(); strings.Contains(stacks, "client.(*Conn)") {
		t.Fatalf("a goroutine of the Conn is left after Close:\n%s", stacks)
	}
	stream.Close()
	for range 2 {
		select {
		case err := <-ended:
			if !errors.Is(err, client.ErrClosed) {
				t.Fatalf("Next after Close: %v, want ErrClosed", err)
			}
		case <-ctx.Done():
			t.Fatal("a Next still blocked after Close")
		}
	}
	if _, err := conn.StartRun(ctx, client.StartRunRequest{ThreadID: th.ThreadID, ExpectedStateVersion: 1, UserMessage: "x"}); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("a command after Close: %v, want ErrClosed", err)
	}
	if err := conn.Err(); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Err after Close: %v", err)
	}
	c.Close()
	// The run goes on without its tab; the gateway stops with it in flight.
	stop()
	goleak.VerifyNone(t, before)
}

func goroutines() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// A command sent while the network drops goes through: it waits for the
// next connection, or, lost on the dying one, a run.start with a
// client_request_id is resent and the server answers the repeat with the
// same run. Exactly one run starts.
func TestCommandsAcrossReconnect(t *testing.T) {
	base, _ := serve(t)
	c := newClient(t, base)
	k := newCutter(t)
	watcher := newClient(t, base, client.WithHTTPClient(k.client()), client.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	conn := connect(t, watcher, "tab-resend")
	th := createThread(t, c, "")
	r := newReader(t, subscribe(t, conn, th.ThreadID, 0), th.ThreadID, 0)
	// Cut the connection, then command at once: the command waits for the
	// next connection (or is lost on the dying one and resent).
	k.cut()
	ack, err := conn.StartRun(bounded(t), client.StartRunRequest{ThreadID: th.ThreadID, ExpectedStateVersion: th.StateVersion,
		UserMessage: "Say hello", ClientRequestID: "resend-1"})
	if err != nil {
		t.Fatalf("run.start across a reconnect: %v", err)
	}
	r.runEvent(chat.EventRunCompleted, ack.RunID)
	started := 0
	for _, ev := range r.events {
		if ev.Type == chat.EventRunStarted {
			started++
		}
	}
	if started != 1 {
		t.Fatalf("%d runs started, want 1", started)
	}
	if st := conn.Stats(); st.Connects < 2 {
		t.Fatalf("stats %+v: want a reconnection", st)
	}
	wantClean(t, conn.Stats())
}
