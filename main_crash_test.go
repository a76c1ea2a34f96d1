package main

// The crash-restart test against the real binary: a seeded random workload
// over HTTP on a few threads (runs with search, email, card and plain
// prompts, cancels, confirms and rejects, fragment saves of streamed
// messages, continues from the saved point, stale commands), and a SIGKILL
// at a random moment of every cycle. After the last cycle the database is
// restarted without a kill, recovery settles, and the test asserts that
// every acknowledged command's effect survived, that no idempotency key was
// accepted twice by the email provider, that every thread's event log
// replays with seqs +1 each (and never rewrites a seq a client already saw),
// that no run is left non-terminal, and that `gateway check` is clean after
// every kill and at the end.
//
// Defaults fit CI (12 cycles, well under a minute on 2 cores). The long
// variant:
//
//	go test -race -count=1 -run TestBinaryCrashRestartRandom -crash.cycles=200 -v .
//
// A failure prints its seed; replay it with -crash.seed=N (the workload's
// random choices are the same; the exact interleaving with the server is
// not, since it runs in another process).

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

func TestBinaryCrashRestartRandom(t *testing.T) {
	seed := *crashSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	cycles := *crashCycles
	t.Logf("crash-restart: seed %d, %d cycles (replay with -crash.seed=%d -crash.cycles=%d)", seed, cycles, seed, cycles)
	rng := rand.New(rand.NewSource(seed))
	defer func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: replay with -run TestBinaryCrashRestartRandom -crash.seed=%d -crash.cycles=%d", seed, seed, cycles)
		}
	}()

	db := filepath.Join(t.TempDir(), "gw.db")
	l := newCrashLedger()
	flags := []string{"-outbox-latency", "30ms", "-search-latency", "30ms"}
	pace := func() string { return fmt.Sprintf("%dms", 10+rng.Intn(11)) }

	// A few threads, each driven by two tabs that race each other (stale
	// versions, run_already_active, operation_not_pending).
	const nThreads, tabsPerThread = 3, 2
	var threads []string
	hists := map[string]*threadHistory{}
	kills := 0

	for cycle := range cycles {
		srv := startProcess(t, db, pace(), flags...)
		if cycle == 0 {
			for range nThreads {
				id := srv.CreateThread().ThreadID
				threads = append(threads, id)
				hists[id] = &threadHistory{sigs: map[int64]string{}}
			}
		}
		ctx, cancelWatch := context.WithCancel(context.Background())
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var watchers []*watcher
		api := crashAPI(t, srv.base)
		for _, tid := range threads {
			w, err := startWatcher(ctx, api, tid, hists[tid], l)
			if err != nil {
				cancelWatch()
				t.Fatalf("cycle %d: %v", cycle, err)
			}
			watchers = append(watchers, w)
			for range tabsPerThread {
				cw := &crashWorker{api: api, threadID: tid, r: rand.New(rand.NewSource(rng.Int63())), w: w, l: l, stop: stop}
				wg.Add(1)
				go func() {
					defer wg.Done()
					cw.run()
				}()
			}
		}
		// The one timer that is not a synchronisation: when to kill.
		delay := 150*time.Millisecond + time.Duration(rng.Int63n(int64(2500*time.Millisecond)))
		kill := time.NewTimer(delay)
		select {
		case <-kill.C:
		case <-srv.exited:
			l.violate("cycle %d: the gateway exited on its own (%v)", cycle, srv.waitErr)
		}
		close(stop)
		srv.Kill()
		kills++
		wg.Wait()
		cancelWatch()
		for _, w := range watchers {
			<-w.done
		}
		checkDB(t, db) // the invariants hold whenever the process dies
		if len(l.violations) > 0 {
			t.Fatalf("cycle %d (killed after %v): violations:\n%s", cycle, delay, strings.Join(l.violations, "\n"))
		}
	}

	// The last restart: no kill; recovery settles.
	srv := startProcess(t, db, pace(), flags...)
	api := crashAPI(t, srv.base)
	audit := auditDB(t, db)
	defer audit.Close()
	// Every acknowledged queue.add has its row; what still waits is removed
	// (so that no run starts after the runs are listed: an item that starts
	// meanwhile answers not_found, and its run is listed).
	removedAtEnd := 0
	for item, thread := range l.queued {
		state := queryValue[string](t, audit, `SELECT state FROM queue_items WHERE item_id = ?`, item)
		if state != "waiting" {
			continue
		}
		_, err := api.QueueRemove(context.Background(), client.QueueItemRequest{ThreadID: thread, ItemID: item})
		if e := apptest.Refusal(err); err != nil && (e == nil || e.Code != chat.CodeNotFound) {
			t.Fatalf("remove queue item %s at the end: %v", item, err)
		}
		removedAtEnd++
	}
	var allRuns []string
	rows, err := audit.Query(`SELECT run_id FROM runs ORDER BY created_at`)
	if err != nil {
		t.Fatalf("list runs: %v", err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		allRuns = append(allRuns, id)
	}
	rows.Close()
	for id := range l.runs {
		if !containsStr(allRuns, id) {
			l.violate("acknowledged run.start %s has no row", id)
		}
	}

	ctx := context.Background()
	status := map[string]chat.Run{}
	settle := func() {
		deadline := time.Now().Add(45 * time.Second)
		for _, id := range allRuns {
			for {
				r, err := api.Run(ctx, id)
				if err != nil {
					t.Fatalf("GET /api/runs/%s: %v", id, err)
				}
				status[id] = r
				if r.Status.Terminal() || r.Status == chat.RunWaitingConfirmation {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("run %s is still %s 45s after the restart", id, r.Status)
				}
				time.Sleep(25 * time.Millisecond) // bounded poll: recovery has no event to wait on over this API
			}
		}
	}
	settledWaiting := 0
	for round := 0; ; round++ {
		settle()
		var waiting []chat.Run
		for _, id := range allRuns {
			if r := status[id]; r.Status == chat.RunWaitingConfirmation {
				waiting = append(waiting, r)
			}
		}
		if len(waiting) == 0 {
			break
		}
		if round == 5 {
			t.Fatalf("runs still waiting for a confirmation after %d rounds of rejects/cancels: %+v", round, waiting)
		}
		for _, r := range waiting {
			settledWaiting++
			if rng.Intn(2) == 0 {
				if _, err := api.CancelRun(ctx, client.CancelRunRequest{RunID: r.RunID}); err != nil {
					t.Fatalf("cancel waiting run %s: %v", r.RunID, err)
				}
				l.mu.Lock()
				l.cancels[r.RunID] = "settle"
				l.mu.Unlock()
				continue
			}
			snap, _ := api.Thread(ctx, r.ThreadID)
			ops, _ := api.Operations(ctx, r.ThreadID)
			for _, op := range ops {
				if op.RunID == r.RunID && op.Phase == "prepared" {
					if _, err := api.RejectTool(ctx, op.OperationID, snap.StateVersion); err != nil {
						t.Fatalf("reject %s of waiting run %s: %v", op.OperationID, r.RunID, err)
					}
					l.mu.Lock()
					l.rejects[op.OperationID] = r.RunID
					l.mu.Unlock()
				}
			}
		}
	}

	// Every run terminal; every acknowledged command's effect present.
	completed, cancelled, failed := 0, 0, 0
	for _, id := range allRuns {
		switch r := status[id]; r.Status {
		case "completed":
			completed++
		case "cancelled":
			cancelled++
		case "failed":
			failed++
		default:
			l.violate("run %s left %s after recovery settled", id, r.Status)
		}
	}
	for id, ackStatus := range l.cancels {
		if r := status[id]; r.Status != "cancelled" {
			l.violate("run %s: cancel acknowledged (%s), but it ended %s", id, ackStatus, r.Status)
		}
	}
	queueStates := map[string]int{}
	for item := range l.queued {
		var state string
		var runID sql.NullString
		if err := audit.QueryRow(`SELECT state, run_id FROM queue_items WHERE item_id = ?`, item).Scan(&state, &runID); err != nil {
			l.violate("acknowledged queue.add %s: %v", item, err)
			continue
		}
		queueStates[state]++
		if state == "started" && !containsStr(allRuns, runID.String) {
			l.violate("queue item %s started run %q, which has no row", item, runID.String)
		}
	}
	for id, f := range l.fragments {
		var kind, content, thread string
		if err := audit.QueryRow(`SELECT kind, content, thread_id FROM messages WHERE message_id = ?`, id).Scan(&kind, &content, &thread); err != nil {
			l.violate("acknowledged fragment %s (of %s up to seq %d): %v", id, f.streamed, f.lastSeq, err)
			continue
		}
		if kind != "fragment" || thread != f.threadID {
			l.violate("acknowledged fragment %s is kind %s in thread %s", id, kind, thread)
		}
		if f.contentKnown && content != f.content {
			l.violate("fragment %s of %s up to seq %d holds %q, but the deltas this client displayed were %q", id, f.streamed, f.lastSeq, content, f.content)
		}
	}
	for verb, m := range map[string]map[string]string{"confirm": l.confirms, "reject": l.rejects} {
		for op := range m {
			phase := queryValue[string](t, audit, `SELECT phase FROM operations WHERE operation_id = ?`, op)
			if phase == "prepared" {
				l.violate("operation %s: %s acknowledged, but it is still prepared", op, verb)
			}
			if verb == "reject" && phase != "rejected" {
				l.violate("operation %s: reject acknowledged, but its phase is %s", op, phase)
			}
		}
	}

	// No duplicate external action.
	dups, err := audit.Query(`SELECT idempotency_key, COUNT(*) FROM outbox_attempts WHERE result = 'accepted' GROUP BY 1 HAVING COUNT(*) > 1`)
	if err != nil {
		t.Fatalf("outbox audit: %v", err)
	}
	for dups.Next() {
		var key string
		var n int
		if err := dups.Scan(&key, &n); err != nil {
			t.Fatal(err)
		}
		l.violate("the email provider accepted key %s %d times", key, n)
	}
	dups.Close()
	sent := queryValue[int](t, audit, `SELECT COUNT(*) FROM outbox_attempts WHERE result = 'accepted'`)
	retried := queryValue[int](t, audit, `SELECT COUNT(*) FROM runs WHERE attempt > 1`)
	opsByPhase := map[string]int{}
	prow, err := audit.Query(`SELECT phase, COUNT(*) FROM operations GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for prow.Next() {
		var ph string
		var n int
		if err := prow.Scan(&ph, &n); err != nil {
			t.Fatal(err)
		}
		opsByPhase[ph] = n
	}
	prow.Close()

	// Every thread replays from seq 0 with +1 seqs, renaming no seq a
	// client saw, one terminal event per run, one message.published per
	// message.
	for _, tid := range threads {
		replayThread(t, l, api, tid, hists[tid])
	}

	srv.Stop()
	checkDB(t, db)

	l.mu.Lock()
	defer l.mu.Unlock()
	var codes []string
	for c, n := range l.codes {
		codes = append(codes, fmt.Sprintf("%s=%d", c, n))
	}
	sort.Strings(codes)
	t.Logf("refusals (command:status:code): %s", strings.Join(codes, " "))
	t.Logf("operations by phase: %v; emails accepted by the provider: %d", opsByPhase, sent)
	t.Logf("queue: acked commands %v; acked items by state %v (%d removed at the end)", l.queueOps, queueStates, removedAtEnd)
	t.Logf("crash-restart summary: seed=%d cycles=%d kills=%d threads=%d tabs=%d runs=%d (acked run.start %d, continues %d; completed %d cancelled %d failed %d; re-run after a kill %d) cancels=%d confirms=%d rejects=%d fragments=%d stale409=%d settled_waiting=%d violations=%d",
		seed, cycles, kills, len(threads), len(threads)*tabsPerThread, len(allRuns), len(l.runs), l.continues, completed, cancelled, failed, retried,
		len(l.cancels), len(l.confirms), len(l.rejects), len(l.fragments), l.stale, settledWaiting, len(l.violations))
	if len(l.violations) > 0 {
		t.Errorf("%d violations:\n%s", len(l.violations), strings.Join(l.violations, "\n"))
	}
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// replayThread reads the thread's event stream from seq 0 up to its last
// seq and checks it.
func replayThread(t *testing.T, l *crashLedger, api *client.Client, threadID string, hist *threadHistory) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	snap, err := api.Thread(ctx, threadID)
	if err != nil {
		t.Fatalf("GET thread %s: %v", threadID, err)
	}
	es, err := api.Events(ctx, threadID, 0)
	if err != nil {
		t.Fatalf("replay %s: %v", threadID, err)
	}
	defer es.Close()
	where := "replay " + threadID
	cancelled := map[string]bool{}
	prev := int64(-1)
	terminal := map[string]int{}
	published := map[string]int{}
	for prev < snap.LastSeq {
		ev, err := es.Next(ctx)
		if err != nil {
			break
		}
		checkEvent(l, hist, cancelled, where, prev, ev)
		prev = ev.Seq
		switch ev.Type {
		case chat.EventRunCompleted, chat.EventRunFailed, chat.EventRunCancelled:
			terminal[ev.RunID]++
		case chat.EventMessagePublished:
			published[ev.Published().Message.MessageID]++
		}
	}
	checkStream(l, where, es.Stats())
	if prev != snap.LastSeq {
		l.violate("replay %s ended at seq %d, the thread's last_seq is %d", threadID, prev, snap.LastSeq)
	}
	for run, n := range terminal {
		if n != 1 {
			l.violate("replay %s: run %s has %d terminal events", threadID, run, n)
		}
	}
	for msg, n := range published {
		if n != 1 {
			l.violate("replay %s: message %s published %d times", threadID, msg, n)
		}
	}
}
