package store_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// Several gateway instances sharing one PostgreSQL database. These tests
// run whenever GATEWAY_TEST_POSTGRES_URL is set (postgresDSN), whatever
// GATEWAY_TEST_STORE says.

// openInstances opens n stores on one database, as n instances would.
func openInstances(t *testing.T, dsn string, n int) []*store.Store {
	t.Helper()
	sts := make([]*store.Store, n)
	for i := range sts {
		st, err := store.Open(ctx, dsn, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		sts[i] = st
	}
	return sts
}

// Instances starting at once on a fresh database migrate it once: the
// others wait for the migration lock and find nothing left to do.
func TestInstancesStartingAtOnceMigrateOnce(t *testing.T) {
	dsn := postgresDSN(t)
	const n = 3
	sts := make([]*store.Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { sts[i], errs[i] = store.Open(ctx, dsn, store.Options{}) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("instance %d: %v", i, errs[i])
		}
		defer sts[i].Close()
		if !sts[i].Postgres() {
			t.Fatalf("instance %d is not on PostgreSQL", i)
		}
	}
	db := rawDB(t, dsn)
	var applied, distinct, latest int
	if err := db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT version_id), MAX(version_id) FROM goose_db_version WHERE version_id > 0`).
		Scan(&applied, &distinct, &latest); err != nil {
		t.Fatal(err)
	}
	// (Counted from the files: their numbers may skip one that another
	// branch takes.)
	files, err := filepath.Glob("migrations/postgres/*.sql")
	if err != nil || len(files) < 4 {
		t.Fatalf("migration files: %v, %v", files, err)
	}
	if applied != len(files) || distinct != len(files) || latest < len(files) {
		t.Fatalf("goose_db_version: %d rows, %d versions, latest %d; want each of the %d migrations once", applied, distinct, latest, len(files))
	}
	var locals int
	if err := db.QueryRow(`SELECT COUNT(*) FROM users WHERE user_id = ?`, chat.LocalUserID).Scan(&locals); err != nil || locals != 1 {
		t.Fatalf("the first migration's local user: %d rows, %v", locals, err)
	}
	for i, st := range sts {
		if _, err := st.CreateThread(ctx, user, fmt.Sprint("from ", i)); err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
	}
	mustCheck(t, sts[0], "at the end")
}

// Instances claiming at once take different runs (FOR UPDATE SKIP
// LOCKED): every queued run is claimed exactly once.
func TestInstancesClaimEachRunOnce(t *testing.T) {
	sts := openInstances(t, postgresDSN(t), 3)
	const runs = 30
	queued := map[string]bool{}
	for range runs {
		_, runID := newThreadWithRun(t, sts[0], "go")
		queued[runID] = true
	}
	claimed := make([][]string, len(sts))
	var total atomic.Int64
	var wg sync.WaitGroup
	for i, st := range sts {
		wg.Go(func() {
			owner := fmt.Sprintf("instance-%d", i)
			for range 2 * runs { // bounded: nothing is left long before
				r, err := st.Claim(ctx, owner, time.Hour)
				if err != nil {
					t.Errorf("%s: %v", owner, err)
					return
				}
				if r == nil {
					// Nothing claimable is left but what the other
					// instances are claiming right now: an instance never
					// queues behind another's candidate and comes back
					// empty-handed while runs wait.
					if n := total.Load(); n < runs-int64(len(sts)-1) {
						t.Errorf("%s found nothing to claim with %d of %d runs claimed", owner, n, runs)
					}
					return
				}
				claimed[i] = append(claimed[i], r.Run.RunID)
				total.Add(1)
			}
		})
	}
	wg.Wait()
	seen := map[string]int{}
	for i, ids := range claimed {
		for _, id := range ids {
			if !queued[id] {
				t.Errorf("instance %d claimed %s, which was never queued", i, id)
			}
			seen[id]++
			r, err := sts[i].Run(ctx, user, id)
			if err != nil || r.Status != chat.RunRunning {
				t.Errorf("run %s after the claim: %+v, %v", id, r, err)
			}
		}
	}
	for id := range queued {
		if seen[id] != 1 {
			t.Errorf("run %s claimed %d times", id, seen[id])
		}
	}
	t.Logf("claims per instance: %d, %d, %d", len(claimed[0]), len(claimed[1]), len(claimed[2]))
	mustCheck(t, sts[0], "at the end")
}

// Two instances writing the same thread at once take turns on its row:
// no write fails with "changed concurrently", and the thread's seqs stay
// one gap-free sequence holding exactly what each was acknowledged.
func TestInstancesWriteOneThreadWithoutConflicts(t *testing.T) {
	sts := openInstances(t, postgresDSN(t), 2)
	snap, runID := newThreadWithRun(t, sts[0], "go")
	if r, err := sts[1].Claim(ctx, "w", time.Hour); err != nil || r == nil {
		t.Fatalf("claim: %v, %v", r, err)
	}
	const batches = 40
	acked := make([]strings.Builder, len(sts))
	var wg sync.WaitGroup
	for i, st := range sts {
		wg.Go(func() {
			for b := range batches {
				parts := []string{fmt.Sprintf("<%d.%d ", i, b), "x>"}
				if err := st.AppendDeltas(ctx, leaseW(runID), fmt.Sprintf("msg_inst%d", i), parts); err != nil {
					t.Errorf("instance %d batch %d: %v", i, b, err)
					return
				}
				acked[i].WriteString(strings.Join(parts, ""))
				if b%10 == 0 {
					// A write of its own transaction, not grouped.
					if err := st.AddUsage(ctx, runID, chat.Usage{PromptTokens: 1}); err != nil {
						t.Errorf("instance %d usage: %v", i, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	rep, err := sts[0].ThreadEvents(ctx, snap.ThreadID, 0)
	if err != nil || !rep.Complete {
		t.Fatalf("replay: complete %v, %v", rep.Complete, err)
	}
	got := make([]strings.Builder, len(sts))
	for i, ev := range rep.Events {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
		if d, ok := ev.Body.(chat.MessageDeltaBody); ok {
			var inst int
			fmt.Sscanf(d.MessageID, "msg_inst%d", &inst)
			got[inst].WriteString(d.Text)
		}
	}
	for i := range sts {
		if got[i].String() != acked[i].String() {
			t.Errorf("instance %d: buffered %q, acknowledged %q", i, got[i].String(), acked[i].String())
		}
	}
	mustCheck(t, sts[0], "at the end")
}

// Two instances whose group commits lock the same two threads in opposite
// orders deadlock; PostgreSQL fails one transaction, which runs again, and
// neither caller sees the failure.
func TestInstancesRetryADeadlock(t *testing.T) {
	// Each instance's sessions have a name of their own, so that the wait
	// below sees each instance's own batch waiting (not two sessions of
	// one), whatever else (another package's tests) uses the database.
	app := strings.ToLower(chat.NewID("dl_"))
	base := postgresDSN(t)
	named := func(name string) string { return base + "&application_name=" + app + "_" + name }
	sts := []*store.Store{openInstances(t, named("0"), 1)[0], openInstances(t, named("1"), 1)[0]}
	runs, threads := startRuns(t, sts[0], 2)
	// A third connection holds both threads, so that each instance's batch
	// waits on its first thread until both are queued there.
	db := rawDB(t, named("holder"))
	holder, err := db.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if _, err := holder.Exec(`SELECT thread_id FROM threads WHERE thread_id IN ($1, $2) FOR UPDATE`, threads[0], threads[1]); err != nil {
		t.Fatal(err)
	}
	// Instance 0 batches run 0 then run 1; instance 1 run 1 then run 0.
	errs := make([][]error, 2)
	var wg sync.WaitGroup
	for i, st := range sts {
		errs[i] = make([]error, 2)
		release := st.HoldWriter()
		for k := range 2 {
			r := (i + k) % 2
			wg.Go(func() {
				errs[i][k] = st.AppendDeltas(ctx, leaseW(runs[r]), fmt.Sprintf("msg_dl%d_%d", i, r), []string{"x"})
			})
			waitUntil(t, func() bool { return st.QueuedWrites() >= k+1 }, release, fmt.Sprintf("instance %d: write %d never queued", i, k))
		}
		release()
	}
	// Both instances' batches wait for their first thread: each took its
	// two writes from its queue, and a session of each waits for a thread.
	// (Counting two waiting sessions of either instance was not enough: the
	// test failed with no deadlock at all, the writes done 27 ms after the
	// threads were freed, as when one instance's batch was not yet waiting.)
	waiting := func(instance string) bool {
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = ? AND wait_event_type = 'Lock' AND query LIKE '%FROM threads%FOR UPDATE%'`, app+"_"+instance).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n >= 1
	}
	waitUntil(t, func() bool {
		return sts[0].QueuedWrites() == 0 && sts[1].QueuedWrites() == 0 && waiting("0") && waiting("1")
	}, nil, "the instances never both waited for the held threads")
	if err := holder.Commit(); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	wg.Wait()
	finished := time.Since(freed)
	for i := range errs {
		for k, err := range errs[i] {
			if err != nil {
				t.Errorf("instance %d write %d: %v", i, k, err)
			}
		}
	}
	if n := sts[0].Retries() + sts[1].Retries(); n < 1 {
		t.Errorf("%d transactions ran again, want the deadlock's loser to (the writes finished %v after the "+
			"threads were freed)", n, finished)
	}
	for _, th := range threads {
		rep, err := sts[0].ThreadEvents(ctx, th, 0)
		if err != nil || !rep.Complete {
			t.Fatalf("replay of %s: complete %v, %v", th, rep.Complete, err)
		}
		deltas := 0
		for _, ev := range rep.Events {
			if ev.Type == chat.EventMessageDelta {
				deltas++
			}
		}
		if deltas != 2 {
			t.Errorf("thread %s holds %d deltas, want one from each instance", th, deltas)
		}
	}
	mustCheck(t, sts[0], "at the end")
}
