package main

// The message queue across a crash of the real binary: a run SIGKILLed
// mid-stream with two messages queued behind it is recovered, completes,
// and each queued message is sent exactly once, in order; a queue paused
// by a Stop stays paused through a SIGKILL and starts only on a resume.

import (
	"context"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

func TestBinaryQueueAcrossACrash(t *testing.T) {
	db := t.TempDir() + "/gw.db"
	ctx := context.Background()
	srv := startProcess(t, db, "40ms")
	th := srv.CreateThread()
	s := srv.Events(th.ThreadID, 0)
	run1 := srv.StartRun(th.ThreadID, th.StateVersion, "Explain backpressure in streaming systems")
	s.WaitDeltas(time.Now().Add(20*time.Second), run1.RunID, 2)
	var items []string
	for _, text := range []string{"first queued", "second queued"} {
		ack, err := srv.API().QueueAdd(ctx, client.QueueAddRequest{ThreadID: th.ThreadID, UserMessage: text})
		if err != nil || ack.Position != len(items)+1 {
			t.Fatalf("queue %q behind a streaming run: %+v, %v", text, ack, err)
		}
		items = append(items, ack.ItemID)
	}
	s.Close()
	srv.Kill()
	checkDB(t, db)

	// Restarted: the run is recovered and completes; each item is then sent
	// by the completion of the run before it. (At a pace, so that the
	// endless run below is still streaming when a message is queued behind
	// it: at no pace it would reach the reply size limit and end.)
	srv = startProcess(t, db, "40ms")
	api := srv.API()
	snap := waitQueueSettled(t, api, th.ThreadID)
	var users []string
	for _, m := range snap.Messages {
		if m.Role == chat.RoleUser {
			users = append(users, m.Content)
		}
	}
	if len(users) != 3 || users[1] != "first queued" || users[2] != "second queued" || len(snap.Queue.Items) != 0 {
		t.Fatalf("after the crash: sent %q, queue %+v", users, snap.Queue)
	}
	audit := auditDB(t, db)
	defer audit.Close()
	for _, item := range items {
		if n := queryValue[int](t, audit, `SELECT COUNT(*) FROM runs WHERE queue_item_id = ? AND status = 'completed'`, item); n != 1 {
			t.Errorf("queue item %s: %d completed runs name it, want 1", item, n)
		}
	}
	if r := srv.Run(run1.RunID); r.Status != chat.RunCompleted || r.Attempt < 2 {
		t.Errorf("the killed run: %s at attempt %d, want completed by a later attempt", r.Status, r.Attempt)
	}

	// A paused queue through a crash.
	th2 := srv.CreateThread()
	run2 := srv.StartRun(th2.ThreadID, th2.StateVersion, "endless: keep going")
	queued, err := api.QueueAdd(ctx, client.QueueAddRequest{ThreadID: th2.ThreadID, UserMessage: "after the stop"})
	if err != nil || queued.Position != 1 {
		t.Fatalf("queue behind an endless run: %+v, %v", queued, err)
	}
	srv.CancelRun(run2.RunID)
	paused := waitQueueSettled(t, api, th2.ThreadID)
	if !paused.Queue.Paused || len(paused.Queue.Items) != 1 {
		t.Fatalf("after the stop: %+v", paused.Queue)
	}
	srv.Kill()
	checkDB(t, db)
	srv = startProcess(t, db, "0ms")
	api = srv.API()
	again, err := api.Thread(ctx, th2.ThreadID)
	if err != nil || !again.Queue.Paused || len(again.Queue.Items) != 1 || again.ActiveRun != nil ||
		again.StateVersion != paused.StateVersion {
		t.Fatalf("restarted: %+v (active %+v, version %d, was %d), %v", again.Queue, again.ActiveRun, again.StateVersion,
			paused.StateVersion, err)
	}
	res, err := api.QueueResume(ctx, client.QueueItemRequest{ThreadID: th2.ThreadID})
	if err != nil || res.RunID == "" {
		t.Fatalf("resume after the restart: %+v, %v", res, err)
	}
	if done := waitQueueSettled(t, api, th2.ThreadID); len(done.Queue.Items) != 0 || done.Queue.Paused {
		t.Fatalf("after the resume: %+v", done.Queue)
	}
	srv.Stop()
	checkDB(t, db)
}

// waitQueueSettled polls the thread (bounded) until no run is active and
// the queue is empty or paused: nothing can start by itself any more.
func waitQueueSettled(t *testing.T, api *client.Client, threadID string) chat.Snapshot {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		snap, err := api.Thread(context.Background(), threadID)
		if err != nil {
			t.Fatal(err)
		}
		if snap.ActiveRun == nil && (len(snap.Queue.Items) == 0 || snap.Queue.Paused) {
			return snap
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %s still busy after 30 s: active %+v, queue %+v", threadID, snap.ActiveRun, snap.Queue)
		}
		time.Sleep(25 * time.Millisecond) // bounded poll: the test reads the HTTP API, as a script would
	}
}
