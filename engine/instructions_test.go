package engine_test

import (
	"context"
	"testing"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/model"
)

// A Responses API request's instructions reach the model as a system
// message before the conversation, in that run only: the next run of the
// thread is asked without them.
func TestInstructionsAreTheRunsOwn(t *testing.T) {
	h := newHarness(t, newScripted(words, false))
	snap, sub := h.watchedThread()
	h.start()
	ctx := context.Background()
	first, err := h.eng.StartRun(ctx, chat.StartRun{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, ExpectedStateVersion: snap.StateVersion,
		UserMessage: ptr("hello"), Response: &chat.ResponseRequest{Model: "demo", Instructions: "Answer in French."}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, sub, "run.completed", isType(chat.EventRunCompleted, first.RunID))
	req := h.model.lastRequest()
	if len(req.Messages) != 2 || req.Messages[0].Role != model.RoleSystem || req.Messages[0].Content != "Answer in French." ||
		req.Messages[1].Content != "hello" {
		t.Fatalf("the model was asked %+v", req.Messages)
	}
	next := h.startRun(snap.ThreadID, h.snapshot(snap.ThreadID).StateVersion, ptr("again"))
	waitFor(t, sub, "run.completed", isType(chat.EventRunCompleted, next.RunID))
	for _, m := range h.model.lastRequest().Messages {
		if m.Role == model.RoleSystem {
			t.Fatalf("the next run was asked with %+v", m)
		}
	}
}
