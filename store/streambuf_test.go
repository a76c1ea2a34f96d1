package store_test

import (
	"database/sql"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/internal/pgtest"
	"github.com/honestcancel/gateway/store"
)

// feedTap keeps what the store fans out.
type feedTap struct {
	mu  sync.Mutex
	evs []*chat.Event
}

func (f *feedTap) publish(evs []*chat.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.evs = append(f.evs, evs...)
}

func (f *feedTap) deltas() []*chat.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*chat.Event
	for _, ev := range f.evs {
		if ev.Type == chat.EventMessageDelta {
			out = append(out, ev)
		}
	}
	return out
}

func openExclusive(t *testing.T, path string, tap *feedTap) *store.Store {
	t.Helper()
	st, err := store.Open(ctx, path, store.Options{Exclusive: true, OnCommit: tap.publish})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// openBufferedSQLite opens a new SQLite database exclusively with its
// commits tapped; it returns the store, the database's path and the tap.
// It skips the test on PostgreSQL, where deltas are written before they
// are fanned out.
func openBufferedSQLite(t *testing.T) (*store.Store, string, *feedTap) {
	t.Helper()
	if pgtest.OnPostgres() {
		t.Skip("on PostgreSQL deltas are written before they are fanned out")
	}
	path := filepath.Join(t.TempDir(), "gw.db")
	tap := &feedTap{}
	return openExclusive(t, path, tap), path, tap
}

// startStreaming starts a run on a new thread, claims it and writes its
// first batch (which confirms the run live); it returns the thread, the
// run and the message.
func startStreaming(t *testing.T, st *store.Store) (chat.Snapshot, string, string) {
	t.Helper()
	th, runID := startClaimed(t, st)
	msgID := chat.NewID(chat.PrefixMessage)
	if err := st.AppendDeltas(ctx, leaseW(runID), msgID, []string{"first "}); err != nil {
		t.Fatal(err)
	}
	return th, runID, msgID
}

// startClaimed starts a run on a new thread and claims it (which confirms
// it live); it returns the thread and the run.
func startClaimed(t *testing.T, st *store.Store) (chat.Snapshot, string) {
	t.Helper()
	th, runID := newThreadWithRun(t, st, "hi")
	if _, err := st.Claim(ctx, "w", time.Hour); err != nil {
		t.Fatal(err)
	}
	return th, runID
}

// With the writer held by a long transaction, a claimed run's deltas —
// its first one too: the claim confirmed it — still reach the feed at
// once, in seq order; replay and the snapshot see them; they are written
// when the writer frees, and Close writes the rest.
func TestDeltasFanOutBeforeTheyAreWritten(t *testing.T) {
	st, path, tap := openBufferedSQLite(t)
	th, runID := startClaimed(t, st)
	msgID := chat.NewID(chat.PrefixMessage)

	release := st.HoldWriter()
	done := make(chan error, 1)
	go func() {
		err := st.AppendDeltas(ctx, leaseW(runID), msgID, []string{"first "})
		for i := range 50 {
			if err != nil {
				break
			}
			err = st.AppendDeltas(ctx, leaseW(runID), msgID, []string{"w", string(rune('a' + i%26))})
		}
		done <- err
	}()
	if err := answerWithin(t, done, 20*time.Second, release, "AppendDeltas waited for the writer held by another transaction"); err != nil {
		t.Fatal(err)
	}
	ds := tap.deltas()
	if len(ds) != 101 {
		t.Fatalf("the feed got %d deltas while the writer was held, want 101", len(ds))
	}
	for i := 1; i < len(ds); i++ {
		if ds[i].Seq != ds[i-1].Seq+1 {
			t.Fatalf("fanned out seq %d after %d", ds[i].Seq, ds[i-1].Seq)
		}
	}
	if n := st.PendingDeltas(); n != 101 {
		t.Errorf("%d deltas held in memory, want 101", n)
	}
	replay, err := st.Events(ctx, user, th.ThreadID, ds[0].Seq)
	if err != nil || !replay.Complete || len(replay.Events) != 100 || replay.LastSeq != ds[100].Seq {
		t.Fatalf("replay while the deltas are in memory: complete %v, %d events, last %d, %v", replay.Complete, len(replay.Events), replay.LastSeq, err)
	}
	snap, err := st.Snapshot(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	if snap.LastSeq != ds[100].Seq || snap.ActiveRun == nil || !strings.HasPrefix(snap.ActiveRun.PartialText, "first wawb") || len(snap.ActiveRun.PartialText) != len("first ")+100 {
		t.Errorf("snapshot while the deltas are in memory: last seq %d (want %d), active %+v", snap.LastSeq, ds[100].Seq, snap.ActiveRun)
	}
	release()
	st.Close()
	raw, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	var written, reserved, lastSeq int64
	if err := raw.QueryRow(`SELECT (SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM stream_batches), seq_reserved, last_seq FROM threads WHERE thread_id = ?`, th.ThreadID).Scan(&written, &reserved, &lastSeq); err != nil {
		t.Fatal(err)
	}
	if written != 101 || lastSeq != ds[100].Seq || reserved > lastSeq {
		t.Errorf("after Close: %d deltas written (want 101), last_seq %d (want %d), seq_reserved %d (given back: at most last_seq)", written, lastSeq, ds[100].Seq, reserved)
	}
	reopened, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer reopened.Close()
	mustCheck(t, reopened, "after Close")
}

// A crash loses the deltas only memory held; at the next start their seqs
// (and the rest of the reservation) are recorded lost, no seq is handed out
// again, a replay across them is a snapshot, a fragment naming them is
// refused saying what is still known, and check is clean.
func TestCrashLosesOnlyTheStreamBufferAndRecordsIt(t *testing.T) {
	st, path, tap := openBufferedSQLite(t)
	whole, wholeRun := startClaimed(t, st) // its message is lost whole
	th, runID, msgID := startStreaming(t, st)
	if err := st.FlushStream(ctx); err != nil { // th's first delta is written
		t.Fatal(err)
	}
	release := st.HoldWriter() // nothing more is written before the crash
	wholeMsg := chat.NewID(chat.PrefixMessage)
	if err := st.AppendDeltas(ctx, leaseW(wholeRun), wholeMsg, []string{"never ", "written"}); err != nil {
		t.Fatal(err)
	}
	wholeSeen := tap.deltas()[len(tap.deltas())-1].Seq
	for range 5 {
		if err := st.AppendDeltas(ctx, leaseW(runID), msgID, []string{"lost "}); err != nil {
			t.Fatal(err)
		}
	}
	var seen []*chat.Event
	for _, d := range tap.deltas() {
		if d.ThreadID == th.ThreadID {
			seen = append(seen, d)
		}
	}
	lastSeen := seen[len(seen)-1].Seq
	st.StopFlusher() // else it may take the writer first and write them
	release()
	st.Crash()

	tap2 := &feedTap{}
	st2 := openExclusive(t, path, tap2)
	defer st2.Close()
	mustCheck(t, st2, "after the crash")
	snap, err := st2.Snapshot(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	if snap.LastSeq <= lastSeen {
		t.Fatalf("after the crash the thread ends at seq %d, not past seq %d a tab saw: seqs would repeat", snap.LastSeq, lastSeen)
	}
	replay, err := st2.Events(ctx, user, th.ThreadID, seen[0].Seq)
	if err != nil || replay.Complete {
		t.Errorf("replay across the lost seqs: complete %v (want false: a snapshot), %v", replay.Complete, err)
	}
	_, err = st2.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: th.ThreadID, MessageID: msgID, LastSeq: lastSeen, ExpectedStateVersion: snap.StateVersion})
	if chat.ErrorCode(err) != chat.CodeFragmentUnavailable || !strings.Contains(err.Error(), "lost when the server stopped") || !strings.Contains(err.Error(), "seq "+strconv.FormatInt(seen[0].Seq, 10)) {
		t.Errorf("a fragment naming lost deltas: %v, want fragment_unavailable saying what is still known (up to seq %d)", err, seen[0].Seq)
	}
	wholeSnap, err := st2.Snapshot(ctx, user, whole.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = st2.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: whole.ThreadID, MessageID: wholeMsg, LastSeq: wholeSeen, ExpectedStateVersion: wholeSnap.StateVersion})
	if chat.ErrorCode(err) != chat.CodeFragmentUnavailable || !strings.Contains(err.Error(), "before any of it was written") {
		t.Errorf("a fragment of a message lost whole: %v, want fragment_unavailable saying nothing of it is known", err)
	}
	if saved, err := st2.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: th.ThreadID, MessageID: msgID, LastSeq: seen[0].Seq, ExpectedStateVersion: snap.StateVersion}); err != nil {
		t.Errorf("a fragment of what was written before the crash: %v", err)
	} else if saved.MessageID == "" {
		t.Errorf("saved fragment %+v", saved)
	}
}

// A transaction that changes a live run (holding its thread's sequencer)
// and then loads the thread takes the thread's pending deltas along, as
// any transaction that loads a thread does: none is dropped.
func TestRunChangedThenThreadLoadedKeepsPendingDeltas(t *testing.T) {
	st, path, _ := openBufferedSQLite(t)
	defer st.Close()
	th, runID, msgID := startStreaming(t, st)
	if err := st.AppendDeltas(ctx, leaseW(runID), msgID, []string{"still ", "pending"}); err != nil {
		t.Fatal(err)
	}
	st.StopFlusher() // they stay in memory until a transaction takes them
	if n := st.PendingDeltas(); n == 0 {
		t.Fatal("nothing pending: the test would show nothing")
	}
	if err := st.ChangeRunThenLoadThread(ctx, runID, th.ThreadID); err != nil {
		t.Fatal(err)
	}
	if n := st.PendingDeltas(); n != 0 {
		t.Errorf("%d deltas still pending after a transaction loaded their thread", n)
	}
	mustCheck(t, st, "after the transaction")
	raw, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	var written int64
	if err := raw.QueryRow(`SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM stream_batches WHERE thread_id = ?`, th.ThreadID).Scan(&written); err != nil {
		t.Fatal(err)
	}
	if written != 3 {
		t.Errorf("%d deltas written, want 3 (first, still, pending)", written)
	}
}
