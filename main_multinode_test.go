package main

// The scale-out test: three gateway processes on one PostgreSQL and one
// NATS, tabs (WebSocket connections of the protocol client, package
// client) spread over them, a seeded random workload of runs, cancels,
// confirms and rejects sent through the client to random instances,
// tabs dropping and reconnecting with after_seq, one instance killed
// (SIGKILL) and started again, and NATS itself restarted mid-way. Then it
// checks what scale-out promises: every tab of a thread saw the same
// events in the same order, byte for byte, with no gap and no duplicate,
// up to the thread's last seq; no acknowledged command was lost; no email
// was accepted twice by the provider; no run is left unfinished; and
// `gateway check` is clean.
//
// It needs GATEWAY_TEST_POSTGRES_URL (a database it may create schemas in)
// and the nats-server binary (it starts and restarts its own server, so
// GATEWAY_TEST_NATS_URL's shared one stays untouched). Without the URL it
// skips, saying what to set; `.ci/run` sets it and installs nats-server.
//
//	GATEWAY_TEST_POSTGRES_URL='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' \
//	  go test -race -count=1 -run TestMultiNode -v .
//
// A failure prints its seed; -multinode.seed=N replays the workload's
// choices (not the exact interleaving of four processes).

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
	"github.com/honestcancel/gateway/internal/natstest"
	"github.com/honestcancel/gateway/internal/pgtest"
)

func TestMultiNode(t *testing.T) {
	dsn := pgtest.Schema(t)
	seed := *multiSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (replay with -multinode.seed=%d)", seed, seed)
	rng := rand.New(rand.NewSource(seed))

	c := &cluster{t: t, dsn: dsn, nats: natstest.Start(t), nodes: make([]*server, 3),
		flags: []string{"-lease-ttl", "1500ms", "-outbox-latency", "150ms", "-search-latency", "200ms"}}
	// Concurrent starts on an empty database: the migrations run once.
	c.startAll()

	const threads, tabsPerThread = 6, 3
	var ids []string
	for range threads {
		_, api := c.pick(rng)
		snap, err := api.CreateThread(context.Background(), "")
		if err != nil {
			t.Fatalf("create thread: %v", err)
		}
		ids = append(ids, snap.ThreadID)
	}

	ctx, stopTabs := context.WithCancel(context.Background())
	defer stopTabs()
	var tabs []*tab
	var tabsDone sync.WaitGroup
	for _, id := range ids {
		for k := range tabsPerThread {
			tb := &tab{name: fmt.Sprintf("%s/tab%d", id, k), threadID: id, c: c, rng: rand.New(rand.NewSource(rng.Int63()))}
			tabs = append(tabs, tb)
			tabsDone.Go(func() { tb.run(ctx) })
		}
	}

	prompts := []string{
		"send an email to anna@example.com about the order",
		"send an email to bob@example.com about the invoice",
		"search the catalog for a hiking backpack",
		"Explain goroutines and channels and how cancellation travels through them",
		"Describe durable checkpoints, leases and recovery after crashes",
		"short: say hello",
	}
	l := &ledger{runs: map[string]string{}, cancelled: map[string]bool{}, cancelAt: map[string]time.Time{},
		confirmed: map[string]bool{}, opThread: map[string]string{}, refusals: map[string]int{}, queued: map[string]string{}}
	wctx, stopWork := context.WithTimeout(context.Background(), *multiDuration)
	defer stopWork()
	var workers sync.WaitGroup
	for _, id := range ids {
		wr := rand.New(rand.NewSource(rng.Int63()))
		workers.Go(func() { l.work(wctx, c, wr, id, prompts) })
	}

	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatalf("open the test schema: %v", err)
	}
	defer db.Close()

	// Chaos, on the main goroutine: reconnecting tabs all along; the
	// instance holding the most leases killed at a third, NATS restarted
	// at half, the killed instance back at two thirds.
	victim, victimRuns := 0, []string(nil)
	d := *multiDuration
	chaosStart := time.Now()
	events := []struct {
		at time.Duration
		do func()
	}{
		{d / 3, func() {
			victim, victimRuns = c.busiest(db)
			t.Logf("killing instance %d, which holds %d run leases", victim, len(victimRuns))
			c.killNode(victim)
		}},
		{d / 2, func() {
			t.Log("restarting NATS")
			c.nats.Stop()
			pause(context.Background(), 300*time.Millisecond) // NATS is down for a moment, not just restarted
			c.nats.Start()
		}},
		{2 * d / 3, func() { t.Logf("starting instance %d again", victim); c.startNode(victim) }},
	}
	for _, ev := range events {
		for time.Since(chaosStart) < ev.at {
			pause(wctx, time.Duration(150+rng.Intn(250))*time.Millisecond)
			tabs[rng.Intn(len(tabs))].drop()
		}
		ev.do()
	}
	workers.Wait()

	// Every run comes to rest: runs of the killed instance are taken over
	// when its leases expire; a run the workload left waiting for a
	// confirmation is cancelled (nobody would ever decide it).
	lastSeqs := c.settle(t, l, rng, ids, "the workload stopped")
	// Every tab catches up with its thread's last seq (through NATS or, for
	// what NATS lost, through the bus's recovery from the event log).
	catchUp(t, tabs, lastSeqs)
	stopTabs()
	tabsDone.Wait()

	reconnects := 0
	for _, tb := range tabs {
		reconnects += tb.reconnects
	}
	gaps := tabsAgree(t, db, tabs)

	// No acknowledged command lost.
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.errs {
		t.Error(e)
	}
	_, api := c.pick(rng)
	statuses := map[chat.RunStatus]int{}
	var latencies []time.Duration
	for runID := range l.runs {
		run, err := api.Run(context.Background(), runID)
		if err != nil {
			t.Errorf("acked run %s: GET answered %v", runID, err)
			continue
		}
		statuses[run.Status]++
		switch {
		case l.cancelled[runID] && run.Status != "cancelled":
			t.Errorf("run %s: its cancel was accepted but it ended %s", runID, run.Status)
		case run.Status != "completed" && run.Status != "cancelled":
			t.Errorf("run %s ended %s (error %v), want completed or cancelled", runID, run.Status, run.Error)
		}
	}
	// Cancel → run.cancelled as the tabs saw it, across instances (one tab
	// per thread).
	measured := map[string]bool{}
	for _, tb := range tabs {
		if measured[tb.threadID] {
			continue
		}
		measured[tb.threadID] = true
		for _, ev := range tb.events {
			if ev.typ != chat.EventRunCancelled {
				continue
			}
			if at, ok := l.cancelAt[ev.runID]; ok {
				latencies = append(latencies, time.UnixMilli(ev.ts).Sub(at))
			}
		}
	}
	// Every acked queue.add is an item of its thread: sent once (a run
	// names it), or waiting (paused), whichever instance took it.
	queueStates := map[string]int{}
	for item, thread := range l.queued {
		var state, itemThread string
		var runs int
		if err := db.QueryRow(`SELECT state, thread_id, (SELECT COUNT(*) FROM runs WHERE queue_item_id = $1)
			FROM queue_items WHERE item_id = $1`, item).Scan(&state, &itemThread, &runs); err != nil {
			t.Errorf("acked queue item %s: %v", item, err)
			continue
		}
		queueStates[state]++
		if itemThread != thread || (state == "started") != (runs == 1) || state == "removed" {
			t.Errorf("acked queue item %s of %s: %s in %s, %d runs name it", item, thread, state, itemThread, runs)
		}
	}
	phases := map[string]string{}
	for _, id := range ids {
		ops, err := api.Operations(context.Background(), id)
		if err != nil {
			t.Fatalf("operations of %s: %v", id, err)
		}
		for _, op := range ops {
			phases[op.OperationID] = op.Phase
		}
	}
	for opID, confirm := range l.confirmed {
		phase, ok := phases[opID]
		switch {
		case !ok:
			t.Errorf("operation %s (thread %s): a decision was acked, the operation is gone", opID, l.opThread[opID])
		case !confirm && phase != "rejected":
			t.Errorf("operation %s: reject acked, phase %s", opID, phase)
		case confirm && slices.Contains([]string{"prepared", "rejected"}, phase):
			t.Errorf("operation %s: confirm acked, phase %s", opID, phase)
		}
	}

	// No email accepted twice, whichever instance sent it.
	var dups, accepted int
	if err := db.QueryRow(`SELECT COUNT(*) FROM (SELECT idempotency_key FROM outbox_attempts WHERE result = 'accepted' GROUP BY 1 HAVING COUNT(*) > 1) d`).Scan(&dups); err != nil {
		t.Fatalf("read the outbox: %v", err)
	}
	if err := db.QueryRow(`SELECT COUNT(*) FROM outbox`).Scan(&accepted); err != nil {
		t.Fatalf("read the outbox: %v", err)
	}
	if dups != 0 {
		t.Errorf("%d idempotency keys were accepted more than once by the email provider", dups)
	}

	// What the buses did: NATS lost messages when it restarted, and the
	// instances interleaved commits on the same threads; every gap was
	// filled from the event log, and none skipped but the seqs the log
	// records lost (a killed lease holder's reservation).
	var recordedLost int64
	for _, gs := range gaps {
		for _, g := range gs {
			recordedLost += g[1] - g[0] + 1
		}
	}
	var recoveries, recovered, yields, writtenPast, deltasLost float64
	for i := range c.nodes {
		c.mu.Lock()
		s := c.nodes[i]
		c.mu.Unlock()
		m := apptest.Scrape(t, s.base+"/metrics")
		// (A bus that skips a recorded gap may skip a few events after it
		// too, which the log does hold: the log's read stops at the gap.
		// Its sinks resync either way.)
		if skipped := m.Get(t, "gateway_bus_skipped_events_total"); skipped > 0 && recordedLost == 0 {
			t.Errorf("instance %d: its bus delivered past %g seqs it could not fill, and the log records none lost", i, skipped)
		} else if skipped > 0 {
			t.Logf("instance %d: its bus delivered past %g seqs; the log records %d lost", i, skipped, recordedLost)
		}
		recoveries += m.Get(t, "gateway_bus_recoveries_total")
		recovered += m.Get(t, "gateway_bus_recovered_events_total")
		yields += m.Get(t, "gateway_stream_yields_total")
		writtenPast += m.Get(t, "gateway_stream_written_past_total")
		deltasLost += m.Get(t, "gateway_stream_deltas_lost_total")
	}
	t.Logf("threads handed between instances %g times; reservations written past %g (gaps recorded %d, %d seqs); deltas dropped as lost by live instances %g",
		yields, writtenPast, len(gaps), recordedLost, deltasLost)

	// Stop gracefully and check the database.
	for i := range c.nodes {
		c.mu.Lock()
		s := c.nodes[i]
		c.mu.Unlock()
		s.Stop()
	}
	code, out, errOut := runCLI(t, nil, "check", "-db", dsn)
	if code != 0 || !strings.HasPrefix(out, "ok") {
		t.Errorf("gateway check: exit %d\n%s\n%s", code, out, errOut)
	}

	// The runs the killed instance held were finished by another process
	// (their leases expired and were taken over).
	takenOver := 0
	for _, runID := range victimRuns {
		var status string
		var attempt int
		if err := db.QueryRow(`SELECT status, attempt FROM runs WHERE run_id = $1`, runID).Scan(&status, &attempt); err != nil {
			t.Fatalf("read run %s: %v", runID, err)
		}
		switch status {
		case "completed", "cancelled", "failed":
			takenOver++
		default:
			t.Errorf("run %s, held by the killed instance, is still %s", runID, status)
		}
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	p := func(q float64) time.Duration {
		if len(latencies) == 0 {
			return 0
		}
		return latencies[min(len(latencies)-1, int(q*float64(len(latencies))))]
	}
	var seqs int64
	for _, s := range lastSeqs {
		seqs += s
	}
	t.Logf("queue: %d messages queued (by state %v), %d resumes", len(l.queued), queueStates, l.resumes)
	t.Logf("%d threads, %d tabs (%d reconnects), %d runs %v (%d held by the killed instance, all finished elsewhere), %d cancels accepted, %d decisions, %d emails accepted, %d events per tab on average; %g gap recoveries by the buses (%g events from the log); "+
		"cancel → run.cancelled (ts, ms resolution) p50 %v p99 %v over %d; expected refusals %v",
		len(ids), len(tabs), reconnects, len(l.runs), statuses, takenOver, len(l.cancelled), len(l.confirmed), accepted,
		seqs/int64(len(ids)), recoveries, recovered, p(0.5), p(0.99), len(latencies), l.refusals)
	if len(l.runs) < 2*threads || len(l.cancelled) == 0 {
		t.Errorf("the workload did too little to prove anything: %d runs, %d cancels", len(l.runs), len(l.cancelled))
	}
}

// catchUp waits, at most 20 s, until every tab has its thread's last seq
// (lastSeqs, by thread).
func catchUp(t *testing.T, tabs []*tab, lastSeqs map[string]int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, tb := range tabs {
		for tb.last() < lastSeqs[tb.threadID] {
			if time.Now().After(deadline) {
				t.Errorf("%s stopped at seq %d, the thread's last seq is %d", tb.name, tb.last(), lastSeqs[tb.threadID])
				break
			}
			pause(context.Background(), 20*time.Millisecond)
		}
	}
}

// tabsAgree checks what the tabs saw against each other and the log: no
// violation a tab noted while reading; every seq two tabs of a thread
// both hold is the same event, byte for byte; a tab resynced only where
// the log records a gap ahead of what it had, or to a snapshot behind
// it. It returns the recorded gaps by thread.
func tabsAgree(t *testing.T, db *sql.DB, tabs []*tab) map[string][][2]int64 {
	t.Helper()
	for _, tb := range tabs {
		for _, v := range tb.violations {
			t.Error(v)
		}
	}
	byThread := map[string][]*tab{}
	for _, tb := range tabs {
		byThread[tb.threadID] = append(byThread[tb.threadID], tb)
	}
	for id, th := range byThread {
		seen := map[int64]tabEvent{}
		seenBy := map[int64]string{}
		for _, tb := range th {
			for _, ev := range tb.events {
				if prev, ok := seen[ev.seq]; !ok {
					seen[ev.seq], seenBy[ev.seq] = ev, tb.name
				} else if prev.raw != ev.raw {
					t.Errorf("thread %s seq %d: %s saw %s, %s saw %s", id, ev.seq, seenBy[ev.seq], prev.raw, tb.name, ev.raw)
					break
				}
			}
		}
	}
	gaps := map[string][][2]int64{}
	rows, err := db.Query(`SELECT thread_id, first_seq, last_seq FROM stream_gaps`)
	if err != nil {
		t.Fatalf("read stream_gaps: %v", err)
	}
	for rows.Next() {
		var id string
		var g [2]int64
		if err := rows.Scan(&id, &g[0], &g[1]); err != nil {
			t.Fatal(err)
		}
		gaps[id] = append(gaps[id], g)
	}
	rows.Close()
	resyncs := 0
	for _, tb := range tabs {
		for _, r := range tb.resyncs {
			resyncs++
			// A snapshot behind the tab is the instance it reconnected to
			// not having the holder's unwritten deltas yet (neither in its
			// log nor in its bus's recent events): the tab starts over from
			// there, and the seqs it sees again are compared above. The
			// not-recovered ack before such a snapshot is judged by it.
			behind := r.to == -1 || (r.to > 0 && r.to < r.after)
			explained := behind || slices.ContainsFunc(gaps[tb.threadID], func(g [2]int64) bool {
				// (A snapshot may be behind the tab: it had seen deltas
				// of the gap, which the instance it reconnected to never
				// delivered.)
				return g[1] > r.after && (r.to <= 0 || g[0] <= max(r.to, r.after)+1)
			})
			if !explained {
				t.Errorf("%s: %s after seq %d (resumed at %d), and the log records no gap there (gaps %v)", tb.name, r.how, r.after, r.to, gaps[tb.threadID])
			}
		}
	}
	t.Logf("%d tab resyncs, each at a recorded gap or to a snapshot behind the tab; gaps recorded: %v", resyncs, gaps)
	return gaps
}

// TestSnapshotWhileAnotherInstanceStreams opens a thread (a subscription
// from a snapshot, as a new tab does) on an instance where another tab
// already follows it, while another instance streams a reply into it. The
// streaming instance fans each delta out at once and writes it up to 50 ms
// later, so the instance answering the new tab has often delivered deltas
// past the snapshot it reads from the database. They must follow the snapshot: the stream goes on with the
// next seq and is never ended as having missed events (before, it was,
// and the tab had to reconnect).
func TestSnapshotWhileAnotherInstanceStreams(t *testing.T) {
	dsn := pgtest.Schema(t)
	c := &cluster{t: t, dsn: dsn, nats: natstest.Start(t), nodes: make([]*server, 2), pace: "30ms"}
	c.startAll()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatalf("open the test schema: %v", err)
	}
	defer db.Close()
	snap, err := c.apiOf(0).CreateThread(context.Background(), "")
	if err != nil {
		t.Fatalf("create thread: %v", err)
	}
	tid := snap.ThreadID
	// A tab already open on each instance: the bus keeps following the
	// thread there (with no subscriber it would read its baseline from the
	// database for each new one, and nothing would be ahead of it).
	for i := range c.nodes {
		conn, err := c.node(i).API().Connect(context.Background(), client.ConnOptions{})
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer conn.Close()
		if _, err := conn.Subscribe(context.Background(), tid, client.FromSnapshot); err != nil {
			t.Fatalf("subscribe: %v", err)
		}
	}

	const want = 12 // snapshots taken while the other instance streams
	taken, ahead := 0, 0
	for runs := 0; runs < 6 && taken < want; runs++ {
		th, err := c.apiOf(0).Thread(context.Background(), tid)
		if err != nil {
			t.Fatalf("read the thread: %v", err)
		}
		ack, err := c.apiOf(0).StartRun(context.Background(), client.StartRunRequest{ThreadID: tid, ExpectedStateVersion: th.StateVersion,
			UserMessage: "Explain goroutines, channels, leases and fencing tokens and how cancellation travels through them"})
		if err != nil {
			t.Fatalf("start a run: %v", err)
		}
		// The instance executing it: the other one answers the tab.
		var owner string
		for deadline := time.Now().Add(10 * time.Second); owner == ""; {
			if err := db.QueryRow(`SELECT COALESCE(lease_owner, '') FROM runs WHERE run_id = $1`, ack.RunID).Scan(&owner); err != nil {
				t.Fatalf("read the run's lease: %v", err)
			}
			if owner == "" {
				if time.Now().After(deadline) {
					t.Fatalf("no instance claimed run %s within 10s", ack.RunID)
				}
				pause(context.Background(), 5*time.Millisecond)
			}
		}
		other := 1
		if strings.HasPrefix(owner, "gw1.") {
			other = 0
		}
		for taken < want {
			done, past := snapshotThenDeltas(t, c.node(other).API(), tid)
			if done {
				break
			}
			taken++
			if past {
				ahead++
			}
		}
		waitIdle(t, c.apiOf(0), tid)
	}
	if taken < want {
		t.Fatalf("only %d snapshots were taken while another instance streamed, want %d: the replies are too short for this test", taken, want)
	}
	t.Logf("%d snapshots taken while another instance streamed; %d of them followed by deltas this instance had delivered before the tab came (the case that closed the stream before)", taken, ahead)
}

// snapshotThenDeltas subscribes to the thread from a snapshot on a new
// WebSocket connection, as a page does, and reads up to ten events after
// it, which must follow it seq by seq on that one connection. done: the
// snapshot shows no run streaming. past: the first delta after it is part
// of the subscribe's catch-up (delivered on this instance before the
// subscriber was added).
func snapshotThenDeltas(t *testing.T, api *client.Client, threadID string) (done, past bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := api.Connect(ctx, client.ConnOptions{})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close()
	sub, err := conn.Subscribe(ctx, threadID, client.FromSnapshot)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	first, err := sub.Next(ctx)
	if err != nil || first.Type != chat.EventThreadSnapshot {
		t.Fatalf("the subscription did not start with a snapshot: %v %v", first, err)
	}
	a := first.Snapshot().ActiveRun
	if a == nil || a.Status != chat.RunRunning {
		return true, false
	}
	seq := first.Seq
	for range 10 {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		ev, err := sub.Next(rctx)
		rcancel()
		if err != nil {
			break // the run ended
		}
		if ev.Seq != seq+1 {
			t.Errorf("after the snapshot at seq %d: event %v, want seq %d", first.Seq, ev, seq+1)
		}
		if seq == first.Seq && ev.Replayed {
			past = true
		}
		seq = ev.Seq
		if ev.Type == chat.EventRunCompleted {
			break
		}
	}
	if st := conn.Stats(); st.Connects != 1 || st.Jumps+st.Duplicates+st.Resyncs > 0 {
		t.Errorf("the subscription from the snapshot at seq %d did not go on on its one connection (%d connections, %d gaps, %d duplicates, %d resyncs): the server closed it as having missed events; last anomaly: %s",
			first.Seq, st.Connects, st.Jumps, st.Duplicates, st.Resyncs, st.LastAnomaly)
		return false, false // (a resubscribe's catch-up is Replayed too)
	}
	return false, past
}

// waitIdle waits, at most 30 s, until the thread has no active run.
func waitIdle(t *testing.T, api *client.Client, threadID string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		th, err := api.Thread(context.Background(), threadID)
		if err == nil && th.ActiveRun == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %s still has an active run after 30s: %v", threadID, err)
		}
		pause(context.Background(), 50*time.Millisecond)
	}
}
