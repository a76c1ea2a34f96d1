package store_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// A deleted thread's log ends with thread.deleted, one durable event; from
// then on the thread is not_found to its owner for every read and command,
// and it leaves the list and the search. A stale version is a conflict;
// a run that has not ended is run_already_active (the engine cancels it
// first); the deletion is checked like any write.
func TestDeleteThread(t *testing.T) {
	st, _ := open(t)
	th := newThread(t, st).ThreadID
	streamAndCancel(t, st, th, 1, "Lisbon", " in spring")
	keep := newThread(t, st).ThreadID
	v := version(t, st, th)

	stale := v - 1
	if _, err := st.DeleteThread(ctx, user, th, &stale); code(err) != chat.CodeStateVersionConflict {
		t.Fatalf("delete at a stale version = %v, want state_version_conflict", err)
	}
	if _, err := st.DeleteThread(ctx, "usr_other", th, nil); code(err) != chat.CodeNotFound {
		t.Fatalf("delete of another user's thread = %v, want not_found", err)
	}
	running, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: th, ExpectedStateVersion: v, UserMessage: text("again")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.DeleteThread(ctx, user, th, nil)
	if ce, ok := err.(*chat.Error); !ok || ce.Code != chat.CodeRunAlreadyActive || ce.Fields["run_id"] != running.RunID {
		t.Fatalf("delete while run %s is queued = %v, want run_already_active naming it", running.RunID, err)
	}
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: running.RunID, Reason: chat.ReasonThreadDeleted, RequestedBy: "tab:a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishCancel(ctx, running.RunID, nil, 0); err != nil {
		t.Fatal(err)
	}

	before, _ := st.Snapshot(ctx, user, th)
	current := before.StateVersion
	ack, err := st.DeleteThread(ctx, user, th, &current)
	if err != nil || ack.ThreadID != th {
		t.Fatalf("delete = %+v, %v", ack, err)
	}
	if _, err := st.DeleteThread(ctx, user, th, nil); code(err) != chat.CodeNotFound {
		t.Fatalf("delete again = %v, want not_found", err)
	}
	for name, err := range map[string]error{
		"snapshot": func() error { _, err := st.Snapshot(ctx, user, th); return err }(),
		"thread":   func() error { _, err := st.Thread(ctx, user, th); return err }(),
		"events":   func() error { _, err := st.Events(ctx, user, th, 0); return err }(),
		"checkpoints": func() error {
			_, _, err := st.Checkpoints(ctx, user, th)
			return err
		}(),
		"run.start": func() error {
			_, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: th, ExpectedStateVersion: current + 1, UserMessage: text("hello?")})
			return err
		}(),
		"fork": func() error {
			_, err := st.Fork(ctx, chat.Fork{UserID: user, ThreadID: th, FromCheckpointID: before.HeadCheckpointID})
			return err
		}(),
		"rename": st.RenameThread(ctx, user, th, "new name"),
		"checkout": func() error {
			_, err := st.Checkout(ctx, chat.Checkout{UserID: user, ThreadID: th, CheckpointID: before.HeadCheckpointID, ExpectedStateVersion: current + 1})
			return err
		}(),
	} {
		if code(err) != chat.CodeNotFound {
			t.Errorf("%s of a deleted thread = %v, want not_found", name, err)
		}
	}
	list, _, err := st.ListThreads(ctx, user, 50, "", "")
	if err != nil || len(list) != 1 || list[0].ThreadID != keep {
		t.Fatalf("list after the delete = %+v, %v; want only %s", list, err, keep)
	}
	if found := ids(t, st, "Lisbon"); len(found) != 0 {
		t.Fatalf("search finds the deleted thread: %v", found)
	}

	// Its last event, read as the bus's recovery reads it.
	all, err := st.ThreadEvents(ctx, th, 0)
	if err != nil {
		t.Fatal(err)
	}
	last := all.Events[len(all.Events)-1]
	var body map[string]any
	if err := json.Unmarshal(last.Raw, &body); err != nil {
		t.Fatal(err)
	}
	if body["type"] != chat.EventThreadDeleted || body["seq"] != float64(before.LastSeq+1) || body["state_version"] != float64(current+1) ||
		len(body) != 5 { // type, thread_id, seq, ts, state_version: no run_id, nothing else
		t.Fatalf("last event = %s; want thread.deleted at seq %d, state_version %d, with the common fields only", last.Raw, before.LastSeq+1, current+1)
	}
}

// Retention empties a deleted thread's text once -draft-ttl passed: its
// messages (row and message.published) and its title; a fork of it keeps
// its history whole, and a deleted thread is redacted once.
func TestRedactDeletedThreads(t *testing.T) {
	st, path := open(t)
	db := rawDB(t, path)
	th := newThread(t, st).ThreadID
	streamAndCancel(t, st, th, 1, "Private", " plans")
	forked := fork(t, st, th)
	inFork, _ := st.Snapshot(ctx, user, forked)
	shared := inFork.Messages[0].MessageID // the request, copied by id into the fork
	// A message of the original only: asked after the fork.
	own := startAndClaim(t, st, th, "only in the original")
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: own, Reason: "user_requested", RequestedBy: "tab:a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishCancel(ctx, own, ptr(leaseW(own)), 0); err != nil {
		t.Fatal(err)
	}
	snap, _ := st.Snapshot(ctx, user, th)
	onlyHere := snap.Messages[len(snap.Messages)-1].MessageID
	if _, err := st.DeleteThread(ctx, user, th, nil); err != nil {
		t.Fatal(err)
	}
	cut := cutoff()

	if n, err := st.Retention().RedactDeletedThreads(ctx, cut.Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("redact threads deleted an hour ago = %d, %v", n, err)
	}
	n, err := st.Retention().RedactDeletedThreads(ctx, cut)
	if err != nil || n != 1 {
		t.Fatalf("redact = %d, %v; want the one deleted thread", n, err)
	}
	var content, title string
	if err := db.QueryRow(`SELECT content FROM messages WHERE message_id = ?`, onlyHere).Scan(&content); err != nil || content != "" {
		t.Fatalf("the original's own message kept %q (%v)", content, err)
	}
	if p := publishedPayload(t, db, onlyHere); !strings.Contains(p, `"content":""`) || strings.Contains(p, "only in the original") {
		t.Fatalf("its message.published kept the text: %s", p)
	}
	if err := db.QueryRow(`SELECT title FROM threads WHERE thread_id = ?`, th).Scan(&title); err != nil || title != "Deleted conversation" {
		t.Fatalf("title after redaction = %q (%v)", title, err)
	}
	if err := db.QueryRow(`SELECT content FROM messages WHERE message_id = ?`, shared).Scan(&content); err != nil || content != "hi" {
		t.Fatalf("the fork's copied request lost its text: %q (%v)", content, err)
	}
	again, _ := st.Snapshot(ctx, user, forked)
	if len(again.Messages) != len(inFork.Messages) || again.Messages[0].Content != "hi" {
		t.Fatalf("the fork's history after the original's redaction = %+v", again.Messages)
	}
	if n, err := st.Retention().RedactDeletedThreads(ctx, time.Now().Add(time.Minute)); err != nil || n != 0 {
		t.Fatalf("redact again = %d, %v; want nothing left", n, err)
	}
}
