package engine_test

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
)

// lockedBuffer is a log destination the engine's goroutines share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The maintenance loop applies every retention class on its purge tick:
// the event log keeps each thread's last event, finished runs' audit rows
// go, a deleted draft loses its text; the invariants hold throughout (the
// harness checks them at the end) and the log holds counts, never text.
func TestMaintainAppliesRetention(t *testing.T) {
	m := newScripted(words, true)
	h := newHarness(t, m)
	snap, sub := h.watchedThread()
	logs := &lockedBuffer{}
	h.startWith(func(cfg *engine.Config) {
		cfg.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		cfg.PurgeEvery = 10 * time.Millisecond
		cfg.EventTTL = 50 * time.Millisecond
		cfg.AuditTTL = 50 * time.Millisecond
		cfg.DraftTTL = 50 * time.Millisecond
	})

	// A run cancelled mid-stream; what the tab saw is saved as a draft,
	// then deleted.
	first := h.startRun(snap.ThreadID, snap.StateVersion, ptr("hello"))
	m.release(t, 2)
	var lastDelta *chat.Event
	waitFor(t, sub, "two deltas", func(ev *chat.Event) bool {
		if ev.Type == chat.EventMessageDelta {
			if lastDelta != nil {
				lastDelta = ev
				return true
			}
			lastDelta = ev
		}
		return false
	})
	if _, err := h.eng.CancelRun(context.Background(), chat.CancelRun{UserID: chat.LocalUserID, RunID: first.RunID, Reason: "user_requested", RequestedBy: "tab:t"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, sub, "run.cancelled", isType(chat.EventRunCancelled, first.RunID))
	cur := h.snapshot(snap.ThreadID)
	saved, err := h.st.SaveFragment(context.Background(), chat.SaveFragment{UserID: chat.LocalUserID, ThreadID: snap.ThreadID,
		MessageID: lastDelta.Body.(chat.MessageDeltaBody).MessageID, LastSeq: lastDelta.Seq, ExpectedStateVersion: cur.StateVersion})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.st.DeleteDraft(context.Background(), chat.DeleteDraft{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, MessageID: saved.MessageID, ExpectedStateVersion: saved.StateVersion}); err != nil {
		t.Fatal(err)
	}
	// Then a run that completes.
	m.gate = nil
	cur = h.snapshot(snap.ThreadID)
	next, err := h.eng.StartRun(context.Background(), chat.StartRun{UserID: chat.LocalUserID, ThreadID: snap.ThreadID, ExpectedStateVersion: cur.StateVersion, UserMessage: ptr("again")})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, sub, "run.completed", isType(chat.EventRunCompleted, next.RunID))

	db, err := sql.Open("sqlite3", h.path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var events, audit int
		var content string
		if err := db.QueryRow(`SELECT (SELECT COUNT(*) FROM events WHERE thread_id = ?), (SELECT COUNT(*) FROM cancel_audit),
			(SELECT content FROM messages WHERE message_id = ?)`, snap.ThreadID, saved.MessageID).Scan(&events, &audit, &content); err != nil {
			t.Fatal(err)
		}
		if events == 1 && audit == 0 && content == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not purged: %d events, %d audit rows, draft text %d bytes", events, audit, len(content))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if replay, err := h.st.Events(context.Background(), chat.LocalUserID, snap.ThreadID, 0); err != nil || replay.Complete {
		t.Fatalf("replay from 0 after the purge = %+v, %v; want a gap", replay, err)
	}
	h.stop()
	out := logs.String()
	for _, want := range []string{"purged event log", "purged cancel audit", "purged deleted drafts"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	for _, secret := range []string{"hello", "again", strings.Join(words[:2], " ")} {
		if strings.Contains(out, secret) {
			t.Errorf("log contains message text %q", secret)
		}
	}
	if strings.Contains(out, "level=ERROR") {
		t.Errorf("purge logged errors:\n%s", out)
	}
}
