package store_test

import (
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// A Responses API request's fields are written with the run it starts and
// read back with it: the instructions as the run's input (that run only),
// the rest as given; Response tells the run's run.started seq, its
// published output and the checkpoint it ended on, to its owner only; a
// deleted thread's requests are emptied with its messages.
func TestResponseRecordedWithItsRun(t *testing.T) {
	st, path := open(t)
	db := rawDB(t, path)
	th := newThread(t, st)
	req := &chat.ResponseRequest{Model: "demo", Instructions: "Be brief.", Metadata: map[string]string{"ticket": "7"}, Background: true}
	ack, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: th.ThreadID, ExpectedStateVersion: th.StateVersion,
		UserMessage: text("hello"), Response: req})
	if err != nil {
		t.Fatal(err)
	}
	run := ack.RunID
	rec, err := st.Response(ctx, user, run)
	if err != nil {
		t.Fatal(err)
	}
	if q := rec.Request; q == nil || q.Model != "demo" || q.Instructions != "Be brief." || q.Metadata["ticket"] != "7" || !q.Background ||
		q.PreviousResponseID != "" {
		t.Fatalf("the request read back: %+v", rec.Request)
	}
	if rec.StartSeq == 0 || rec.CheckpointID != rec.Run.BaseCheckpointID || len(rec.Output) != 0 || rec.Thread.StateVersion != ack.StateVersion {
		t.Fatalf("a new response: %+v", rec)
	}
	replay, err := st.Events(ctx, user, th.ThreadID, rec.StartSeq-1)
	if err != nil || len(replay.Events) == 0 || replay.Events[0].Type != chat.EventRunStarted {
		t.Fatalf("the events from StartSeq %d: %+v, %v", rec.StartSeq, replay.Events, err)
	}
	if _, err := st.Claim(ctx, "w", time.Hour); err != nil {
		t.Fatal(err)
	}
	if in := pendingInput(t, st, run); in.Instructions != "Be brief." {
		t.Fatalf("the run's input has instructions %q", in.Instructions)
	}
	msgID := chat.NewID(chat.PrefixMessage)
	if err := st.AppendDeltas(ctx, leaseW(run), msgID, []string{"Hi", "!"}); err != nil {
		t.Fatal(err)
	}
	out := chat.StepOutput{Step: pendingStep(t, st, run), MessageID: msgID, Kind: chat.KindText, Content: "Hi!", Model: "demo"}
	if err := st.CompleteWith(ctx, leaseW(run), out); err != nil {
		t.Fatal(err)
	}
	rec, err = st.Response(ctx, user, run)
	if err != nil || rec.Run.Status != chat.RunCompleted || len(rec.Output) != 1 || rec.Output[0].Content != "Hi!" ||
		rec.CheckpointID != rec.Output[0].CheckpointID || rec.CheckpointID != rec.Thread.HeadCheckpointID || rec.Operations == nil {
		t.Fatalf("the completed response: %+v, %v", rec, err)
	}
	// A run started otherwise is a response too, without a request.
	other := startRun(t, st, th.ThreadID, rec.Thread.StateVersion, "again")
	if rec, err := st.Response(ctx, user, other); err != nil || rec.Request != nil {
		t.Fatalf("a run.start's response: %+v, %v", rec, err)
	}
	if in := pendingInput(t, st, other); in.Instructions != "" {
		t.Fatalf("instructions leaked into the next run: %q", in.Instructions)
	}
	for _, who := range []string{"usr_someone_else", ""} {
		if _, err := st.Response(ctx, who, run); code(err) != chat.CodeNotFound {
			t.Fatalf("Response as %q: %v, want not_found", who, err)
		}
	}
	if _, err := st.Response(ctx, user, chat.NewID(chat.PrefixRun)); code(err) != chat.CodeNotFound {
		t.Fatalf("Response of an unknown run: %v, want not_found", err)
	}
	// What a run.start's validation refuses (the engine's, before the store).
	for _, bad := range []chat.ResponseRequest{{Model: ""}, {Model: "demo", Metadata: map[string]string{"": "v"}},
		{Model: "demo", Instructions: string(make([]byte, chat.MaxInstructionsBytes+1))}} {
		if err := (chat.StartRun{UserMessage: text("x"), Response: &bad}).Validate(); code(err) != chat.CodeInvalidRequest {
			t.Fatalf("%+v: %v, want invalid_request", bad, err)
		}
	}

	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: other, Reason: "user_requested", RequestedBy: "tab:a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishCancel(ctx, other, nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DeleteThread(ctx, user, th.ThreadID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Response(ctx, user, run); code(err) != chat.CodeNotFound {
		t.Fatalf("Response of a deleted thread's run: %v, want not_found", err)
	}
	if _, err := st.Retention().RedactDeletedThreads(ctx, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	var instructions, metadata string
	if err := db.QueryRow(`SELECT instructions, metadata FROM responses WHERE run_id = ?`, run).Scan(&instructions, &metadata); err != nil ||
		instructions != "" || metadata != "{}" {
		t.Fatalf("the deleted thread's request kept %q %q (%v)", instructions, metadata, err)
	}
}

func pendingInput(t *testing.T, st *store.Store, runID string) chat.RunInput {
	t.Helper()
	in, err := st.RunInput(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	return in
}
