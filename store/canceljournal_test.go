package store_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// The cancel journal (canceljournal.go): a cancel that would wait for the
// writer is acknowledged once synced to the journal, and the writer
// records it with the values the ack gave.

func cancelOf(runID string) chat.CancelRun {
	return chat.CancelRun{UserID: user, RunID: runID, Reason: chat.ReasonUserRequested, RequestedBy: "tab:t"}
}

// requestCancelAsync sends a cancel and returns where its answer comes.
type cancelAnswer struct {
	ack chat.CancelAck
	err error
}

func requestCancelAsync(st *store.Store, p chat.CancelRun) <-chan cancelAnswer {
	out := make(chan cancelAnswer, 1)
	go func() {
		ack, _, err := st.RequestCancel(ctx, p)
		out <- cancelAnswer{ack, err}
	}()
	return out
}

// answered waits (bounded) for a cancel's answer; past the bound it
// releases the writer the test holds and fails.
func answered(t *testing.T, ch <-chan cancelAnswer, release func(), what string) cancelAnswer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(10 * time.Second):
		release()
		t.Fatalf("%s was not answered", what)
	}
	return cancelAnswer{}
}

func journalLines(t *testing.T, dbPath string) int {
	t.Helper()
	b, err := os.ReadFile(dbPath + "-cancels")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range b {
		if c == '\n' {
			n++
		}
	}
	return n
}

// cancelRecorded checks the database holds the cancel the ack announced:
// status, version, resume point, one run.cancel_requested at that version
// that tabs were sent, and one audit row.
func cancelRecorded(t *testing.T, st *store.Store, path string, tap *feedTap, ack chat.CancelAck) {
	t.Helper()
	run, err := st.Run(ctx, user, ack.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if !run.Status.CancelAccepted() {
		t.Fatalf("run %s is %s after its cancel was acknowledged", ack.RunID, run.Status)
	}
	db := rawDB(t, path)
	var recorded int64
	if err := db.QueryRow(`SELECT cancel_state_version FROM runs WHERE run_id = ?`, ack.RunID).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if recorded != ack.AcceptedStateVersion {
		t.Fatalf("the run's cancel is recorded at version %d, the ack said %d", recorded, ack.AcceptedStateVersion)
	}
	var version int64
	var n int
	if err := db.QueryRow(`SELECT COUNT(*), COALESCE(MAX(state_version), 0) FROM events
		WHERE run_id = ? AND type = ?`, ack.RunID, chat.EventRunCancelRequested).Scan(&n, &version); err != nil {
		t.Fatal(err)
	}
	if n != 1 || version != ack.AcceptedStateVersion {
		t.Fatalf("%d run.cancel_requested events, at version %d; the ack said %d", n, version, ack.AcceptedStateVersion)
	}
	if err := db.QueryRow(`SELECT COUNT(*) FROM cancel_audit WHERE run_id = ? AND accepted_state_version = ?
		AND already_requested = ?`, ack.RunID, ack.AcceptedStateVersion, false).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d audit rows of the cancel accepted at its version (%v)", n, err)
	}
	if tap != nil {
		seen := 0
		tap.mu.Lock()
		for _, ev := range tap.evs {
			if ev.RunID == ack.RunID && ev.Type == chat.EventRunCancelRequested && ev.StateVersion == ack.AcceptedStateVersion {
				seen++
			}
		}
		tap.mu.Unlock()
		if seen != 1 {
			t.Fatalf("tabs were sent run.cancel_requested at the ack's version %d times, want once", seen)
		}
	}
}

func checkClean(t *testing.T, st *store.Store) {
	t.Helper()
	vs, err := st.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		t.Errorf("check: %v", v)
	}
}

// While the writer is busy (held, as by a commit stalled in its sync) a
// cancel is acknowledged from the journal without waiting for it: the
// record is in the journal file before the ack, the database gets it,
// with the ack's version, as soon as the writer is free, and the journal
// is emptied then. A read in between waits for it (never shows the run
// as it was before the ack).
func TestJournalAcknowledgesACancelWithoutTheWriter(t *testing.T) {
	st, path, tap := openBufferedSQLite(t)
	defer st.Close()
	th, runID, _ := startStreaming(t, st)
	before, err := st.Snapshot(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	release := st.HoldWriterStalled()
	a := answered(t, requestCancelAsync(st, cancelOf(runID)), release, "the cancel, with the writer held,")
	if a.err != nil {
		release()
		t.Fatal(a.err)
	}
	want := chat.CancelAck{RunID: runID, Status: chat.RunCancelRequested, AcceptedStateVersion: before.StateVersion + 1,
		ResumeCheckpointID: before.HeadCheckpointID}
	if a.ack.RunID != want.RunID || a.ack.Status != want.Status || a.ack.AcceptedStateVersion != want.AcceptedStateVersion ||
		a.ack.ResumeCheckpointID != want.ResumeCheckpointID || a.ack.AlreadyRequested {
		release()
		t.Fatalf("ack %+v, want %+v", a.ack, want)
	}
	if n := journalLines(t, path); n != 1 {
		release()
		t.Fatalf("the journal holds %d records once the cancel was acknowledged, want 1", n)
	}
	read := make(chan chat.Run, 1)
	go func() {
		r, _ := st.Run(ctx, user, runID)
		read <- r
	}()
	// While the writer is held the read cannot answer: it waits for the
	// cancel to be recorded. (A bounded look: correct code never answers
	// here, however long the test looks.)
	select {
	case r := <-read:
		release()
		t.Fatalf("a read answered (%s) while the cancel it follows was not recorded", r.Status)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	select {
	case r := <-read:
		if !r.Status.CancelAccepted() {
			t.Fatalf("a read sent after the ack shows the run %s", r.Status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read after the ack never answered")
	}
	cancelRecorded(t, st, path, tap, a.ack)
	waitUntil(t, func() bool { return journalLines(t, path) == 0 }, nil, "the journal was not emptied")
	if n := st.JournalMismatches(); n != 0 {
		t.Fatalf("%d journaled cancels recorded with another version than their ack", n)
	}
	checkClean(t, st)
}

// A process killed after a cancel was acknowledged from the journal and
// before the writer recorded it: the next start records it, with the
// ack's values, before anything else runs.
func TestJournaledCancelSurvivesACrash(t *testing.T) {
	st, path, _ := openBufferedSQLite(t)
	_, runID, _ := startStreaming(t, st)
	release := st.HoldWriterStalled()
	a := answered(t, requestCancelAsync(st, cancelOf(runID)), release, "the cancel, with the writer held,")
	if a.err != nil {
		release()
		t.Fatal(a.err)
	}
	st.CrashWhileHeld(release) // the writer never got to it
	if n := journalLines(t, path); n != 1 {
		t.Fatalf("the journal holds %d records after the crash, want 1", n)
	}
	// gateway check, before the restart, says what the journal holds.
	outside, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	audit, err := outside.Audit(ctx)
	outside.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(audit.Unchecked) != 1 || !strings.Contains(audit.Unchecked[0], "holds 1 cancels acknowledged") {
		t.Fatalf("the audit before the restart says %q, want the journaled cancel named", audit.Unchecked)
	}
	again := openExclusive(t, path, &feedTap{})
	defer again.Close()
	cancelRecorded(t, again, path, nil, a.ack)
	if n := journalLines(t, path); n != 0 {
		t.Fatalf("the journal holds %d records after the start recorded them, want 0", n)
	}
	if n := again.JournalMismatches(); n != 0 {
		t.Fatalf("%d journaled cancels recorded with another version than their ack", n)
	}
	checkClean(t, again)
}

// A second cancel of a run whose cancel is journaled and not yet recorded
// waits for the writer, which records the first one before it: it gets
// already_requested with the first one's version, and changes nothing.
func TestSecondCancelOfAJournaledOne(t *testing.T) {
	st, path, tap := openBufferedSQLite(t)
	defer st.Close()
	_, runID, _ := startStreaming(t, st)
	release := st.HoldWriterStalled()
	first := answered(t, requestCancelAsync(st, cancelOf(runID)), release, "the first cancel")
	if first.err != nil {
		release()
		t.Fatal(first.err)
	}
	p := cancelOf(runID)
	p.RequestedBy = "tab:other"
	second := requestCancelAsync(st, p)
	// The second cancel, and the journal's applier come to record the first.
	waitUntil(t, func() bool { return st.UrgentWrites() == 2 }, release, "the second cancel did not wait for the writer")
	release()
	a := answered(t, second, func() {}, "the second cancel")
	if a.err != nil {
		t.Fatal(a.err)
	}
	if !a.ack.AlreadyRequested || a.ack.AcceptedStateVersion != first.ack.AcceptedStateVersion {
		t.Fatalf("second ack %+v, want already_requested at version %d", a.ack, first.ack.AcceptedStateVersion)
	}
	cancelRecorded(t, st, path, tap, first.ack)
	checkClean(t, st)
}

// A cancel the journal must not take waits for the writer, as before the
// journal, and nothing is journaled: one that finds the writer busy but
// not stalled (held, with no commit in progress: the journal would cost
// it a sync of its own for a wait that short), and one of a run whose
// thread the transaction being committed touched (its commit may change
// what the database says).
func TestJournalLeavesToTheWriter(t *testing.T) {
	for _, tc := range []struct {
		name string
		hold func(st *store.Store, threadID string) (release func())
	}{
		{"writer busy, not stalled", func(st *store.Store, _ string) func() { return st.HoldWriter() }},
		{"its thread being committed", func(st *store.Store, threadID string) func() {
			return st.HoldWriterCommitting(threadID)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, path, tap := openBufferedSQLite(t)
			defer st.Close()
			th, runID, _ := startStreaming(t, st)
			release := tc.hold(st, th.ThreadID)
			answer := requestCancelAsync(st, cancelOf(runID))
			waitUntil(t, func() bool { return st.UrgentWrites() == 1 }, release, "the cancel did not wait for the writer")
			if n := journalLines(t, path); n != 0 {
				release()
				t.Fatalf("the journal holds %d records, want none", n)
			}
			release()
			a := answered(t, answer, func() {}, "the cancel")
			if a.err != nil {
				t.Fatal(a.err)
			}
			cancelRecorded(t, st, path, tap, a.ack)
		})
	}
}

// A worker's write that comes after a journaled cancel (its run's
// completion, a claim) finds the cancel recorded first: the run cannot
// complete after its cancel was acknowledged.
func TestJournaledCancelComesBeforeTheNextWrite(t *testing.T) {
	st, path, tap := openBufferedSQLite(t)
	defer st.Close()
	_, runID, _ := startStreaming(t, st)
	release := st.HoldWriterStalled()
	a := answered(t, requestCancelAsync(st, cancelOf(runID)), release, "the cancel")
	if a.err != nil {
		release()
		t.Fatal(a.err)
	}
	completed := make(chan error, 1)
	go func() { completed <- st.Complete(ctx, leaseW(runID)) }()
	release()
	select {
	case err := <-completed:
		if err == nil {
			t.Fatal("the run completed after its cancel was acknowledged")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the completion never answered")
	}
	cancelRecorded(t, st, path, tap, a.ack)
	run, err := st.Run(ctx, user, runID)
	if err != nil {
		t.Fatal(err)
	}
	if run.Status == chat.RunCompleted {
		t.Fatal("the run completed after its cancel was acknowledged")
	}
}

// A cancel of another user's run, or of a run that ended, gets from the
// journal's path the answer the writer gives, and nothing is journaled.
func TestJournalRefusesWhatTheWriterRefuses(t *testing.T) {
	st, path, _ := openBufferedSQLite(t)
	defer st.Close()
	_, runID, _ := startStreaming(t, st)
	_, doneID, _ := startStreaming(t, st)
	if err := st.Complete(ctx, leaseW(doneID)); err != nil {
		t.Fatal(err)
	}
	release := st.HoldWriterStalled()
	defer release()
	p := cancelOf(runID)
	p.UserID = "usr_someone_else"
	if a := answered(t, requestCancelAsync(st, p), release, "another user's cancel"); chat.ErrorCode(a.err) != chat.CodeNotFound {
		t.Fatalf("another user's cancel answered %+v %v, want not_found", a.ack, a.err)
	}
	if a := answered(t, requestCancelAsync(st, cancelOf(doneID)), release, "a completed run's cancel"); chat.ErrorCode(a.err) != chat.CodeRunNotActive {
		t.Fatalf("a completed run's cancel answered %+v %v, want run_not_active", a.ack, a.err)
	}
	if n := journalLines(t, path); n != 0 {
		t.Fatalf("the journal holds %d records, want none", n)
	}
}

// A burst of cancels while the writer is busy: the first is acknowledged
// from the journal, the others, sent while it waits to be recorded, go to
// the writer, which records them in few commits (through the journal each
// would wait for the transaction recording the others). Every one is
// recorded with its ack's values.
func TestJournalLeavesABurstOfCancelsToTheWriter(t *testing.T) {
	st, path, tap := openBufferedSQLite(t)
	defer st.Close()
	const n = 12
	var runs []string
	for range n {
		_, runID, _ := startStreaming(t, st)
		runs = append(runs, runID)
	}
	release := st.HoldWriterStalled()
	first := answered(t, requestCancelAsync(st, cancelOf(runs[0])), release, "the first cancel, with the writer held,")
	if first.err != nil {
		release()
		t.Fatal(first.err)
	}
	answers := make([]<-chan cancelAnswer, 0, n-1)
	for _, runID := range runs[1:] {
		answers = append(answers, requestCancelAsync(st, cancelOf(runID)))
	}
	// The n-1 cancels, and the journal's applier come to record the first.
	waitUntil(t, func() bool { return st.UrgentWrites() == n }, release, "the burst did not wait for the writer")
	if got := journalLines(t, path); got != 1 {
		release()
		t.Fatalf("the journal holds %d records, want 1", got)
	}
	release()
	acks := []chat.CancelAck{first.ack}
	for i := range answers {
		a := answered(t, answers[i], func() {}, "a cancel of the burst")
		if a.err != nil {
			t.Fatal(a.err)
		}
		acks = append(acks, a.ack)
	}
	for _, ack := range acks {
		cancelRecorded(t, st, path, tap, ack)
	}
	if m := st.JournalMismatches(); m != 0 {
		t.Fatalf("%d journaled cancels recorded with another version than their ack", m)
	}
	checkClean(t, st)
}

// A journal that cannot be read stops the start with a message that says
// what to do, and a torn last record (its sync never returned, so it was
// never acknowledged) is left out.
func TestJournalThatCannotBeRead(t *testing.T) {
	st, path, _ := openBufferedSQLite(t)
	_, runID, _ := startStreaming(t, st)
	st.Crash()
	torn := `{"run_id":"` + runID + `","thread_id":"thr_x"`
	if err := os.WriteFile(path+"-cancels", []byte(torn), 0o600); err != nil {
		t.Fatal(err)
	}
	again := openExclusive(t, path, &feedTap{})
	run, err := again.Run(ctx, user, runID)
	if err != nil || run.Status.CancelAccepted() {
		t.Fatalf("a torn record was recorded: %s %v", run.Status, err)
	}
	again.Crash()
	if err := os.WriteFile(path+"-cancels", []byte("not a cancel\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = store.Open(ctx, path, store.Options{Exclusive: true})
	if err == nil || !strings.Contains(err.Error(), "move it aside") {
		t.Fatalf("opening with a damaged journal: %v, want an error that says what to do", err)
	}
}
