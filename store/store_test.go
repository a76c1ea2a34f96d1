package store_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

var ctx = context.Background()

const user = chat.LocalUserID

// open returns a store on a fresh database (testDSN) and its DSN; when the
// test ends, the invariant checker must find nothing.
func open(t *testing.T) (*store.Store, string) {
	t.Helper()
	return openStore(t, true)
}

func openStore(t *testing.T, checkAtEnd bool) (*store.Store, string) {
	t.Helper()
	return openStoreWith(t, checkAtEnd, store.Options{})
}

// openStoreWith is openStore with options (e.g. an OnCommit sink).
func openStoreWith(t *testing.T, checkAtEnd bool, opts store.Options) (*store.Store, string) {
	t.Helper()
	// As the server opens it: deltas are fanned out before they are
	// written.
	opts.Exclusive, opts.StreamBuffer = true, true
	return openStoreAs(t, checkAtEnd, opts)
}

// openStoreAs opens a test store with opts as they are: without
// Exclusive, every delta is written before it is fanned out (a grouped
// write, as on PostgreSQL).
func openStoreAs(t *testing.T, checkAtEnd bool, opts store.Options) (*store.Store, string) {
	t.Helper()
	path := testDSN(t)
	st, err := store.Open(ctx, path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if checkAtEnd && !t.Failed() {
			mustCheck(t, st, "at the end")
		}
		st.Close()
	})
	return st, path
}

func code(err error) string { return chat.ErrorCode(err) }

func text(s string) *string { return &s }

func newThread(t testing.TB, st *store.Store) chat.Snapshot {
	t.Helper()
	snap, err := st.CreateThread(ctx, user, "t")
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// startRun starts a run on threadID, expecting the thread at state version
// expected, with the user message question; it returns the run.
func startRun(t testing.TB, st *store.Store, threadID string, expected int64, question string) string {
	t.Helper()
	ack, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: threadID, ExpectedStateVersion: expected, UserMessage: text(question)})
	if err != nil {
		t.Fatal(err)
	}
	return ack.RunID
}

// newThreadWithRun creates a thread and starts a run on it with the user
// message question; it returns the thread as created and the run.
func newThreadWithRun(t testing.TB, st *store.Store, question string) (chat.Snapshot, string) {
	t.Helper()
	th := newThread(t, st)
	return th, startRun(t, st, th.ThreadID, th.StateVersion, question)
}

// streamAndCancel runs one run by hand as a worker would (claim, deltas)
// and cancels it; it returns the run, the streamed message id and the seq of
// its last delta.
func streamAndCancel(t *testing.T, st *store.Store, threadID string, version int64, deltas ...string) (string, string, int64) {
	t.Helper()
	runID := startRun(t, st, threadID, version, "hi")
	if _, err := st.Claim(ctx, "w", time.Hour); err != nil {
		t.Fatal(err)
	}
	msgID := chat.NewID(chat.PrefixMessage)
	if err := st.AppendDeltas(ctx, leaseW(runID), msgID, deltas); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: runID, Reason: "user_requested", RequestedBy: "tab:a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishCancel(ctx, runID, ptr(leaseW(runID)), 0); err != nil {
		t.Fatal(err)
	}
	snap, err := st.Snapshot(ctx, user, threadID)
	if err != nil {
		t.Fatal(err)
	}
	return runID, msgID, snap.LastSeq - 2 // run.cancel_requested and run.cancelled follow the deltas
}

func TestCreateThreadStartsAtVersionOne(t *testing.T) {
	st, _ := open(t)
	snap := newThread(t, st)
	if snap.StateVersion != 1 || snap.LastSeq != 1 || snap.HeadCheckpointID == "" || snap.Messages == nil || len(snap.Messages) != 0 || snap.ActiveRun != nil {
		t.Fatalf("new thread snapshot = %+v", snap)
	}
	if !strings.HasPrefix(snap.ThreadID, chat.PrefixThread) || !strings.HasPrefix(snap.HeadCheckpointID, chat.PrefixCheckpoint) {
		t.Fatalf("id prefixes: %s %s", snap.ThreadID, snap.HeadCheckpointID)
	}
}

func TestStaleVersionConflictNamesTheCheckpointTheTabSaw(t *testing.T) {
	st, _ := open(t)
	snap := newThread(t, st)
	first, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: snap.ThreadID, ExpectedStateVersion: 1, UserMessage: text("a")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: snap.ThreadID, ExpectedStateVersion: 1, UserMessage: text("b")})
	var ce *chat.Error
	if !errors.As(err, &ce) || ce.Code != chat.CodeStateVersionConflict {
		t.Fatalf("stale start = %v", err)
	}
	cur, _ := st.Snapshot(ctx, user, snap.ThreadID)
	if ce.Fields["current_state_version"] != cur.StateVersion || ce.Fields["current_checkpoint_id"] != cur.HeadCheckpointID {
		t.Fatalf("conflict fields = %+v, thread = v%d %s", ce.Fields, cur.StateVersion, cur.HeadCheckpointID)
	}
	actions := ce.Fields["allowed_actions"].([]string)
	if len(actions) != 2 || actions[0] != "reload" || actions[1] != "fork_from_"+snap.HeadCheckpointID {
		t.Fatalf("allowed_actions = %v, want reload and fork_from_%s", actions, snap.HeadCheckpointID)
	}
	if first.StateVersion != cur.StateVersion {
		t.Fatalf("ack version %d, thread at %d", first.StateVersion, cur.StateVersion)
	}
}

// Race scenario 3: two tabs continue the same checkpoint at once. Exactly
// one gets a new version; the other a conflict.
func TestTwoTabsContinueSameCheckpoint(t *testing.T) {
	st, _ := open(t)
	snap := newThread(t, st)
	const tabs = 8
	var wg sync.WaitGroup
	errs := make([]error, tabs)
	for i := range tabs {
		wg.Go(func() {
			_, errs[i] = st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: snap.ThreadID, ExpectedStateVersion: snap.StateVersion, UserMessage: text(fmt.Sprint("tab ", i))})
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
		} else if code(err) != chat.CodeStateVersionConflict {
			t.Fatalf("unexpected error: %v", err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d tabs started a run from the same version, want exactly 1", ok)
	}
	got, _ := st.Snapshot(ctx, user, snap.ThreadID)
	if len(got.Messages) != 1 {
		t.Fatalf("history holds %d user messages, want 1", len(got.Messages))
	}
}

func TestOneActiveRunAndClientRequestDedup(t *testing.T) {
	st, _ := open(t)
	snap := newThread(t, st)
	a, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: snap.ThreadID, ExpectedStateVersion: 1, UserMessage: text("a"), ClientRequestID: "req-1"})
	if err != nil {
		t.Fatal(err)
	}
	// A retry with the same client_request_id, even with the now-stale
	// version, answers the same run and writes nothing.
	b, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: snap.ThreadID, ExpectedStateVersion: 1, UserMessage: text("a"), ClientRequestID: "req-1"})
	if err != nil || b != a {
		t.Fatalf("retry = %+v, %v; first = %+v", b, err, a)
	}
	_, err = st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: snap.ThreadID, ExpectedStateVersion: a.StateVersion, UserMessage: text("b")})
	var ce *chat.Error
	if !errors.As(err, &ce) || ce.Code != chat.CodeRunAlreadyActive || ce.Fields["run_id"] != a.RunID {
		t.Fatalf("second run = %v", err)
	}
	got, _ := st.Snapshot(ctx, user, snap.ThreadID)
	if got.StateVersion != a.StateVersion || len(got.Messages) != 1 {
		t.Fatalf("refused commands changed the thread: %+v", got)
	}
}

func TestContinueNeedsPendingStep(t *testing.T) {
	st, _ := open(t)
	snap := newThread(t, st)
	_, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: snap.ThreadID, ExpectedStateVersion: 1})
	if code(err) != chat.CodeInvalidRequest {
		t.Fatalf("continue on an empty thread = %v", err)
	}
}

func TestCancelAnswersAndAudits(t *testing.T) {
	st, path := open(t)
	snap := newThread(t, st)
	runID, _, _ := streamAndCancel(t, st, snap.ThreadID, 1, "ab", "cd")
	r, err := st.Run(ctx, user, runID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != chat.RunCancelled || r.DiscardedStreamChars != 4 || r.CancelReason == nil || *r.CancelReason != "user_requested" || r.ResumeCheckpointID == nil {
		t.Fatalf("run = %+v", r)
	}
	again, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: runID, Reason: "user_requested", RequestedBy: "tab:b"})
	if err != nil || !again.AlreadyRequested || again.Status != chat.RunCancelled {
		t.Fatalf("second cancel = %+v, %v", again, err)
	}
	db := rawDB(t, path)
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM cancel_audit WHERE run_id = ?`, runID).Scan(&n); err != nil || n != 2 {
		t.Fatalf("audit rows = %d, %v; want 2 (both requests recorded)", n, err)
	}
	// A completed run cannot be cancelled.
	cur, _ := st.Snapshot(ctx, user, snap.ThreadID)
	ack, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: snap.ThreadID, ExpectedStateVersion: cur.StateVersion, UserMessage: text("again")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Claim(ctx, "w", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := st.AppendDeltas(ctx, leaseW(ack.RunID), "msg_ok", []string{"ok"}); err != nil {
		t.Fatal(err)
	}
	if err := st.PublishStep(ctx, leaseW(ack.RunID), chat.StepOutput{Step: pendingStep(t, st, ack.RunID), MessageID: "msg_ok", Kind: chat.KindText, Content: "ok"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, leaseW(ack.RunID)); err != nil {
		t.Fatal(err)
	}
	_, _, err = st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: ack.RunID, Reason: "user_requested", RequestedBy: "tab:b"})
	var ce *chat.Error
	if !errors.As(err, &ce) || ce.Code != chat.CodeRunNotActive || ce.Fields["status"] != chat.RunCompleted {
		t.Fatalf("cancel of completed run = %v", err)
	}
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: "run_nope", Reason: "x", RequestedBy: "y"}); code(err) != chat.CodeNotFound {
		t.Fatalf("cancel of unknown run = %v", err)
	}
}

func TestSaveFragmentIsExactlyWhatTheTabSaw(t *testing.T) {
	st, _ := open(t)
	snap := newThread(t, st)
	runID, msgID, lastDelta := streamAndCancel(t, st, snap.ThreadID, 1, "Hello", " wor", "ld", "!")
	cur, _ := st.Snapshot(ctx, user, snap.ThreadID)
	// The tab displayed up to the third delta.
	saved, err := st.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: snap.ThreadID, MessageID: msgID, LastSeq: lastDelta - 1, ExpectedStateVersion: cur.StateVersion})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := st.Snapshot(ctx, user, snap.ThreadID)
	frag := got.Messages[len(got.Messages)-1]
	if frag.MessageID != saved.MessageID || frag.Kind != chat.KindFragment || frag.Content != "Hello world" || frag.RunID != nil ||
		frag.FragmentOf == nil || frag.FragmentOf.RunID != runID || frag.FragmentOf.MessageID != msgID || frag.FragmentOf.LastSeq != lastDelta-1 {
		t.Fatalf("fragment = %+v", frag)
	}
	if got.HeadCheckpointID != saved.CheckpointID || got.StateVersion != saved.StateVersion {
		t.Fatalf("ack %+v vs thread %+v", saved, got)
	}
	// Several fragments of one message are allowed.
	if _, err := st.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: snap.ThreadID, MessageID: msgID, LastSeq: lastDelta, ExpectedStateVersion: got.StateVersion}); err != nil {
		t.Fatal(err)
	}
	// Continue from the saved point keeps the pending step.
	cps := got.HeadCheckpointID
	_, list, _ := st.Checkpoints(ctx, user, snap.ThreadID)
	for _, cp := range list {
		if cp.CheckpointID == cps && (cp.Pending == nil || cp.Pending.Step != chat.StepGenerate) {
			t.Fatalf("fragment checkpoint lost the pending step: %+v", cp)
		}
	}

	// Errors: unknown message, stale version, before the first delta, purged.
	cur, _ = st.Snapshot(ctx, user, snap.ThreadID)
	cases := []struct {
		name string
		p    chat.SaveFragment
		want string
	}{
		{"unknown message", chat.SaveFragment{MessageID: "msg_nope", LastSeq: lastDelta, ExpectedStateVersion: cur.StateVersion}, chat.CodeNotFound},
		{"stale version", chat.SaveFragment{MessageID: msgID, LastSeq: lastDelta, ExpectedStateVersion: cur.StateVersion - 1}, chat.CodeStateVersionConflict},
		{"before first delta", chat.SaveFragment{MessageID: msgID, LastSeq: 1, ExpectedStateVersion: cur.StateVersion}, chat.CodeInvalidRequest},
		{"beyond the thread", chat.SaveFragment{MessageID: msgID, LastSeq: cur.LastSeq + 5, ExpectedStateVersion: cur.StateVersion}, chat.CodeInvalidRequest},
	}
	for _, c := range cases {
		c.p.UserID, c.p.ThreadID = user, snap.ThreadID
		if _, err := st.SaveFragment(ctx, c.p); code(err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
	if n, err := st.Retention().PurgeStream(ctx, time.Now().Add(time.Minute)); err != nil || n != 4 {
		t.Fatalf("purge = %d, %v", n, err)
	}
	_, err = st.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: snap.ThreadID, MessageID: msgID, LastSeq: lastDelta, ExpectedStateVersion: cur.StateVersion})
	if code(err) != chat.CodeFragmentUnavailable {
		t.Fatalf("fragment after purge = %v", err)
	}
	if after, _ := st.Snapshot(ctx, user, snap.ThreadID); after.StateVersion != cur.StateVersion {
		t.Fatal("refused fragment saves changed the thread")
	}
}

func TestDeleteDraft(t *testing.T) {
	st, _ := open(t)
	snap := newThread(t, st)
	_, msgID, lastDelta := streamAndCancel(t, st, snap.ThreadID, 1, "draft text")
	cur, _ := st.Snapshot(ctx, user, snap.ThreadID)
	saved, err := st.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: snap.ThreadID, MessageID: msgID, LastSeq: lastDelta, ExpectedStateVersion: cur.StateVersion})
	if err != nil {
		t.Fatal(err)
	}
	userMsg := cur.Messages[0].MessageID
	if _, err := st.DeleteDraft(ctx, chat.DeleteDraft{UserID: user, ThreadID: snap.ThreadID, MessageID: userMsg, ExpectedStateVersion: saved.StateVersion}); code(err) != chat.CodeInvalidRequest {
		t.Fatalf("deleting a user message = %v", err)
	}
	if _, err := st.DeleteDraft(ctx, chat.DeleteDraft{UserID: user, ThreadID: snap.ThreadID, MessageID: saved.MessageID, ExpectedStateVersion: saved.StateVersion - 1}); code(err) != chat.CodeStateVersionConflict {
		t.Fatalf("stale delete = %v", err)
	}
	del, err := st.DeleteDraft(ctx, chat.DeleteDraft{UserID: user, ThreadID: snap.ThreadID, MessageID: saved.MessageID, ExpectedStateVersion: saved.StateVersion})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := st.Snapshot(ctx, user, snap.ThreadID)
	if len(got.Messages) != 1 || got.HeadCheckpointID != del.CheckpointID || got.StateVersion != del.StateVersion {
		t.Fatalf("after delete: %+v (ack %+v)", got, del)
	}
	if _, err := st.DeleteDraft(ctx, chat.DeleteDraft{UserID: user, ThreadID: snap.ThreadID, MessageID: saved.MessageID, ExpectedStateVersion: del.StateVersion}); code(err) != chat.CodeNotFound {
		t.Fatalf("second delete = %v", err)
	}
	// The point from before the deletion would bring the draft back: a
	// checkout to it is refused, and one to the point before the save is
	// not.
	if _, err := st.Checkout(ctx, chat.Checkout{UserID: user, ThreadID: snap.ThreadID, CheckpointID: saved.CheckpointID, ExpectedStateVersion: del.StateVersion}); code(err) != chat.CodeInvalidRequest {
		t.Fatalf("checkout to the point holding the deleted draft = %v", err)
	}
	moved, err := st.Checkout(ctx, chat.Checkout{UserID: user, ThreadID: snap.ThreadID, CheckpointID: cur.HeadCheckpointID, ExpectedStateVersion: del.StateVersion})
	if err != nil || moved.StateVersion != del.StateVersion+1 {
		t.Fatalf("checkout to the point before the save = %+v, %v", moved, err)
	}
	if got, _ := st.Snapshot(ctx, user, snap.ThreadID); got.HeadCheckpointID != cur.HeadCheckpointID || len(got.Messages) != 1 {
		t.Fatalf("after checkout: %+v", got)
	}
	mustCheck(t, st, "after a checkout")
}

func TestForkCopiesStateAndContinues(t *testing.T) {
	st, _ := open(t)
	snap := newThread(t, st)
	streamAndCancel(t, st, snap.ThreadID, 1, "x")
	src, _ := st.Snapshot(ctx, user, snap.ThreadID)
	fork, err := st.Fork(ctx, chat.Fork{UserID: user, ThreadID: snap.ThreadID, FromCheckpointID: src.HeadCheckpointID})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := st.Snapshot(ctx, user, fork.ThreadID)
	if got.StateVersion != 1 || len(got.Messages) != 1 || got.Messages[0].MessageID != src.Messages[0].MessageID ||
		fork.ForkedFrom == nil || fork.ForkedFrom.CheckpointID != src.HeadCheckpointID {
		t.Fatalf("fork = %+v / %+v", fork, got)
	}
	// The fork keeps the pending step: continue works there.
	if _, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: fork.ThreadID, ExpectedStateVersion: 1}); err != nil {
		t.Fatalf("continue in fork: %v", err)
	}
	if again, _ := st.Snapshot(ctx, user, snap.ThreadID); again.StateVersion != src.StateVersion {
		t.Fatal("fork changed the original")
	}
	if _, err := st.Fork(ctx, chat.Fork{UserID: user, ThreadID: snap.ThreadID, FromCheckpointID: got.HeadCheckpointID}); code(err) != chat.CodeCheckpointNotFound {
		t.Fatalf("fork from another thread's checkpoint = %v", err)
	}
	if _, err := st.Fork(ctx, chat.Fork{UserID: "usr_other", ThreadID: snap.ThreadID, FromCheckpointID: src.HeadCheckpointID}); code(err) != chat.CodeNotFound {
		t.Fatalf("fork of another user's thread = %v", err)
	}
}

func TestEventsReplayIsExactOrSaysIncomplete(t *testing.T) {
	st, _ := open(t)
	snap := newThread(t, st)
	streamAndCancel(t, st, snap.ThreadID, 1, "a", "b", "c")
	cur, _ := st.Snapshot(ctx, user, snap.ThreadID)
	all, err := st.Events(ctx, user, snap.ThreadID, 0)
	if err != nil || !all.Complete || int64(len(all.Events)) != cur.LastSeq {
		t.Fatalf("replay from 0: complete=%v n=%d last=%d err=%v", all.Complete, len(all.Events), cur.LastSeq, err)
	}
	for i, ev := range all.Events {
		if ev.Seq != int64(i+1) || !strings.Contains(string(ev.Raw), fmt.Sprintf(`"seq":%d,`, ev.Seq)) {
			t.Fatalf("event %d = seq %d %s", i, ev.Seq, ev.Raw)
		}
	}
	tail, _ := st.Events(ctx, user, snap.ThreadID, cur.LastSeq-2)
	if !tail.Complete || len(tail.Events) != 2 || tail.Events[0].Seq != cur.LastSeq-1 {
		t.Fatalf("tail replay = %+v", tail)
	}
	if beyond, _ := st.Events(ctx, user, snap.ThreadID, cur.LastSeq+1); beyond.Complete {
		t.Fatal("a seq beyond the end must not count as caught up")
	}
	// Bounded in bytes too: a gap whose text is larger than the bound is
	// answered with a snapshot, however few events it holds.
	var size int64
	for _, ev := range all.Events {
		size += int64(len(ev.Raw))
	}
	restore := store.SetMaxReplayBytes(size / 2)
	if big, err := st.Events(ctx, user, snap.ThreadID, 0); err != nil || big.Complete || big.Events != nil {
		t.Fatalf("a replay of %d bytes over a bound of %d = complete %v, %d events, %v", size, size/2, big.Complete, len(big.Events), err)
	}
	if small, err := st.Events(ctx, user, snap.ThreadID, cur.LastSeq-1); err != nil || !small.Complete {
		t.Fatalf("a small tail under the same bound = %+v, %v", small, err)
	}
	restore()
	if _, err := st.Retention().PurgeStream(ctx, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if gap, _ := st.Events(ctx, user, snap.ThreadID, 0); gap.Complete || gap.Events != nil {
		t.Fatalf("replay across purged deltas claims to be complete: %+v", gap)
	}
	if _, err := st.Events(ctx, "usr_other", snap.ThreadID, 0); code(err) != chat.CodeNotFound {
		t.Fatalf("another user's events = %v", err)
	}
}

func TestListThreadsPages(t *testing.T) {
	st, _ := open(t)
	var ids []string
	for range 5 {
		ids = append(ids, newThread(t, st).ThreadID)
	}
	var got []string
	cursor := ""
	for page := 0; page < 10; page++ {
		threads, next, err := st.ListThreads(ctx, user, 2, cursor, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, th := range threads {
			got = append(got, th.ThreadID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if len(got) != 5 || got[0] != ids[4] || got[4] != ids[0] {
		t.Fatalf("pages = %v, created %v", got, ids)
	}
	if _, _, err := st.ListThreads(ctx, user, 2, "garbage", ""); code(err) != chat.CodeInvalidRequest {
		t.Fatalf("bad cursor = %v", err)
	}
}

func TestExclusiveOpenRefusesASecondServer(t *testing.T) {
	if onPostgres() {
		t.Skip("SQLite only: the .lock file guards a database file; instances sharing PostgreSQL run side by side")
	}
	path := filepath.Join(t.TempDir(), "gw.db")
	first, err := store.Open(ctx, path, store.Options{Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Open(ctx, path, store.Options{Exclusive: true}); err == nil || !strings.Contains(err.Error(), "in use by another gateway") {
		t.Fatalf("second exclusive open = %v", err)
	}
	// A reader such as `gateway check` may still open it.
	reader, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reader.Close()
	first.Close()
	again, err := store.Open(ctx, path, store.Options{Exclusive: true})
	if err != nil {
		t.Fatalf("open after the first closed: %v", err)
	}
	again.Close()
}

func TestFirstRequestNamesAnUntitledThread(t *testing.T) {
	st, _ := open(t)
	snap, err := st.CreateThread(ctx, user, chat.DefaultTitle)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: snap.ThreadID, ExpectedStateVersion: 1, UserMessage: text("Plan a spring trip to Lisbon\nwith kids")})
	if err != nil {
		t.Fatal(err)
	}
	th, _ := st.Thread(ctx, user, snap.ThreadID)
	if th.Title != "Plan a spring trip to Lisbon" || th.StateVersion != ack.StateVersion {
		t.Fatalf("thread after first request = %+v", th)
	}
	// A title the user chose is never replaced.
	named := newThread(t, st)
	if _, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: named.ThreadID, ExpectedStateVersion: 1, UserMessage: text("hello")}); err != nil {
		t.Fatal(err)
	}
	if th, _ := st.Thread(ctx, user, named.ThreadID); th.Title != "t" {
		t.Fatalf("a chosen title was replaced: %q", th.Title)
	}
}

func TestBackupIsAConsistentCopy(t *testing.T) {
	st, _ := open(t)
	snap := newThread(t, st)
	streamAndCancel(t, st, snap.ThreadID, 1, "a", "b")
	dest := filepath.Join(t.TempDir(), "copy", "backup.db")
	if st.Postgres() {
		// VACUUM INTO copies SQLite files; PostgreSQL has pg_dump.
		if err := st.Backup(ctx, dest); err == nil || !strings.Contains(err.Error(), "pg_dump") {
			t.Fatalf("backup on PostgreSQL = %v, want a refusal naming pg_dump", err)
		}
		return
	}
	if err := st.Backup(ctx, dest); err != nil {
		t.Fatal(err)
	}
	if err := st.Backup(ctx, dest); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("a second backup over the first = %v", err)
	}
	copied, err := store.Open(ctx, dest, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer copied.Close()
	if vs, err := copied.Check(ctx); err != nil || len(vs) != 0 {
		t.Fatalf("check of the backup = %v, %v", vs, err)
	}
	orig, _ := st.Snapshot(ctx, user, snap.ThreadID)
	got, err := copied.Snapshot(ctx, user, snap.ThreadID)
	if err != nil || got.StateVersion != orig.StateVersion || got.LastSeq != orig.LastSeq || len(got.Messages) != len(orig.Messages) {
		t.Fatalf("backup snapshot = %+v, %v; original %+v", got, err, orig)
	}
}

// CompleteWith publishes a run's last step and completes the run in one
// commit; a run whose cancel was accepted first gets nothing published,
// and a step with a tool call is refused.
func TestCompleteWithPublishesAndCompletesInOneCommit(t *testing.T) {
	log := &commitLog{}
	st, _ := openStoreWith(t, true, store.Options{OnCommit: log.add})
	th := newThread(t, st)
	runID := startAndClaim(t, st, th.ThreadID, "hi")
	msgID := chat.NewID(chat.PrefixMessage)
	if err := st.AppendDeltas(ctx, leaseW(runID), msgID, []string{"Hel", "lo"}); err != nil {
		t.Fatal(err)
	}
	out := chat.StepOutput{Step: pendingStep(t, st, runID), MessageID: msgID, Kind: chat.KindText, Content: "Hello", Model: "demo-test"}
	if err := st.CompleteWith(ctx, leaseW(runID), chat.StepOutput{Step: out.Step, MessageID: msgID, Content: "x",
		Call: &chat.ToolCall{OperationID: "op_x", Tool: "t", Contract: "idempotent"}}); err == nil {
		t.Fatal("CompleteWith of a step with a tool call was accepted")
	}
	log.mu.Lock()
	before := len(log.commits)
	log.mu.Unlock()
	if err := st.CompleteWith(ctx, leaseW(runID), out); err != nil {
		t.Fatal(err)
	}
	log.mu.Lock()
	commits := log.commits[before:]
	log.mu.Unlock()
	var types []string
	for _, c := range commits {
		for _, ev := range c {
			if ev.Type != chat.EventMessageDelta {
				types = append(types, ev.Type)
			}
		}
	}
	if len(commits) != 1 || strings.Join(types, " ") != "message.published checkpoint.created run.completed" {
		t.Fatalf("%d commits with %v, want one: message.published checkpoint.created run.completed", len(commits), types)
	}
	snap, err := st.Snapshot(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	if snap.ActiveRun != nil || len(snap.Messages) != 2 || snap.Messages[1].Content != "Hello" || snap.LastRun == nil || snap.LastRun.Status != chat.RunCompleted {
		t.Fatalf("after CompleteWith: active %+v, %d messages, last run %+v", snap.ActiveRun, len(snap.Messages), snap.LastRun)
	}
	if snap.Messages[1].Model != "demo-test" || snap.Messages[0].Model != "" {
		t.Fatalf("models: the reply %q (want demo-test), the request %q (want none)", snap.Messages[1].Model, snap.Messages[0].Model)
	}

	// A cancel accepted first: nothing is published.
	run2 := startAndClaim(t, st, th.ThreadID, "more")
	step2 := pendingStep(t, st, run2)
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: run2, Reason: "user_requested", RequestedBy: "tab:t"}); err != nil {
		t.Fatal(err)
	}
	err = st.CompleteWith(ctx, leaseW(run2), chat.StepOutput{Step: step2, MessageID: chat.NewID(chat.PrefixMessage), Kind: chat.KindText, Content: "late"})
	var nr *chat.ErrNotRunning
	if !errors.As(err, &nr) || nr.Status != chat.RunCancelRequested {
		t.Fatalf("CompleteWith after a cancel: %v, want ErrNotRunning (cancel_requested)", err)
	}
	if _, err := st.FinishCancel(ctx, run2, ptr(leaseW(run2)), 0); err != nil {
		t.Fatal(err)
	}
	snap, err = st.Snapshot(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Messages) != 3 || snap.Messages[2].Content != "more" {
		t.Fatalf("after a refused CompleteWith the history is %+v, want the question only", snap.Messages)
	}
}

// A search keeps the threads where every word appears in the title or in
// a message (not a deleted draft), as a literal substring, whatever the
// case of ASCII letters; it pages like the plain list and never shows
// another user's threads.
func TestListThreadsSearch(t *testing.T) {
	st, _ := open(t)
	// A deleted draft is not searched (first: the runs started below stay
	// queued, and streamAndCancel claims the oldest).
	snap := newThread(t, st)
	draft := snap.ThreadID
	_, msgID, lastDelta := streamAndCancel(t, st, snap.ThreadID, 1, "zucchini ", "notes")
	cur, _ := st.Snapshot(ctx, user, snap.ThreadID)
	saved, err := st.SaveFragment(ctx, chat.SaveFragment{UserID: user, ThreadID: snap.ThreadID, MessageID: msgID, LastSeq: lastDelta, ExpectedStateVersion: cur.StateVersion})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(t, st, "zucchini"); !slices.Equal(got, []string{snap.ThreadID}) {
		t.Fatalf("the saved fragment is not found: %v", got)
	}
	if _, err := st.DeleteDraft(ctx, chat.DeleteDraft{UserID: user, ThreadID: snap.ThreadID, MessageID: saved.MessageID, ExpectedStateVersion: saved.StateVersion}); err != nil {
		t.Fatal(err)
	}
	if got := ids(t, st, "zucchini"); got != nil {
		t.Errorf("a deleted draft is still found: %v", got)
	}
	start := func(title, message string) string {
		snap := newThread(t, st)
		if err := st.RenameThread(ctx, user, snap.ThreadID, title); err != nil {
			t.Fatal(err)
		}
		if _, err := st.StartRun(ctx, chat.StartRun{UserID: user, ThreadID: snap.ThreadID, ExpectedStateVersion: snap.StateVersion, UserMessage: text(message)}); err != nil {
			t.Fatal(err)
		}
		return snap.ThreadID
	}
	tomatoes := start("Garden plans", "When do I plant Tomatoes in 100% clay?")
	roses := start("Roses", "How do I prune roses_in_winter?")
	both := start("Tomatoes and roses", "Which soil?")
	bob, err := st.Accounts().CreateUser(ctx, "bob", "")
	if err != nil {
		t.Fatal(err)
	}
	bobs, err := st.CreateThread(ctx, bob.UserID, "tomatoes of bob")
	if err != nil {
		t.Fatal(err)
	}
	find := func(q string) []string { t.Helper(); return ids(t, st, q) }
	sorted := func(ids ...string) []string { slices.Sort(ids); return ids }
	for _, c := range []struct {
		q    string
		want []string
	}{
		{"tomato", sorted(tomatoes, both)},    // a message, a title; any case
		{"TOMATO clay", sorted(tomatoes)},     // both words, in one thread
		{"garden tomatoes", sorted(tomatoes)}, // one in the title, one in a message
		{"roses winter", sorted(roses)},
		{"100%", sorted(tomatoes)}, // % is a literal
		{"0%", sorted(tomatoes)},
		{"s_i", sorted(roses)}, // _ is a literal
		{"%", sorted(tomatoes)},
		{"_", sorted(roses)},
		{"bob", nil}, // another user's thread is never found
		{"cucumber", nil},
		{"", sorted(draft, tomatoes, roses, both)},
	} {
		if got := find(c.q); !slices.Equal(got, c.want) {
			t.Errorf("search %q found %v, want %v", c.q, got, c.want)
		}
	}
	_ = bobs
	// Pages of one result each, with the cursor, hold every result once.
	first, next, err := st.ListThreads(ctx, user, 1, "", "o")
	if err != nil || len(first) != 1 || next == "" {
		t.Fatalf("first page: %v %q %v", first, next, err)
	}
	seen := []string{first[0].ThreadID}
	for next != "" {
		var page []chat.Thread
		page, next, err = st.ListThreads(ctx, user, 1, next, "o")
		if err != nil {
			t.Fatal(err)
		}
		for _, th := range page {
			seen = append(seen, th.ThreadID)
		}
	}
	if slices.Sort(seen); !slices.Equal(seen, sorted(tomatoes, roses, both)) {
		t.Errorf("paged search found %v", seen)
	}

}

// ids is what a search of the user's threads finds, sorted.
func ids(t *testing.T, st *store.Store, q string) []string {
	t.Helper()
	threads, _, err := st.ListThreads(ctx, user, 50, "", q)
	if err != nil {
		t.Fatalf("search %q: %v", q, err)
	}
	var out []string
	for _, th := range threads {
		out = append(out, th.ThreadID)
	}
	slices.Sort(out)
	return out
}
