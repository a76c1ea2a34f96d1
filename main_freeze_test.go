package main

// The frozen-instance test: three gateway processes on one PostgreSQL and
// one NATS; runs started through instance 0, which claims them; instance 0
// stopped with SIGSTOP while its runs stream and while some wait in a slow
// catalog_search, long enough for its leases to run out; the other two,
// with too few workers to run everything at once, take the runs over; then
// instance 0 is let go on (SIGCONT) while its stalled executions still
// believe they hold their runs, and it claims some of the runs again
// itself. Cancels are sent from tabs on every instance along the way,
// some to the frozen one. Then it requires what fencing promises: every
// step published once whichever execution produced it (counted directly in
// the database, and by `gateway check`), no delta or publish from an
// execution after its run was taken, every run ended, every accepted
// cancel honoured, every tab of a thread holding the same events byte for
// byte, seq 1..last with no gap, and no email accepted twice.
//
// It needs GATEWAY_TEST_POSTGRES_URL and the nats-server binary (like
// TestMultiNode, it runs a NATS server of its own):
//
//	GATEWAY_TEST_POSTGRES_URL='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' \
//	  go test -count=1 -run TestFrozenInstance -v . -stop.seeds=20
//
// Each round runs on a fresh schema with fresh processes; a failure names
// its seed, and -stop.seed=N replays its choices (not the interleaving of
// four processes).

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"net/url"
	"os"
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

var (
	stopSeed  = flag.Int64("stop.seed", 0, "TestFrozenInstance: seed of the first round (0: from the clock)")
	stopSeeds = flag.Int("stop.seeds", 1, "TestFrozenInstance: rounds, one after the other, with seeds seed, seed+1, …")
	stopIdle  = flag.Duration("stop.idle-in-tx", 700*time.Millisecond, "TestFrozenInstance: the instances' idle_in_transaction_session_timeout (0: the gateway's default, 5s)")
)

// What the log of the instance that was frozen says when one of its
// stalled executions is refused (engine/run.go).
const fencedLine = "run taken from this execution; it stops without publishing"

type freezeFigures struct {
	runs      int // runs started
	held      int // runs instance 0 held when it froze
	inTool    int // … of which waited in catalog_search
	streaming int // … of which streamed a reply
	takenOver int // held runs another instance took while instance 0 was frozen
	reclaimed int // taken runs instance 0 claimed again itself after the thaw
	cancels   int // cancels accepted
	decisions int // emails confirmed or rejected
	emails    int // emails the provider accepted
	fenced    int // stalled executions refused (instance 0's log)
	recovered int // "recovered run" lines of the other instances
	frozen    time.Duration
	took      time.Duration
}

func TestFrozenInstance(t *testing.T) {
	if os.Getenv(pgtest.URLVar) == "" {
		t.Skip("this test needs PostgreSQL and nats-server: set " + pgtest.URLVar +
			"='postgres://USER@HOST:5432/DB?sslmode=disable' (a database it may create schemas in) and install nats-server")
	}
	seed := *stopSeed
	if seed == 0 {
		seed = time.Now().UnixNano() % 1_000_000_000
	}
	var sum freezeFigures
	rounds := 0
	var slowest time.Duration
	for i := range max(*stopSeeds, 1) {
		s := seed + int64(i)
		var f freezeFigures
		ok := t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) { f = freezeRound(t, s) })
		if !ok {
			t.Fatalf("seed %d failed (replay with -stop.seed=%d); %d rounds passed before it", s, s, rounds)
		}
		rounds++
		sum.runs += f.runs
		sum.held += f.held
		sum.inTool += f.inTool
		sum.streaming += f.streaming
		sum.takenOver += f.takenOver
		sum.reclaimed += f.reclaimed
		sum.cancels += f.cancels
		sum.decisions += f.decisions
		sum.emails += f.emails
		sum.fenced += f.fenced
		sum.recovered += f.recovered
		sum.frozen += f.frozen
		sum.took += f.took
		slowest = max(slowest, f.took)
	}
	t.Logf("%d rounds from seed %d: %d runs, %d held by the frozen instance (%d in catalog_search, %d streaming), %d taken over while it was frozen, %d of them claimed again by it after the thaw, %d cancels accepted, %d decisions, %d emails sent, %d stalled executions refused, %d recoveries logged by the others; frozen %v on average, %v per round on average, slowest %v",
		rounds, seed, sum.runs, sum.held, sum.inTool, sum.streaming, sum.takenOver, sum.reclaimed, sum.cancels, sum.decisions, sum.emails, sum.fenced, sum.recovered,
		(sum.frozen / time.Duration(rounds)).Round(time.Millisecond), (sum.took / time.Duration(rounds)).Round(time.Millisecond), slowest.Round(time.Millisecond))
}

// heldRun is a run instance 0 held at the moment it froze.
type heldRun struct {
	runID, threadID string
	owner           string
	epoch           int64
	inTool          string // the catalog_search operation it waited on ("" : none)
	streamed        string // the message it was streaming, not published ("" : none)
}

// sent is a cancel a tab sent; its answer is read at the end.
type sent struct {
	tb    *tab
	runID string
	base  string // the instance the tab was connected to
	when  string // for the log
	done  chan struct{}
	ack   chat.CancelAck // once done: the answer,
	err   error          // or the error answering it (*client.Error), or why none came
}

func freezeRound(t *testing.T, seed int64) freezeFigures {
	began := time.Now()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d (replay with -stop.seed=%d)", seed, seed)
	const victim = 0
	schema := pgtest.Schema(t)
	// An instance frozen in the middle of a transaction keeps its row
	// locks until PostgreSQL ends its session (the gateway's default: after
	// 20 s idle in the transaction); until then nobody can take the runs of
	// the threads it locked, and the others' writes to those threads wait
	// (holding up each one's single writer connection). As an operator
	// would with leases this short, the instances get a limit below the
	// lease TTL.
	dsn := schema
	if *stopIdle > 0 {
		u, err := url.Parse(schema)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("idle_in_transaction_session_timeout", fmt.Sprint(stopIdle.Milliseconds()))
		u.RawQuery = q.Encode()
		dsn = u.String()
	}
	c := &cluster{t: t, dsn: dsn, nats: natstest.Start(t), nodes: make([]*server, 3), pace: "50ms",
		flags: []string{"-lease-ttl", "1500ms", "-search-latency", "4s", "-outbox-latency", "300ms"},
		// The instances that take over run one and two runs at a time:
		// most of the frozen instance's runs wait in the queue, and it
		// claims them again itself when it thaws.
		extra: [][]string{nil, {"-workers", "1"}, {"-workers", "2"}}}
	c.startAll()
	gw0, api0 := c.node(victim), c.apiOf(victim)
	db, err := sql.Open("pgx", schema)
	if err != nil {
		t.Fatalf("open the test schema: %v", err)
	}
	defer db.Close()

	// Twelve conversations: long replies, searches that wait in the slow
	// tool, emails that wait for a decision.
	prompts := []string{
		"Explain goroutines and channels and how cancellation travels through them",
		"Describe durable checkpoints, leases and recovery after crashes",
		"Explain fencing tokens, lease epochs and stalled processes in distributed systems",
		"Describe how a load balancer spreads websocket connections over several instances",
		"Explain write ahead logging, group commit and fsync in databases",
		"Describe event sourcing, sequence numbers and replay after reconnects",
		"Explain idempotency keys and why a payment must never be sent twice",
		"search the catalog for a hiking backpack",
		"search the catalog for a waterproof tent",
		"find trail running shoes in the catalog",
		"send an email to anna@example.com about the order",
		"send an email to bob@example.com about the invoice",
	}
	rng.Shuffle(len(prompts), func(i, j int) { prompts[i], prompts[j] = prompts[j], prompts[i] })
	kind := func(prompt string) string {
		switch {
		case strings.Contains(prompt, "email"):
			return "email"
		case strings.Contains(prompt, "catalog"):
			return "search"
		}
		return "text"
	}

	var ids []string
	ctx0 := context.Background()
	for range prompts {
		snap, err := api0.CreateThread(ctx0, "")
		if err != nil {
			t.Fatalf("create thread: %v", err)
		}
		ids = append(ids, snap.ThreadID)
	}

	// Three tabs per conversation, one on each instance; a tab whose
	// connection ends reconnects to an instance that is up, with after_seq.
	ctx, stopTabs := context.WithCancel(context.Background())
	defer stopTabs()
	byThread := map[string][]*tab{}
	var tabs []*tab
	var tabsDone sync.WaitGroup
	for _, id := range ids {
		for k := range c.nodes {
			tb := &tab{name: fmt.Sprintf("%s/tab%d", id, k), threadID: id, c: c, first: c.node(k).base,
				rng: rand.New(rand.NewSource(rng.Int63()))}
			tabs = append(tabs, tb)
			byThread[id] = append(byThread[id], tb)
			tabsDone.Go(func() { tb.run(ctx) })
		}
	}

	l := &ledger{runs: map[string]string{}, cancelled: map[string]bool{}, cancelAt: map[string]time.Time{},
		confirmed: map[string]bool{}, opThread: map[string]string{}, refusals: map[string]int{}}
	runKind := map[string]string{}
	var firstRuns []string
	wctx, stopWork := context.WithTimeout(context.Background(), 90*time.Second)
	defer stopWork()
	var followers sync.WaitGroup
	// Every run is started through instance 0, over 1.2 s, so that when it
	// freezes some stream, some wait in the tool, some wait for a decision.
	offsets := make([]time.Duration, len(ids))
	for i := range offsets {
		offsets[i] = time.Duration(rng.Intn(1200)) * time.Millisecond
	}
	t0 := time.Now()
	for _, i := range rng.Perm(len(ids)) {
		pause(context.Background(), time.Until(t0.Add(offsets[i])))
		ack, err := api0.StartRun(ctx0, client.StartRunRequest{ThreadID: ids[i], ExpectedStateVersion: 1,
			UserMessage: prompts[i], ClientRequestID: fmt.Sprintf("first-%d", i)})
		if err != nil || ack.RunID == "" {
			t.Fatalf("run.start on %s: %+v %v", ids[i], ack, err)
		}
		l.runs[ack.RunID] = ids[i]
		runKind[ack.RunID] = kind(prompts[i])
		firstRuns = append(firstRuns, ack.RunID)
		fr := rand.New(rand.NewSource(rng.Int63()))
		threadID, runID := ids[i], ack.RunID
		followers.Go(func() { l.follow(wctx, c, fr, threadID, runID) }) // confirms or rejects the emails
	}

	// Freeze once instance 0 has runs both inside catalog_search and
	// streaming (bounded), a little later by the seed.
	owner0 := "gw0.%"
	busy := time.Now().Add(10 * time.Second)
	for {
		var inTool, streaming int
		if err := db.QueryRow(`SELECT
			(SELECT COUNT(*) FROM operations o JOIN runs r ON r.run_id = o.run_id
			  WHERE o.tool = 'catalog_search' AND o.phase = 'running' AND r.status = 'running' AND r.lease_owner LIKE $1),
			(SELECT COUNT(*) FROM runs r WHERE r.status = 'running' AND r.lease_owner LIKE $1
			  AND EXISTS (SELECT 1 FROM stream_messages m WHERE m.run_id = r.run_id)
			  AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.run_id = r.run_id AND o.phase IN ('running', 'prepared', 'confirmed', 'committing')))`,
			owner0).Scan(&inTool, &streaming); err != nil {
			t.Fatalf("read the runs: %v", err)
		}
		if inTool > 0 && streaming > 0 {
			break
		}
		if time.Now().After(busy) {
			t.Fatalf("10s after the runs started, instance 0 had %d runs in catalog_search and %d streaming: nothing to freeze", inTool, streaming)
		}
		pause(context.Background(), 20*time.Millisecond)
	}
	pause(context.Background(), time.Duration(rng.Intn(400))*time.Millisecond)

	c.freezeNode(victim)
	frozeAt := time.Now()
	pause(context.Background(), 100*time.Millisecond) // what it sent before it stopped has landed
	held := heldRuns(t, db, owner0)
	freezeSeq := map[string]int64{}
	{
		rows, err := db.Query(`SELECT thread_id, last_seq FROM threads`)
		if err != nil {
			t.Fatalf("read the threads: %v", err)
		}
		for rows.Next() {
			var id string
			var seq int64
			if err := rows.Scan(&id, &seq); err != nil {
				t.Fatalf("read the threads: %v", err)
			}
			freezeSeq[id] = seq
		}
		rows.Close()
	}
	var fig freezeFigures
	fig.held = len(held)
	for _, h := range held {
		if h.inTool != "" {
			fig.inTool++
		}
		if h.streamed != "" {
			fig.streaming++
		}
	}
	t.Logf("%v: instance 0 frozen holding %d runs (%d in catalog_search, %d streaming)", time.Since(began).Round(time.Millisecond), len(held), fig.inTool, fig.streaming)

	// Cancels while it is frozen: from tabs on the other instances (the
	// run is executed nowhere, or by a taker), and from a tab on the
	// frozen one (answered when it thaws).
	var cancels []*sent
	cancelFrom := func(tb *tab, runID, when string) {
		if s := tb.cancel(runID, when); s != nil {
			cancels = append(cancels, s)
		}
	}
	onNode := func(threadID string, frozen bool) *tab {
		for _, tb := range byThread[threadID] {
			if at := tb.connectedTo(); at != "" && (at == gw0.base) == frozen {
				return tb
			}
		}
		return nil
	}
	for _, k := range rng.Perm(len(held))[:min(len(held), 1+rng.Intn(2))] {
		if tb := onNode(held[k].threadID, false); tb != nil {
			cancelFrom(tb, held[k].runID, "while frozen, to a live instance")
		}
	}
	if len(held) > 0 {
		h := held[rng.Intn(len(held))]
		if tb := onNode(h.threadID, true); tb != nil {
			cancelFrom(tb, h.runID, "while frozen, to the frozen instance")
		}
	}

	// Until the others took every run it held (its leases run out after
	// 1.5 s; they look every third of it), bounded.
	taken := map[string]bool{}
	takeover := time.Now().Add(30 * time.Second) // beyond 20 s, for -stop.idle-in-tx=0
	for len(taken) < len(held) && time.Now().Before(takeover) {
		for _, h := range held {
			if taken[h.runID] {
				continue
			}
			var owner sql.NullString
			var epoch int64
			var status string
			if err := db.QueryRow(`SELECT lease_owner, lease_epoch, status FROM runs WHERE run_id = $1`, h.runID).Scan(&owner, &epoch, &status); err != nil {
				t.Fatalf("read run %s: %v", h.runID, err)
			}
			if owner.String != h.owner || epoch != h.epoch {
				taken[h.runID] = true
			}
		}
		pause(context.Background(), 50*time.Millisecond)
	}
	fig.takenOver = len(taken)
	if len(taken) < len(held) {
		t.Errorf("%v after instance 0 froze, only %d of the %d runs it held were taken over", time.Since(frozeAt).Round(time.Millisecond), len(taken), len(held))
	}
	pause(context.Background(), time.Duration(rng.Intn(500))*time.Millisecond) // the takers are mid-stream when it thaws
	fig.frozen = time.Since(frozeAt)
	// From the thaw on, which runs instance 0 claims again (a new epoch
	// under its own name while its stalled execution still runs).
	reclaimed := map[string]bool{}
	sctx, stopSampling := context.WithCancel(context.Background())
	defer stopSampling()
	var sampling sync.WaitGroup
	sampling.Go(func() {
		heldEpoch := map[string]int64{}
		for _, h := range held {
			if taken[h.runID] {
				heldEpoch[h.runID] = h.epoch
			}
		}
		for n := 0; n < 6000 && sctx.Err() == nil; n++ { // 30 ms apart: at most 3 minutes
			rows, err := db.QueryContext(sctx, `SELECT run_id, lease_owner, lease_epoch FROM runs WHERE lease_owner LIKE $1`, owner0)
			if err != nil {
				return // the round ended
			}
			for rows.Next() {
				var runID, owner string
				var epoch int64
				if rows.Scan(&runID, &owner, &epoch) == nil {
					if e, ok := heldEpoch[runID]; ok && epoch > e {
						reclaimed[runID] = true
					}
				}
			}
			rows.Close()
			pause(sctx, 30*time.Millisecond)
		}
	})
	c.thawNode(victim)
	t.Logf("instance 0 thawed after %v; %d of its %d runs were taken over", fig.frozen.Round(time.Millisecond), len(taken), len(held))

	// Some of its tabs reload (and resume elsewhere or on it); the rest
	// carry on on the connection that was frozen.
	for _, tb := range tabs {
		if tb.connectedTo() == gw0.base && rng.Intn(2) == 0 {
			tb.drop()
		}
	}
	// A cancel or two after the thaw, from any tab.
	for range 1 + rng.Intn(2) {
		runID := firstRuns[rng.Intn(len(firstRuns))]
		th := byThread[l.runs[runID]]
		cancelFrom(th[rng.Intn(len(th))], runID, "after the thaw")
	}

	// Every run comes to rest (a run still waiting for a decision once
	// its follower gave up is cancelled).
	settle := func(what string) map[string]int64 { return c.settle(t, l, rng, ids, what) }
	followers.Wait() // each returns once its run ended, or after 20 s
	stopWork()
	settle("the thaw")

	stopSampling()
	sampling.Wait()
	for runID := range taken {
		if reclaimed[runID] {
			fig.reclaimed++
		}
	}

	// The thawed instance serves as before: one more run per conversation
	// through it, each completed.
	var final []string
	for _, id := range ids {
		snap, err := api0.Thread(ctx0, id)
		if err != nil {
			t.Fatalf("GET thread %s from the thawed instance: %v", id, err)
		}
		ack, err := api0.StartRun(ctx0, client.StartRunRequest{ThreadID: id, ExpectedStateVersion: snap.StateVersion, UserMessage: "short: say hello"})
		if err != nil {
			t.Fatalf("run.start on the thawed instance: %v", err)
		}
		l.runs[ack.RunID] = id
		runKind[ack.RunID] = "text"
		final = append(final, ack.RunID)
	}
	lastSeqs := settle("the last runs started")

	catchUp(t, tabs, lastSeqs)
	stopTabs()
	tabsDone.Wait()

	// Every tab of a conversation saw the same events, byte for byte, in
	// order (the tab checks the order as it reads), resyncing only at gaps
	// the log records (the frozen instance's reserved blocks, written past
	// when it did not answer).
	tabsAgree(t, db, tabs)

	// The cancels' answers: an accepted one is honoured below. (Every
	// Conn is closed by now: a cancel without an answer has its error.)
	for _, s := range cancels {
		<-s.done
		e := apptest.Refusal(s.err)
		switch {
		case s.err != nil && (e == nil || e.Re == ""):
			t.Logf("cancel of %s sent %s (%s) got no answer: its connection was dropped first (%v)", s.runID, s.when, s.base, s.err)
		case s.err == nil && !s.ack.AlreadyRequested:
			if s.ack.Status != chat.RunCancelRequested {
				t.Errorf("cancel of %s sent %s: ack status %q, want cancel_requested: %+v", s.runID, s.when, s.ack.Status, s.ack)
			}
			l.cancelled[s.runID] = true
		case s.err == nil:
		case e.Code == chat.CodeRunNotActive:
		default:
			t.Errorf("cancel of %s sent %s to %s: %v", s.runID, s.when, s.base, s.err)
		}
	}
	for _, e := range l.errs {
		t.Error(e)
	}

	// Every run ended, and as it should.
	for runID := range l.runs {
		run, err := api0.Run(ctx0, runID)
		if err != nil {
			t.Errorf("run %s: GET answered %v", runID, err)
			continue
		}
		switch {
		case l.cancelled[runID] && run.Status != "cancelled":
			t.Errorf("run %s: its cancel was accepted but it ended %s", runID, run.Status)
		case run.Status != "completed" && run.Status != "cancelled":
			t.Errorf("run %s ended %s (error %v), want completed or cancelled", runID, run.Status, run.Error)
		}
	}
	for _, runID := range final {
		if l.cancelled[runID] {
			continue
		}
		if run, err := api0.Run(ctx0, runID); err != nil || run.Status != chat.RunCompleted {
			t.Errorf("the run started on the thawed instance, %s: %s %v, want completed", runID, run.Status, err)
		}
	}

	// Each step published once, counted directly (gateway check below
	// audits the same and more).
	stepsOnce(t, db, runKind)
	// Nothing of a stalled execution after its run was taken: the message
	// it was streaming got no delta fanned out after the freeze and was
	// never published. (Deltas it fanned out before the freeze may be
	// written after it: the instance writes them when another asks it for
	// the thread, after the thaw; each delta keeps the time it was fanned
	// out.)
	for _, h := range held {
		if !taken[h.runID] || h.streamed == "" {
			continue
		}
		var published int
		if err := db.QueryRow(`SELECT COUNT(*) FROM messages WHERE message_id = $1`, h.streamed).Scan(&published); err != nil {
			t.Fatalf("read message %s: %v", h.streamed, err)
		}
		later := deltasFannedOutAfter(t, db, h.streamed, freezeSeq[h.threadID], frozeAt)
		if later != 0 || published != 0 {
			t.Errorf("run %s: the execution that streamed %s lost its run while frozen, yet the message got %d deltas fanned out after the freeze and was published %d times", h.runID, h.streamed, later, published)
		}
	}
	// No email accepted twice.
	var dups int
	if err := db.QueryRow(`SELECT COUNT(*) FROM (SELECT idempotency_key FROM outbox_attempts WHERE result = 'accepted' GROUP BY 1 HAVING COUNT(*) > 1) d`).Scan(&dups); err != nil {
		t.Fatalf("read the outbox: %v", err)
	}
	if err := db.QueryRow(`SELECT COUNT(*) FROM outbox`).Scan(&fig.emails); err != nil {
		t.Fatalf("read the outbox: %v", err)
	}
	if dups != 0 {
		t.Errorf("%d idempotency keys were accepted more than once by the email provider", dups)
	}
	// No bus delivered past a seq it could not fill, but the seqs the log
	// records lost (the frozen instance's reserved blocks, written past
	// when it did not answer).
	var recordedLost float64
	if err := db.QueryRow(`SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM stream_gaps`).Scan(&recordedLost); err != nil {
		t.Fatalf("read stream_gaps: %v", err)
	}
	for i := range c.nodes {
		// (A bus that skips a recorded gap may skip a few events after it
		// too, which the log does hold: its sinks resync either way.)
		if skipped := apptest.Scrape(t, c.node(i).base+"/metrics").Get(t, "gateway_bus_skipped_events_total"); skipped > 0 && recordedLost == 0 {
			t.Errorf("instance %d: its bus delivered past %g seqs it could not fill, and the log records none lost", i, skipped)
		}
	}

	fig.fenced = gw0.Logged(fencedLine)
	if fig.takenOver > 0 && fig.fenced == 0 {
		t.Errorf("instance 0 lost %d runs while frozen, yet its log says no stalled execution was refused (%q): the round proved nothing about fencing", fig.takenOver, fencedLine)
	}
	for i := range c.nodes {
		if i != victim {
			fig.recovered += c.node(i).Logged("recovered run")
		}
	}
	for i := range c.nodes {
		c.node(i).Stop()
	}
	code, out, errOut := runCLI(t, nil, "check", "-db", c.dsn)
	if code != 0 || !strings.HasPrefix(out, "ok") {
		t.Errorf("gateway check: exit %d\n%s\n%s", code, out, errOut)
	}

	fig.runs = len(l.runs)
	fig.decisions = len(l.confirmed)
	for runID := range l.runs {
		if l.cancelled[runID] {
			fig.cancels++
		}
	}
	fig.took = time.Since(began)
	t.Logf("%d runs; instance 0 held %d (%d in the tool, %d streaming), %d taken over while frozen (%v), %d claimed again by it; %d cancels accepted of %d sent from tabs; %d decisions, %d emails sent; %d stalled executions refused; %d recoveries by the others; %d events per tab on average; %v",
		fig.runs, fig.held, fig.inTool, fig.streaming, fig.takenOver, fig.frozen.Round(time.Millisecond), fig.reclaimed, fig.cancels, len(cancels), fig.decisions, fig.emails, fig.fenced, fig.recovered,
		func() int64 {
			var n int64
			for _, s := range lastSeqs {
				n += s
			}
			return n / int64(len(lastSeqs))
		}(), fig.took.Round(time.Millisecond))
	return fig
}

// heldRuns lists the runs whose lease an instance (owner, a LIKE pattern)
// holds, with what each was doing.
func heldRuns(t *testing.T, db *sql.DB, owner string) []heldRun {
	t.Helper()
	rows, err := db.Query(`SELECT r.run_id, r.thread_id, r.lease_owner, r.lease_epoch,
		COALESCE((SELECT MAX(o.operation_id) FROM operations o WHERE o.run_id = r.run_id AND o.tool = 'catalog_search' AND o.phase = 'running'), ''),
		COALESCE((SELECT m.message_id FROM stream_messages m WHERE m.run_id = r.run_id
		  AND NOT EXISTS (SELECT 1 FROM messages p WHERE p.message_id = m.message_id) ORDER BY m.first_seq DESC LIMIT 1), '')
		FROM runs r WHERE r.lease_owner LIKE $1 AND r.status NOT IN ('completed', 'failed', 'cancelled') ORDER BY r.run_id`, owner)
	if err != nil {
		t.Fatalf("read the leases: %v", err)
	}
	defer rows.Close()
	var out []heldRun
	for rows.Next() {
		var h heldRun
		if err := rows.Scan(&h.runID, &h.threadID, &h.owner, &h.epoch, &h.inTool, &h.streamed); err != nil {
			t.Fatalf("read the leases: %v", err)
		}
		if h.inTool != "" {
			h.streamed = "" // it streams nothing while it waits for the tool
		}
		out = append(out, h)
	}
	return out
}

// stepsOnce counts, in the database, what invariant 9 forbids: two step
// checkpoints of a run on one parent, a step that published more than one
// message, a message with more than one message.published, more tool
// results than calls, and more replies than a prompt of its kind has
// generate steps (text: one; a search or an email: the call, then the
// answer).
func stepsOnce(t *testing.T, db *sql.DB, kind map[string]string) {
	t.Helper()
	for _, q := range []struct{ what, sql string }{
		{"step checkpoints of one run on one parent", `SELECT run_id || ' on ' || parent_checkpoint_id, COUNT(*) FROM checkpoints
			WHERE run_id IS NOT NULL GROUP BY run_id, parent_checkpoint_id HAVING COUNT(*) > 1`},
		{"messages of one step (run, parent checkpoint)", `SELECT m.run_id || ' on ' || c.parent_checkpoint_id, COUNT(*) FROM messages m
			JOIN checkpoints c ON c.checkpoint_id = m.checkpoint_id WHERE m.run_id IS NOT NULL GROUP BY m.run_id, c.parent_checkpoint_id HAVING COUNT(*) > 1`},
		{"message.published events of one message", `SELECT message_id, COUNT(*) FROM events WHERE type = 'message.published'
			GROUP BY message_id HAVING COUNT(*) > 1`},
		{"tool results of one operation", `SELECT CAST(content AS json)->>'operation_id', COUNT(*) FROM messages WHERE role = 'tool'
			GROUP BY 1 HAVING COUNT(*) > 1`},
	} {
		rows, err := db.Query(q.sql)
		if err != nil {
			t.Fatalf("count %s: %v", q.what, err)
		}
		for rows.Next() {
			var key string
			var n int
			if err := rows.Scan(&key, &n); err != nil {
				t.Fatalf("count %s: %v", q.what, err)
			}
			t.Errorf("invariant 9: %d %s: %s", n, q.what, key)
		}
		rows.Close()
	}
	rows, err := db.Query(`SELECT run_id, role, COUNT(*) FROM messages WHERE run_id IS NOT NULL GROUP BY run_id, role`)
	if err != nil {
		t.Fatalf("count the messages of each run: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var runID, role string
		var n int
		if err := rows.Scan(&runID, &role, &n); err != nil {
			t.Fatalf("count the messages of each run: %v", err)
		}
		limit := map[string]map[string]int{"text": {"assistant": 1}, "search": {"assistant": 2, "tool": 1}, "email": {"assistant": 2, "tool": 1}}[kind[runID]]
		if n > limit[role] {
			t.Errorf("invariant 9: run %s (a %s prompt) published %d %s messages, at most %d expected", runID, kind[runID], n, role, limit[role])
		}
	}
}

// deltasFannedOutAfter counts the deltas of a message, above seq after,
// whose fan-out time (stream_batches.ts plus each delta's offset) is later
// than at.
func deltasFannedOutAfter(t *testing.T, db *sql.DB, messageID string, after int64, at time.Time) int {
	t.Helper()
	rows, err := db.Query(`SELECT first_seq, last_seq, ts, ts_offsets FROM stream_batches WHERE message_id = $1 AND last_seq > $2`, messageID, after)
	if err != nil {
		t.Fatalf("read the batches of %s: %v", messageID, err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var first, last, ts int64
		var offsets string
		if err := rows.Scan(&first, &last, &ts, &offsets); err != nil {
			t.Fatal(err)
		}
		offs := make([]int64, last-first+1)
		if offsets != "" {
			if err := json.Unmarshal([]byte(offsets), &offs); err != nil {
				t.Fatalf("batch offsets %q: %v", offsets, err)
			}
		}
		for i, off := range offs {
			if first+int64(i) > after && ts+off > at.UnixMilli() {
				n++
			}
		}
	}
	return n
}
