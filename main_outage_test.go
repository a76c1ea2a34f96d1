package main

// What a tab saw of a reply, across a stop of the server: a graceful stop
// (SIGTERM) writes every delta it fanned out before it exits, also when
// another process holds the database's write lock for longer than a
// transaction waits for it; a crash (SIGKILL) may lose the deltas only
// memory held, and then the server says so instead of offering something
// else. The browser's side of both is e2e/outage.test.mjs.

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

// writeLock is the database's write lock, held by another process's
// connection (a backup tool, an sqlite3 shell): while it is held the
// gateway's writes wait, so deltas it fans out are in its memory only.
type writeLock struct {
	t  *testing.T
	db *sql.DB
	tx *sql.Tx
}

// holdWriteLock takes the write lock of the SQLite database at path. The
// gateway commits many small transactions; the lock is taken between two
// of them (SQLite's busy handler retries for up to 30 s).
func holdWriteLock(t *testing.T, path string) *writeLock {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+(&url.URL{Path: path}).EscapedPath()+"?_busy_timeout=30000&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	// (Not a context that ends: database/sql rolls a transaction back when
	// its context ends. The busy timeout bounds the wait.)
	tx, err := db.BeginTx(context.Background(), nil) // BEGIN IMMEDIATE: the write lock
	if err != nil {
		db.Close()
		t.Fatalf("take the database's write lock: %v", err)
	}
	l := &writeLock{t: t, db: db, tx: tx}
	t.Cleanup(l.release)
	return l
}

func (l *writeLock) release() {
	if l.tx != nil {
		_ = l.tx.Rollback()
		l.tx = nil
	}
	if l.db != nil {
		l.db.Close()
		l.db = nil
	}
}

// seenBeforeStop streams a long reply, holds the database's write lock so
// that the next deltas are fanned out but not written, and answers the
// thread, the run, the streamed message and what the tab saw of it
// (its text and the last seq) once several deltas arrived that only the
// server's memory holds.
func seenBeforeStop(t *testing.T, srv *server, db string) (th chat.Snapshot, runID, messageID, seen string, lastSeq int64, lock *writeLock) {
	t.Helper()
	th = srv.CreateThread()
	ack := srv.StartRun(th.ThreadID, th.StateVersion, "Tell me about graceful restarts of streaming servers, in detail")
	evs := srv.Events(th.ThreadID, th.LastSeq)
	deadline := time.Now().Add(30 * time.Second)
	messageID = evs.WaitDeltas(deadline, ack.RunID, 4)
	lock = holdWriteLock(t, db)
	evs.WaitDeltas(deadline, ack.RunID, 6) // fanned out while nothing can be written
	seen, lastSeq = evs.Text(messageID), evs.LastSeq()
	evs.Close()
	return th, ack.RunID, messageID, seen, lastSeq, lock
}

// cancelAfterRestart cancels runID on the restarted server, as the page does
// with a cancel pressed while the server was away, and waits for its end.
func cancelAfterRestart(t *testing.T, srv *server, th chat.Snapshot, runID string, after int64, crashed bool) {
	t.Helper()
	var evs *apptest.Stream
	if crashed {
		evs = srv.EventsAfterCrash(th.ThreadID, after)
	} else {
		evs = srv.Events(th.ThreadID, after) // a graceful stop lost nothing: no snapshot
	}
	if ack := srv.CancelRun(runID); ack.Status != chat.RunCancelRequested && ack.Status != chat.RunCancelling {
		t.Fatalf("cancel after the restart: %s, want cancel_requested", ack.Status)
	}
	evs.WaitFor(time.Now().Add(30*time.Second), "the run's end", apptest.IsEnd(runID))
	evs.Close()
	if got := srv.Run(runID); got.Status != chat.RunCancelled {
		t.Fatalf("run %s after the cancel: %s, want cancelled", runID, got.Status)
	}
}

func TestBinaryGracefulStopWritesWhatTabsSaw(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	srv := startProcess(t, db, "40ms")
	th, runID, messageID, seen, lastSeq, lock := seenBeforeStop(t, srv, db)

	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The stop must outlast a transaction's own wait for the lock (5 s):
	// it says it is waiting, and only then is the lock released.
	const waiting = "waiting for the database to write the streamed text before stopping"
	for deadline := time.Now().Add(30 * time.Second); srv.Logged(waiting) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the stopping gateway did not say %q within 30 s; log:\n%s", waiting, srv.Stderr())
		}
	}
	lock.release()
	if code := srv.WaitExit(40 * time.Second); code != 0 {
		t.Fatalf("graceful stop exited %d, want 0; log:\n%s", code, srv.Stderr())
	}

	srv = startProcess(t, db, "40ms")
	cancelAfterRestart(t, srv, th, runID, lastSeq, false)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	got, err := srv.API().StreamedText(ctx, th.ThreadID, messageID, lastSeq)
	if err != nil {
		t.Fatalf("the text the tab saw before the stop (message %s up to seq %d): %v", messageID, lastSeq, err)
	}
	if got.Content != seen || got.RunID != runID || got.Chars != int64(len([]rune(seen))) {
		t.Fatalf("the server holds %d characters of what the tab saw before the stop, want exactly the %d it saw:\nheld: %q\nseen: %q",
			got.Chars, len([]rune(seen)), got.Content, seen)
	}
	snap := srv.Snapshot(th.ThreadID)
	saved, err := srv.API().SaveFragment(ctx, client.SaveFragmentRequest{ThreadID: th.ThreadID, MessageID: messageID, LastSeq: lastSeq, ExpectedStateVersion: snap.StateVersion})
	if err != nil {
		t.Fatalf("save the fragment the tab saw: %v", err)
	}
	after := srv.Snapshot(th.ThreadID)
	last := after.Messages[len(after.Messages)-1]
	if last.MessageID != saved.MessageID || last.Kind != chat.KindFragment || last.Content != seen {
		t.Fatalf("the saved fragment is %s %q, want the text the tab saw: %q", last.Kind, last.Content, seen)
	}
	srv.Stop()
	checkDB(t, db)
}

func TestBinaryCrashSaysWhatTabsSawIsLost(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	srv := startProcess(t, db, "40ms")
	th, runID, messageID, _, lastSeq, lock := seenBeforeStop(t, srv, db)
	srv.Kill()
	lock.release()

	srv = startProcess(t, db, "40ms")
	cancelAfterRestart(t, srv, th, runID, lastSeq, true)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err := srv.API().StreamedText(ctx, th.ThreadID, messageID, lastSeq)
	var e *client.Error
	if !errors.As(err, &e) || e.Code != chat.CodeFragmentUnavailable || e.Cause != chat.CauseServerStopped {
		t.Fatalf("the text the tab saw, lost with the crash: %v, want fragment_unavailable with cause %s", err, chat.CauseServerStopped)
	}
	snap := srv.Snapshot(th.ThreadID)
	_, err = srv.API().SaveFragment(ctx, client.SaveFragmentRequest{ThreadID: th.ThreadID, MessageID: messageID, LastSeq: lastSeq, ExpectedStateVersion: snap.StateVersion})
	if !errors.As(err, &e) || e.Code != chat.CodeFragmentUnavailable {
		t.Fatalf("saving the text lost with the crash: %v, want fragment_unavailable", err)
	}
	if after := srv.Snapshot(th.ThreadID); after.StateVersion != snap.StateVersion || len(after.Messages) != len(snap.Messages) {
		t.Fatalf("a refused save changed the conversation: version %d → %d", snap.StateVersion, after.StateVersion)
	}
	srv.Stop()
	checkDB(t, db)
}
