package app_test

// The walk-through of "Done when", on one gateway: a reply cancelled
// mid-stream is told truthfully, continued from its saved point, and a
// stale tab is refused honestly; the log never holds what was said.

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

// A reply cancelled mid-stream, continued, and a stale continue refused.
func TestBinaryCancelAndContinue(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	srv := apptest.Start(t, apptest.CommandConfig(db, 100*time.Millisecond))

	thread := srv.CreateThread()
	tid := thread.ThreadID
	evs := srv.Events(tid, thread.LastSeq)

	started := srv.StartRun(tid, 1, "Explain how honest cancellation works in streaming chat gateways")
	if !strings.HasPrefix(started.RunID, "run_") || started.StateVersion <= 1 {
		t.Fatalf("run.start ack %+v: want a run_ id and a state_version above 1", started)
	}
	runID := started.RunID

	deadline := time.Now().Add(20 * time.Second)
	streamed := evs.WaitDeltas(deadline, runID, 4)

	// Cancel: accepted at once, before the worker settles anything.
	t0 := time.Now()
	ack := srv.CancelRun(runID)
	if took := time.Since(t0); took > 2*time.Second {
		t.Errorf("cancel answered after %v; it must answer at once", took)
	}
	if ack.RunID != runID || ack.Status != "cancel_requested" || ack.AlreadyRequested {
		t.Errorf("cancel ack %+v: want run %s, status cancel_requested, already_requested false", ack, runID)
	}
	if ack.AcceptedStateVersion <= started.StateVersion || ack.ResumeCheckpointID == "" {
		t.Errorf("cancel ack %+v: want accepted_state_version above %d and a resume_checkpoint_id", ack, started.StateVersion)
	}
	if ack.PublishedMessageID != nil && *ack.PublishedMessageID == streamed {
		t.Errorf("cancel ack names the unpublished streamed message %s as published", streamed)
	}

	cancelledEv := evs.WaitFor(time.Now().Add(10*time.Second), "run.cancelled", func(ev client.Event) bool {
		if ev.RunID == runID && (ev.Type == chat.EventMessagePublished || ev.Type == chat.EventRunCompleted || ev.Type == chat.EventRunFailed) {
			t.Fatalf("after its cancel was accepted, run %s emitted %s: %s", runID, ev.Type, ev.Raw)
		}
		return ev.Type == chat.EventRunCancelled && ev.RunID == runID
	})
	cancelled := cancelledEv.Cancelled()
	partial := evs.Text(streamed)
	if cancelled.DiscardedStreamChars <= 0 {
		t.Fatalf("run.cancelled lacks a positive discarded_stream_chars: %s", cancelledEv.Raw)
	}
	if n := int64(utf8.RuneCountInString(partial)); cancelled.DiscardedStreamChars < n {
		t.Errorf("run.cancelled discarded_stream_chars %d, but %d code points were streamed for the discarded message", cancelled.DiscardedStreamChars, n)
	}
	if cancelled.ResumePolicy != "regenerate_pending_step" || cancelled.ResumeCheckpointID == "" {
		t.Errorf("run.cancelled: resume_policy %q, resume_checkpoint_id %q", cancelled.ResumePolicy, cancelled.ResumeCheckpointID)
	}
	if r := srv.Run(runID); r.Status != chat.RunCancelled || r.DiscardedStreamChars != cancelled.DiscardedStreamChars {
		t.Errorf("GET /api/runs/%s after run.cancelled: %+v, want status cancelled with discarded_stream_chars %d", runID, r, cancelled.DiscardedStreamChars)
	}
	// A second cancel changes nothing.
	again := srv.CancelRun(runID)
	if !again.AlreadyRequested || again.Status != "cancelled" {
		t.Errorf("second cancel ack %+v: want already_requested true, status cancelled", again)
	}

	// Only the user message is history; the streamed text is not.
	snap := srv.Snapshot(tid)
	if len(snap.Messages) != 1 || snap.Messages[0].Role != "user" {
		t.Fatalf("history after cancel: %+v, want only the user message", snap.Messages)
	}
	userMsg := snap.Messages[0]
	if ack.PublishedMessageID != nil && *ack.PublishedMessageID != userMsg.MessageID {
		t.Errorf("cancel ack published_message_id %s, but the last published message is %s", *ack.PublishedMessageID, userMsg.MessageID)
	}
	if snap.ActiveRun != nil {
		t.Errorf("active_run after run.cancelled: %+v, want null", snap.ActiveRun)
	}
	if snap.StateVersion != cancelledEv.StateVersion {
		t.Errorf("snapshot state_version %d, but the last durable event (run.cancelled) carried %d", snap.StateVersion, cancelledEv.StateVersion)
	}

	// Continue from the saved point: no user_message, the current version.
	resumed := srv.StartRun(tid, snap.StateVersion, "")
	if resumed.RunID == runID {
		t.Fatalf("continue returned the cancelled run %s", runID)
	}
	var published *chat.Message
	evs.WaitFor(time.Now().Add(30*time.Second), "run.completed of the continued run", func(ev client.Event) bool {
		if ev.RunID == runID {
			t.Errorf("the cancelled run %s emitted %s after run.cancelled: %s", runID, ev.Type, ev.Raw)
		}
		if p := ev.Published(); p != nil && ev.RunID == resumed.RunID {
			published = &p.Message
		}
		if ev.RunID == resumed.RunID && (ev.Type == chat.EventRunFailed || ev.Type == chat.EventRunCancelled) {
			t.Fatalf("continued run ended %s: %s", ev.Type, ev.Raw)
		}
		return ev.Type == chat.EventRunCompleted && ev.RunID == resumed.RunID
	})
	if published == nil {
		t.Fatalf("run.completed without a message.published of run %s", resumed.RunID)
	}
	if published.MessageID == streamed {
		t.Errorf("the continued run published the discarded message id %s", streamed)
	}
	if got := evs.Text(published.MessageID); published.Content != got || got == "" {
		t.Errorf("published content is not the concatenation of its deltas:\ncontent: %q\ndeltas:  %q", published.Content, got)
	}

	after := srv.Snapshot(tid)
	if len(after.Messages) != 2 || after.Messages[0].MessageID != userMsg.MessageID ||
		after.Messages[1].Role != "assistant" || after.Messages[1].MessageID != published.MessageID {
		t.Fatalf("history after the continued run: %+v, want the user message then %s", after.Messages, published.MessageID)
	}
	if after.Messages[1].Content != published.Content {
		t.Errorf("history holds %q, the published event said %q", after.Messages[1].Content, published.Content)
	}
	if after.ActiveRun != nil {
		t.Errorf("active_run after run.completed: %+v, want null", after.ActiveRun)
	}
	if r := srv.Run(resumed.RunID); r.Status != "completed" {
		t.Errorf("continued run: %+v, want completed", r)
	}

	// A tab still at the old version tries to continue: refused honestly.
	_, err := srv.API().StartRun(context.Background(), client.StartRunRequest{ThreadID: tid, ExpectedStateVersion: snap.StateVersion})
	conflict := apptest.Refusal(err)
	if conflict == nil || conflict.Status != http.StatusConflict || conflict.Code != chat.CodeStateVersionConflict {
		t.Fatalf("stale continue: %v, want 409 state_version_conflict", err)
	}
	hasReload, fork := false, ""
	for _, a := range conflict.AllowedActions {
		if a == "reload" {
			hasReload = true
		}
		if strings.HasPrefix(a, "fork_from_cp_") {
			fork = a
		}
	}
	if !hasReload || fork == "" {
		t.Errorf("stale continue allowed_actions %q: want \"reload\" and a fork_from_cp_ entry", conflict.AllowedActions)
	}
	if fork != "" && fork != "fork_from_"+snap.HeadCheckpointID {
		t.Errorf("stale continue offers %s, but the refused command was based on %s", fork, snap.HeadCheckpointID)
	}
	if conflict.CurrentStateVersion != after.StateVersion || conflict.CurrentCheckpointID != after.HeadCheckpointID {
		t.Errorf("conflict names version %d / checkpoint %s, the thread is at %d / %s",
			conflict.CurrentStateVersion, conflict.CurrentCheckpointID, after.StateVersion, after.HeadCheckpointID)
	}

	evs.Close()
	srv.Stop()
	checkDB(t, db)
	// The log says what happened, never what was said.
	logs := srv.Stderr()
	for _, secret := range []string{"honest cancellation works", "streaming chat gateways"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the server log contains message text %q", secret)
		}
	}
}
