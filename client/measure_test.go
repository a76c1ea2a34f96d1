package client_test

import (
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// What a program measuring latency reads: every event says when it was
// read and whether it is a subscribe's catch-up or live, and a Conn
// command given WithCommandTiming says when it left and when its answer
// was read.
func TestMeasurements(t *testing.T) {
	c, th := newThread(t, "")
	first := startRun(t, c, th, "short answer please")
	early := newReader(t, subscribe(t, connect(t, c, "tab-early"), th.ThreadID, 0), th.ThreadID, 0)
	early.runEvent(chat.EventRunCompleted, first.RunID)

	// Subscribed from 0 after the first run: its events are the catch-up.
	conn := connect(t, c, "tab-measure")
	sub := subscribe(t, conn, th.ThreadID, 0)
	caughtUp := sub.Ack().LastSeq
	if caughtUp < 3 {
		t.Fatalf("subscribe ack %+v: want the first run's events to replay", sub.Ack())
	}
	r := newReader(t, sub, th.ThreadID, 0)
	before := time.Now()
	for r.last < caughtUp {
		if ev := r.next(); !ev.Replayed || ev.Received.IsZero() || ev.Received.After(time.Now()) {
			t.Fatalf("caught-up event %v: Replayed %v, Received %v", ev, ev.Replayed, ev.Received)
		}
	}
	if !r.events[0].Received.Before(before) {
		t.Fatalf("the catch-up was read at %v, after Next started at %v: Received is not the read time", r.events[0].Received, before)
	}

	// A run started now is live; its cancel is timed at the wire.
	run, err := conn.StartRun(bounded(t), client.StartRunRequest{ThreadID: th.ThreadID, ExpectedStateVersion: sub.StateVersion(), UserMessage: longRequest})
	if err != nil {
		t.Fatal(err)
	}
	r.deltasOf(run.RunID, 2)
	var tm client.CommandTiming
	sent := time.Now()
	if _, err := conn.CancelRun(client.WithCommandTiming(bounded(t), &tm), client.CancelRunRequest{RunID: run.RunID}); err != nil {
		t.Fatal(err)
	}
	returned := time.Now()
	if tm.Sent.Before(sent) || tm.Answered.Before(tm.Sent) || tm.Answered.After(returned) {
		t.Fatalf("timing %+v: want %v ≤ Sent ≤ Answered ≤ %v", tm, sent, returned)
	}
	r.runEvent(chat.EventRunCancelled, run.RunID)
	for _, ev := range r.events {
		if ev.Seq > caughtUp && (ev.Replayed || ev.Received.IsZero()) {
			t.Fatalf("live event %v: Replayed %v, Received %v", ev, ev.Replayed, ev.Received)
		}
	}
	// A refusal is an answer too.
	tm = client.CommandTiming{}
	_, err = conn.CancelRun(client.WithCommandTiming(bounded(t), &tm), client.CancelRunRequest{RunID: chat.PrefixRun + "nosuchrun"})
	if client.ErrorCode(err) == "" || tm.Answered.Before(tm.Sent) || tm.Sent.IsZero() {
		t.Fatalf("cancel of no run: %v, timing %+v", err, tm)
	}
	wantClean(t, conn.Stats())

	// A Stream says when it read each event; it has no catch-up to mark.
	stream := events(t, c, th.ThreadID, caughtUp)
	ev, err := stream.Next(bounded(t))
	if err != nil || ev.Seq != caughtUp+1 || ev.Received.IsZero() || ev.Replayed {
		t.Fatalf("stream event %v (%v): Received %v, Replayed %v", ev, err, ev.Received, ev.Replayed)
	}
}
