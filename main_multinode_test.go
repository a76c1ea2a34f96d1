package main

// The scale-out test: three gateway processes on one PostgreSQL and one
// NATS, tabs (WebSocket connections) spread over them, a seeded random
// workload of runs, cancels, confirms and rejects sent to random instances,
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
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/internal/natstest"
	"github.com/honestcancel/gateway/internal/pgtest"
)

var (
	multiSeed     = flag.Int64("multinode.seed", 0, "TestMultiNode: seed of the random workload (0: from the clock)")
	multiDuration = flag.Duration("multinode.duration", 18*time.Second, "TestMultiNode: how long the workload runs")
)

// ---------------------------------------------------------------------------
// The cluster: instances that can die and come back.

type cluster struct {
	t     *testing.T
	dsn   string
	nats  *natstest.Server
	flags []string
	pace  string     // -demo-pace ("" : 8ms)
	extra [][]string // more flags for instance i (nil: none)

	mu     sync.Mutex
	nodes  []*server // nil while an instance is down
	frozen []bool    // instance i is stopped (SIGSTOP): up, but pick skips it
}

// startNode starts instance i (again).
func (c *cluster) startNode(i int) {
	c.t.Helper()
	flags := append([]string{"-nats", c.nats.URL(), "-instance-id", fmt.Sprintf("gw%d", i)}, c.flags...)
	if i < len(c.extra) {
		flags = append(flags, c.extra[i]...)
	}
	pace := c.pace
	if pace == "" {
		pace = "8ms"
	}
	s := startServerWith(c.t, c.dsn, pace, flags...)
	c.mu.Lock()
	c.nodes[i] = s
	c.mu.Unlock()
}

// node returns instance i (nil while it is down).
func (c *cluster) node(i int) *server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// freezeNode stops instance i with SIGSTOP; thawNode lets it go on. While
// it is frozen, pick leaves it out (a load balancer's health check would).
func (c *cluster) freezeNode(i int) {
	c.t.Helper()
	c.mu.Lock()
	if c.frozen == nil {
		c.frozen = make([]bool, len(c.nodes))
	}
	c.frozen[i] = true
	s := c.nodes[i]
	c.mu.Unlock()
	s.freeze()
}

func (c *cluster) thawNode(i int) {
	c.t.Helper()
	c.node(i).thaw()
	c.mu.Lock()
	c.frozen[i] = false
	c.mu.Unlock()
}

// killNode SIGKILLs instance i.
func (c *cluster) killNode(i int) {
	c.mu.Lock()
	s := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	s.kill()
}

// busiest returns the instance holding the most run leases right now (the
// one whose death tests takeover best) and the runs it holds.
func (c *cluster) busiest(db *sql.DB) (int, []string) {
	c.t.Helper()
	rows, err := db.Query(`SELECT lease_owner, run_id FROM runs WHERE lease_owner IS NOT NULL`)
	if err != nil {
		c.t.Fatalf("read leases: %v", err)
	}
	defer rows.Close()
	held := map[int][]string{}
	for rows.Next() {
		var owner, runID string
		if err := rows.Scan(&owner, &runID); err != nil {
			c.t.Fatalf("read leases: %v", err)
		}
		var i int
		if _, err := fmt.Sscanf(owner, "gw%d.", &i); err == nil {
			held[i] = append(held[i], runID)
		}
	}
	best := 2
	for i, runs := range held {
		if len(runs) > len(held[best]) {
			best = i
		}
	}
	return best, held[best]
}

// pick returns the base URL of a random instance that is up.
// settle waits, at most 60 s, until no thread of ids has an active run,
// cancelling a run left waiting for a confirmation (nobody would decide
// it), and returns each thread's last seq then. what names the moment, for
// the failure.
func (c *cluster) settle(t *testing.T, l *ledger, rng *rand.Rand, ids []string, what string) map[string]int64 {
	t.Helper()
	lastSeqs := map[string]int64{}
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range ids {
		for {
			var snap snapshot
			code, raw, err := crashCall(c.pick(rng), "GET", "/api/threads/"+id, nil, &snap)
			if err == nil && code == http.StatusOK && snap.ActiveRun == nil {
				lastSeqs[id] = snap.LastSeq
				break
			}
			if err == nil && code == http.StatusOK && snap.ActiveRun.Status == "waiting_confirmation" {
				l.cancel(c, rng, snap.ActiveRun.RunID)
			}
			if time.Now().After(deadline) {
				t.Fatalf("thread %s still has an active run 60s after %s: %s %v", id, what, raw, err)
			}
			pause(context.Background(), 50*time.Millisecond)
		}
	}
	return lastSeqs
}

func (c *cluster) pick(r *rand.Rand) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var up []string
	for i, s := range c.nodes {
		if s != nil && (c.frozen == nil || !c.frozen[i]) {
			up = append(up, s.base)
		}
	}
	return up[r.Intn(len(up))]
}

// ---------------------------------------------------------------------------
// Tabs: WebSocket connections that keep every event they receive, and
// reconnect with after_seq to a random instance when their connection ends.

type tabEvent struct {
	seq int64
	typ string
	raw string
}

type tab struct {
	name     string
	threadID string
	c        *cluster
	rng      *rand.Rand // used by the tab's goroutine only
	first    string     // base URL of the first connection ("": a random instance)

	mu         sync.Mutex
	events     []tabEvent
	lastSeq    int64
	conn       *websocket.Conn
	base       string            // the instance of conn
	answers    map[string]string // command id -> its ack or error frame
	violations []string
	reconnects int
	// resyncs are the times the tab could not be given every event after
	// the seq it had (a snapshot instead, or a connection closed as having
	// missed events): allowed only where the log records a gap ahead of
	// that seq (deltas a killed or unreachable lease holder fanned out and
	// never wrote, see store/streambuf.go); checked at the end.
	resyncs []resync
}

type resync struct {
	after, to int64 // the seq the tab had; the snapshot's seq (0: none)
	how       string
}

func (tb *tab) resynced(after, to int64, how string) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.resyncs = append(tb.resyncs, resync{after: after, to: to, how: how})
}

// send writes a command (a JSON object with its own "id") on the tab's
// current connection; its ack or error is kept for answer. It fails when
// the tab is between connections, and says to which instance it went.
func (tb *tab) send(ctx context.Context, cmd map[string]any) (string, error) {
	tb.mu.Lock()
	conn, base := tb.conn, tb.base
	tb.mu.Unlock()
	if conn == nil {
		return "", errors.New("not connected")
	}
	b, err := json.Marshal(cmd)
	if err != nil {
		return "", err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return base, conn.Write(wctx, websocket.MessageText, b)
}

// answer returns the ack or error frame of command id ("" : none yet).
func (tb *tab) answer(id string) string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.answers[id]
}

// connectedTo returns the base URL of the tab's connection ("" : none).
func (tb *tab) connectedTo() string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.base
}

func (tb *tab) violate(format string, args ...any) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if len(tb.violations) < 20 {
		tb.violations = append(tb.violations, tb.name+": "+fmt.Sprintf(format, args...))
	}
}

// drop closes the tab's connection (a page reload, a network blip); the
// tab's goroutine reconnects.
func (tb *tab) drop() {
	tb.mu.Lock()
	conn := tb.conn
	tb.mu.Unlock()
	if conn != nil {
		conn.CloseNow()
	}
}

// run connects, subscribes after the last seq it has, and reads until the
// connection ends; then again, until ctx ends.
func (tb *tab) run(ctx context.Context) {
	for first := true; ctx.Err() == nil; first = false {
		base := tb.c.pick(tb.rng)
		if first && tb.first != "" {
			base = tb.first
		}
		err := tb.session(ctx, base)
		if ctx.Err() != nil {
			return
		}
		var ce websocket.CloseError
		if errors.As(err, &ce) && ce.Code == websocket.StatusTryAgainLater && strings.Contains(ce.Reason, "missed events") {
			tb.resynced(tb.last(), 0, "closed as having missed events on "+base)
		} else if errors.As(err, &ce) && ce.Code != websocket.StatusGoingAway && ce.Code != websocket.StatusNormalClosure {
			// The server closed it on purpose: for this workload only a
			// lost event (closeSlow "missed events") would do that.
			tb.violate("server closed the connection to %s: %d %s", base, ce.Code, ce.Reason)
		}
		tb.mu.Lock()
		tb.reconnects++
		tb.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(20+tb.rng.Intn(80)) * time.Millisecond): // a page's reconnect back-off
		}
	}
}

func (tb *tab) session(ctx context.Context, base string) error {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	conn, _, err := websocket.Dial(dctx, "ws"+strings.TrimPrefix(base, "http")+"/ws", nil)
	cancel()
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	conn.SetReadLimit(16 << 20)
	tb.mu.Lock()
	tb.conn, tb.base = conn, base
	after := tb.lastSeq
	tb.mu.Unlock()
	defer func() {
		tb.mu.Lock()
		tb.conn, tb.base = nil, ""
		tb.mu.Unlock()
	}()
	sub, _ := json.Marshal(map[string]any{"type": "subscribe", "id": "s1", "thread_id": tb.threadID, "after_seq": after})
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = conn.Write(wctx, websocket.MessageText, sub)
	cancel()
	if err != nil {
		return err
	}
	acked := false
	for {
		_, frame, err := conn.Read(ctx)
		if err != nil {
			return err
		}
		for _, line := range bytes.Split(frame, []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			var head struct {
				Type      string `json:"type"`
				Re        string `json:"re"`
				Seq       int64  `json:"seq"`
				ThreadID  string `json:"thread_id"`
				Recovered *bool  `json:"recovered"`
				Error     string `json:"error"`
			}
			if err := json.Unmarshal(line, &head); err != nil {
				tb.violate("unreadable frame %q: %v", line, err)
				continue
			}
			switch {
			case head.Type == "ack" && head.Re == "s1":
				acked = true
				if head.Recovered == nil || !*head.Recovered {
					// A snapshot follows: checked there.
					tb.resynced(after, -1, "subscribe after_seq not recovered on "+base)
				}
			case head.Re != "" && head.Re != "s1" && (head.Type == "ack" || head.Type == "error"):
				// The answer to a command sent with send.
				tb.mu.Lock()
				if tb.answers == nil {
					tb.answers = map[string]string{}
				}
				tb.answers[head.Re] = string(line)
				tb.mu.Unlock()
			case head.Type == "error":
				tb.violate("error frame on %s: %s", base, line)
			case !acked:
				tb.violate("event before the subscribe ack: %s", line)
			case head.Type == "thread.snapshot":
				tb.mu.Lock()
				last := tb.lastSeq
				tb.lastSeq = head.Seq
				tb.mu.Unlock()
				tb.resynced(last, head.Seq, "snapshot on "+base)
			default:
				tb.mu.Lock()
				switch {
				case head.ThreadID != tb.threadID:
					tb.mu.Unlock()
					tb.violate("event of another thread: %s", line)
					continue
				case head.Seq != tb.lastSeq+1:
					last := tb.lastSeq
					tb.mu.Unlock()
					tb.violate("seq %d after %d on %s (%s): a gap or a duplicate", head.Seq, last, base, head.Type)
					continue
				}
				tb.lastSeq = head.Seq
				tb.events = append(tb.events, tabEvent{seq: head.Seq, typ: head.Type, raw: string(line)})
				tb.mu.Unlock()
			}
		}
	}
}

func (tb *tab) last() int64 {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.lastSeq
}

// ---------------------------------------------------------------------------
// The workload's ledger of acknowledged commands.

type ledger struct {
	mu        sync.Mutex
	runs      map[string]string // run id -> thread id: every acked run.start
	cancelled map[string]bool   // run id -> a cancel was accepted (already_requested false)
	cancelAt  map[string]time.Time
	confirmed map[string]bool   // operation id -> confirmed (true) or rejected (false), acked
	opThread  map[string]string // operation id -> its thread
	refusals  map[string]int    // "command status code" -> count (expected refusals, for the log)
	errs      []string
}

func (l *ledger) fail(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) < 30 {
		l.errs = append(l.errs, fmt.Sprintf(format, args...))
	}
}

func (l *ledger) refused(cmd string, status int, raw []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refusals[fmt.Sprintf("%s %d %s", cmd, status, errorCode(raw))]++
}

// thread worker: one sequential user per thread, every command to a random
// instance.
func (l *ledger) work(ctx context.Context, c *cluster, r *rand.Rand, threadID string, prompts []string) {
	for n := 0; n < 400 && ctx.Err() == nil; n++ {
		base := c.pick(r)
		var snap snapshot
		code, _, err := crashCall(base, "GET", "/api/threads/"+threadID, nil, &snap)
		if err != nil || code != http.StatusOK {
			continue // a dying instance; the next turn picks again
		}
		runID := ""
		if snap.ActiveRun != nil {
			runID = snap.ActiveRun.RunID
		} else {
			runID = l.start(ctx, c, r, threadID, snap.StateVersion, prompts[r.Intn(len(prompts))])
			if runID == "" {
				continue
			}
		}
		if r.Intn(10) < 4 {
			pause(ctx, time.Duration(r.Intn(700))*time.Millisecond)
			l.cancel(c, r, runID)
		}
		l.follow(ctx, c, r, threadID, runID)
	}
}

// pause is the workload's think time between a user's actions.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// start sends run.start, retrying with the same client_request_id on
// other instances when an answer is lost; it returns the acked run id.
func (l *ledger) start(ctx context.Context, c *cluster, r *rand.Rand, threadID string, version int64, prompt string) string {
	crid := fmt.Sprintf("req-%d", r.Int63())
	for try := 0; try < 5 && ctx.Err() == nil; try++ {
		var ack startAck
		code, raw, err := crashCall(c.pick(r), "POST", "/api/threads/"+threadID+"/runs",
			map[string]any{"expected_state_version": version, "user_message": prompt, "client_request_id": crid}, &ack)
		switch {
		case err != nil:
			continue // maybe executed, maybe not: the retry with the same id tells
		case code == http.StatusCreated:
			if ack.RunID == "" {
				l.fail("run.start acked without a run id: %s", raw)
				return ""
			}
			l.mu.Lock()
			l.runs[ack.RunID] = threadID
			l.mu.Unlock()
			return ack.RunID
		default:
			l.refused("run.start", code, raw) // conflict, run already active: the next turn reloads
			return ""
		}
	}
	return ""
}

func (l *ledger) cancel(c *cluster, r *rand.Rand, runID string) {
	var ack cancelAck
	code, raw, err := crashCall(c.pick(r), "POST", "/api/runs/"+runID+"/cancel", map[string]any{}, &ack)
	if err != nil {
		return
	}
	if code != http.StatusAccepted {
		l.refused("run.cancel", code, raw) // run_not_active: it completed first
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !ack.AlreadyRequested {
		if l.cancelled[runID] {
			l.errs = append(l.errs, fmt.Sprintf("run %s: a second cancel was accepted as the first", runID))
		}
		l.cancelled[runID] = true
		l.cancelAt[runID] = time.Now()
	}
}

// follow waits (bounded) for the run to end, confirming or rejecting the
// tool calls it waits for.
func (l *ledger) follow(ctx context.Context, c *cluster, r *rand.Rand, threadID, runID string) {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		base := c.pick(r)
		var run runInfo
		code, _, err := crashCall(base, "GET", "/api/runs/"+runID, nil, &run)
		if err != nil || code != http.StatusOK {
			pause(ctx, 50*time.Millisecond)
			continue
		}
		switch run.Status {
		case "completed", "failed", "cancelled":
			return
		case "waiting_confirmation":
			l.decide(c, r, threadID, runID)
		}
		pause(ctx, 40*time.Millisecond) // polling an HTTP API, as a script would
	}
}

func (l *ledger) decide(c *cluster, r *rand.Rand, threadID, runID string) {
	base := c.pick(r)
	var snap snapshot
	if code, _, err := crashCall(base, "GET", "/api/threads/"+threadID, nil, &snap); err != nil || code != http.StatusOK {
		return
	}
	var ops struct {
		Operations []operation `json:"operations"`
	}
	if code, _, err := crashCall(base, "GET", "/api/threads/"+threadID+"/operations", nil, &ops); err != nil || code != http.StatusOK {
		return
	}
	for _, op := range ops.Operations {
		if op.RunID != runID || op.Phase != "prepared" {
			continue
		}
		confirm := r.Intn(10) < 7
		verb := "reject"
		if confirm {
			verb = "confirm"
		}
		code, raw, err := crashCall(c.pick(r), "POST", "/api/operations/"+op.OperationID+"/"+verb,
			map[string]any{"expected_state_version": snap.StateVersion}, nil)
		if err != nil {
			return
		}
		if code != http.StatusOK {
			l.refused("tool."+verb, code, raw)
			return
		}
		l.mu.Lock()
		l.confirmed[op.OperationID] = confirm
		l.opThread[op.OperationID] = threadID
		l.mu.Unlock()
		return
	}
}

// ---------------------------------------------------------------------------

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
	var starting sync.WaitGroup
	for i := range c.nodes {
		starting.Go(func() { c.startNode(i) })
	}
	starting.Wait()
	if t.Failed() {
		t.FailNow()
	}

	const threads, tabsPerThread = 6, 3
	var ids []string
	for range threads {
		var snap snapshot
		code, raw, err := crashCall(c.pick(rng), "POST", "/api/threads", map[string]any{}, &snap)
		if err != nil || code != http.StatusCreated {
			t.Fatalf("create thread: %d %s %v", code, raw, err)
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
		confirmed: map[string]bool{}, opThread: map[string]string{}, refusals: map[string]int{}}
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
	catchUp := time.Now().Add(20 * time.Second)
	for _, tb := range tabs {
		for tb.last() < lastSeqs[tb.threadID] {
			if time.Now().After(catchUp) {
				t.Errorf("%s stopped at seq %d, thread's last seq is %d", tb.name, tb.last(), lastSeqs[tb.threadID])
				break
			}
			pause(context.Background(), 20*time.Millisecond)
		}
	}
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
	base := c.pick(rng)
	statuses := map[string]int{}
	var latencies []time.Duration
	for runID := range l.runs {
		var run runInfo
		code, raw, err := crashCall(base, "GET", "/api/runs/"+runID, nil, &run)
		if err != nil || code != http.StatusOK {
			t.Errorf("acked run %s: GET answered %d %s %v", runID, code, raw, err)
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
			if ev.typ != "run.cancelled" {
				continue
			}
			var body struct {
				RunID string `json:"run_id"`
				TS    int64  `json:"ts"`
			}
			if json.Unmarshal([]byte(ev.raw), &body) == nil {
				if at, ok := l.cancelAt[body.RunID]; ok {
					latencies = append(latencies, time.UnixMilli(body.TS).Sub(at))
				}
			}
		}
	}
	phases := map[string]string{}
	for _, id := range ids {
		var ops struct {
			Operations []operation `json:"operations"`
		}
		code, raw, err := crashCall(base, "GET", "/api/threads/"+id+"/operations", nil, &ops)
		if err != nil || code != http.StatusOK {
			t.Fatalf("operations of %s: %d %s %v", id, code, raw, err)
		}
		for _, op := range ops.Operations {
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
		m := scrape(t, s.base+"/metrics")
		// (A bus that skips a recorded gap may skip a few events after it
		// too, which the log does hold: the log's read stops at the gap.
		// Its sinks resync either way.)
		if skipped := m.get(t, "gateway_bus_skipped_events_total"); skipped > 0 && recordedLost == 0 {
			t.Errorf("instance %d: its bus delivered past %g seqs it could not fill, and the log records none lost", i, skipped)
		} else if skipped > 0 {
			t.Logf("instance %d: its bus delivered past %g seqs; the log records %d lost", i, skipped, recordedLost)
		}
		recoveries += m.get(t, "gateway_bus_recoveries_total")
		recovered += m.get(t, "gateway_bus_recovered_events_total")
		yields += m.get(t, "gateway_stream_yields_total")
		writtenPast += m.get(t, "gateway_stream_written_past_total")
		deltasLost += m.get(t, "gateway_stream_deltas_lost_total")
	}
	t.Logf("threads handed between instances %g times; reservations written past %g (gaps recorded %d, %d seqs); deltas dropped as lost by live instances %g",
		yields, writtenPast, len(gaps), recordedLost, deltasLost)

	// Stop gracefully and check the database.
	for i := range c.nodes {
		c.mu.Lock()
		s := c.nodes[i]
		c.mu.Unlock()
		s.stop()
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
	t.Logf("%d threads, %d tabs (%d reconnects), %d runs %v (%d held by the killed instance, all finished elsewhere), %d cancels accepted, %d decisions, %d emails accepted, %d events per tab on average; %g gap recoveries by the buses (%g events from the log); "+
		"cancel → run.cancelled (ts, ms resolution) p50 %v p99 %v over %d; expected refusals %v",
		len(ids), len(tabs), reconnects, len(l.runs), statuses, takenOver, len(l.cancelled), len(l.confirmed), accepted,
		seqs/int64(len(ids)), recoveries, recovered, p(0.5), p(0.99), len(latencies), l.refusals)
	if len(l.runs) < 2*threads || len(l.cancelled) == 0 {
		t.Errorf("the workload did too little to prove anything: %d runs, %d cancels", len(l.runs), len(l.cancelled))
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
