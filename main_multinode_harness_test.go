// The scale-out test's harness (main_multinode_test.go): the cluster of
// gateway processes on one PostgreSQL and NATS, the tabs and their wire
// records, the ledger of acknowledged commands, and the workload's steps.

package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
	"github.com/honestcancel/gateway/internal/natstest"
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
	nodes  []*server        // nil while an instance is down
	apis   []*client.Client // the workload's protocol client of instance i (10 s a request)
	frozen []bool           // instance i is stopped (SIGSTOP): up, but pick skips it
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
	s := startProcess(c.t, c.dsn, pace, flags...)
	api := apptest.NewAPI(c.t, s.base, 10*time.Second, nil)
	c.mu.Lock()
	if c.apis == nil {
		c.apis = make([]*client.Client, len(c.nodes))
	}
	c.nodes[i], c.apis[i] = s, api
	c.mu.Unlock()
}

// startAll starts every instance at once (on an empty database the
// migrations run once) and stops the test if any of them did not start.
func (c *cluster) startAll() {
	c.t.Helper()
	var starting sync.WaitGroup
	for i := range c.nodes {
		starting.Go(func() { c.startNode(i) })
	}
	starting.Wait()
	if c.t.Failed() {
		c.t.FailNow()
	}
}

// node returns instance i (nil while it is down).
func (c *cluster) node(i int) *server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// apiOf returns the workload's client of instance i.
func (c *cluster) apiOf(i int) *client.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.apis[i]
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
	s.Freeze()
}

func (c *cluster) thawNode(i int) {
	c.t.Helper()
	c.node(i).Thaw()
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
	s.Kill()
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
			_, api := c.pick(rng)
			snap, err := api.Thread(context.Background(), id)
			if err == nil && snap.ActiveRun == nil {
				lastSeqs[id] = snap.LastSeq
				break
			}
			if err == nil && snap.ActiveRun.Status == chat.RunWaitingConfirmation {
				l.cancel(c, rng, snap.ActiveRun.RunID)
			}
			if time.Now().After(deadline) {
				t.Fatalf("thread %s still has an active run 60s after %s: %+v %v", id, what, snap.ActiveRun, err)
			}
			pause(context.Background(), 50*time.Millisecond)
		}
	}
	return lastSeqs
}

// pick returns a random instance that is up: its base URL and the
// workload's client of it.
func (c *cluster) pick(r *rand.Rand) (base string, api *client.Client) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var up []int
	for i, s := range c.nodes {
		if s != nil && (c.frozen == nil || !c.frozen[i]) {
			up = append(up, i)
		}
	}
	i := up[r.Intn(len(up))]
	return c.nodes[i].base, c.apis[i]
}

// ---------------------------------------------------------------------------
// Tabs: WebSocket connections of the protocol client (client.Conn, one
// Subscription each) that keep every event they receive. A tab's Conn
// reconnects to its instance by itself, resubscribing after the last seq
// it received; when that instance is gone (the Conn gives up after one
// failed attempt) or the tab reloads (drop), the tab opens a new Conn to a
// random instance that is up, subscribing after the last seq it has.

type tabEvent struct {
	seq   int64
	typ   string
	runID string
	ts    int64
	raw   string
}

type tab struct {
	name     string
	threadID string
	c        *cluster
	rng      *rand.Rand // used by the tab's goroutine only
	first    string     // base URL of the first connection ("": a random instance)

	mu      sync.Mutex
	events  []tabEvent
	lastSeq int64 // of the last event delivered
	// wireSeq is the seq of the last event of the thread the current Conn
	// received in order (where it resumes after a reconnection), as
	// tabWire reads it.
	wireSeq    int64
	conn       *client.Conn
	base       string // the instance of conn
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
// tab's goroutine connects again. It does not wait for the close.
func (tb *tab) drop() {
	tb.mu.Lock()
	conn := tb.conn
	tb.mu.Unlock()
	if conn != nil {
		go conn.Close()
	}
}

// run connects, subscribes after the last seq it has, and reads until the
// connection ends for good; then again, until ctx ends.
func (tb *tab) run(ctx context.Context) {
	for first := true; ctx.Err() == nil; first = false {
		base, _ := tb.c.pick(tb.rng)
		if first && tb.first != "" {
			base = tb.first
		}
		tb.session(ctx, base)
		if ctx.Err() != nil {
			return
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

// session reads the thread's events over one Conn to base until it ends:
// the tab reloads, its instance is gone, or ctx ends.
func (tb *tab) session(ctx context.Context, base string) {
	cl, err := client.New(base, client.WithHTTPClient(&http.Client{Transport: &tabWire{tb: tb, base: base}}),
		client.WithIdleTimeout(-1), client.WithBackoff(20*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		tb.violate("client of %s: %v", base, err)
		return
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	conn, err := cl.Connect(dctx, client.ConnOptions{ReadLimit: 16 << 20, Buffer: 1 << 16, MaxAttempts: 1})
	cancel()
	if err != nil {
		return // a dying instance: the next session picks again
	}
	tb.mu.Lock()
	tb.conn, tb.base = conn, base
	after := tb.lastSeq
	tb.wireSeq = after
	tb.mu.Unlock()
	defer func() {
		conn.Close()
		// The client drops and repairs what a server must never send;
		// with a correct one it has nothing to count.
		if st := conn.Stats(); st.Duplicates+st.Jumps+st.Stray+st.Malformed+st.Unanswered > 0 {
			tb.violate("on %s: %d duplicates, %d gaps, %d events of another thread, %d unreadable frames, %d answers to no command; the last: %s",
				base, st.Duplicates, st.Jumps, st.Stray, st.Malformed, st.Unanswered, st.LastAnomaly)
		}
		tb.mu.Lock()
		tb.conn, tb.base = nil, ""
		tb.reconnects += int(conn.Stats().Connects) - 1
		tb.mu.Unlock()
	}()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	sub, err := conn.Subscribe(sctx, tb.threadID, after)
	cancel()
	if err != nil {
		if e := apptest.Refusal(err); e != nil && e.Re != "" {
			tb.violate("subscribe on %s refused: %v", base, err)
		}
		return
	}
	if !sub.Ack().Recovered {
		// A snapshot follows: checked there.
		tb.resynced(after, -1, "subscribe after_seq not recovered on "+base)
	}
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			// An error frame answering the subscribe the Conn sent again
			// after reconnecting (not the Conn giving up on its instance).
			if e := apptest.Refusal(err); e != nil && e.Re != "" {
				tb.violate("error frame on %s: %v", base, err)
			}
			return
		}
		tb.mu.Lock()
		tb.lastSeq = ev.Seq
		if ev.Gap != nil {
			tb.resyncs = append(tb.resyncs, resync{after: ev.Gap.After, to: ev.Seq, how: "snapshot on " + base})
		} else {
			tb.events = append(tb.events, tabEvent{seq: ev.Seq, typ: ev.Type, runID: ev.RunID, ts: ev.TS, raw: string(ev.Raw)})
		}
		tb.mu.Unlock()
	}
}

func (tb *tab) last() int64 {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.lastSeq
}

// took notes an event of the thread the current Conn received.
func (tb *tab) took(typ string, seq int64) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if typ == chat.EventThreadSnapshot || seq == tb.wireSeq+1 {
		tb.wireSeq = seq
	}
}

// tabWire is the transport of a tab's client. The Conn decides by itself
// what a closed connection means (it reconnects and resumes) and shows
// neither why the server closed it nor the order of a subscribe's answer
// and its events, which the tab's checks need: so tabWire passes every
// request on and reads, as they go by, the frames the server sends on the
// tab's WebSocket connections (RFC 6455 framing: a server's frames are
// not masked, and compression is off). It checks that no event of the
// thread comes on a connection before its first ack (the subscribe's),
// and sorts the server's close frames: 1013 "missed events" is a resync
// (judged by the log's gaps), 1000 and 1001 are ordinary, anything else
// is a violation.
type tabWire struct {
	tb   *tab
	base string
}

func (w *tabWire) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		return resp, err
	}
	if rwc, ok := resp.Body.(io.ReadWriteCloser); ok {
		resp.Body = &wireConn{ReadWriteCloser: rwc, tb: w.tb, base: w.base}
	}
	return resp, nil
}

// wireConn is one connection's bytes from the server, read by the Conn's
// reader goroutine only.
type wireConn struct {
	io.ReadWriteCloser
	tb     *tab
	base   string
	buf    []byte // read, not a whole frame yet
	text   []byte // a text message's payload so far
	inText bool   // a text message is not finished
	acked  bool   // an ack came on this connection
}

func (c *wireConn) Read(p []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(p)
	c.buf = append(c.buf, p[:n]...)
	for c.frame() {
	}
	return n, err
}

// frame handles the first frame of buf if it is whole.
func (c *wireConn) frame() bool {
	b := c.buf
	if len(b) < 2 {
		return false
	}
	fin, op, h := b[0]&0x80 != 0, b[0]&0x0f, 2
	n := uint64(b[1] & 0x7f)
	switch n {
	case 126:
		if len(b) < 4 {
			return false
		}
		n, h = uint64(binary.BigEndian.Uint16(b[2:])), 4
	case 127:
		if len(b) < 10 {
			return false
		}
		n, h = binary.BigEndian.Uint64(b[2:]), 10
	}
	if uint64(len(b)-h) < n {
		return false
	}
	payload := b[h : h+int(n)]
	c.buf = b[h+int(n):]
	switch {
	case op == 0x8:
		c.closed(payload)
	case op == 0x1 || op == 0x0 && c.inText:
		c.text = append(c.text, payload...)
		c.inText = !fin
		if fin {
			c.message(c.text)
			c.text = c.text[:0]
		}
	}
	return true
}

// message reads the objects of a text message (one a line).
func (c *wireConn) message(m []byte) {
	for line := range bytes.SplitSeq(m, []byte("\n")) {
		var h struct {
			Type     string `json:"type"`
			ThreadID string `json:"thread_id"`
			Seq      int64  `json:"seq"`
			Error    string `json:"error"`
		}
		if json.Unmarshal(line, &h) != nil {
			continue // the client counts it (Malformed)
		}
		switch {
		case h.Type == "ack":
			c.acked = true
		case h.Type == "error" && h.Error == chat.CodeRateLimited:
			// (The Conn subscribes again later by itself.)
			c.tb.violate("error frame on %s: %s", c.base, line)
		case h.Type == "error" || h.ThreadID != c.tb.threadID:
			// Another answer, or a stray event: the client reports them.
		default:
			if !c.acked {
				c.tb.violate("event before the subscribe ack on %s: %s", c.base, line)
			}
			c.tb.took(h.Type, h.Seq)
		}
	}
}

// closed sorts the server's close frame.
func (c *wireConn) closed(payload []byte) {
	code, reason := websocket.StatusNoStatusRcvd, ""
	if len(payload) >= 2 {
		code, reason = websocket.StatusCode(binary.BigEndian.Uint16(payload)), string(payload[2:])
	}
	switch {
	case code == websocket.StatusTryAgainLater && strings.Contains(reason, "missed events"):
		c.tb.mu.Lock()
		after := c.tb.wireSeq
		c.tb.mu.Unlock()
		c.tb.resynced(after, 0, "closed as having missed events on "+c.base)
	case code != websocket.StatusGoingAway && code != websocket.StatusNormalClosure:
		// The server closed it on purpose: for this workload only a
		// lost event (closeSlow "missed events") would do that.
		c.tb.violate("server closed the connection to %s: %d %s", c.base, code, reason)
	}
}

// cancel sends run.cancel for runID over the tab's current connection
// and returns at once (its instance may be frozen): the answer, or why
// none came, is in the sent once its done is closed. nil: the tab is
// between connections.
func (tb *tab) cancel(runID, when string) *sent {
	tb.mu.Lock()
	conn, base := tb.conn, tb.base
	tb.mu.Unlock()
	if conn == nil {
		return nil
	}
	s := &sent{tb: tb, runID: runID, base: base, when: when, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.ack, s.err = conn.CancelRun(context.Background(), client.CancelRunRequest{RunID: runID})
	}()
	return s
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
	queued    map[string]string // queue item -> thread: every acked queue.add
	resumes   int
	errs      []string
}

func (l *ledger) fail(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) < 30 {
		l.errs = append(l.errs, fmt.Sprintf(format, args...))
	}
}

func (l *ledger) refused(cmd string, e *client.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refusals[fmt.Sprintf("%s %d %s", cmd, e.Status, e.Code)]++
}

// thread worker: one sequential user per thread, every command to a random
// instance.
func (l *ledger) work(ctx context.Context, c *cluster, r *rand.Rand, threadID string, prompts []string) {
	for n := 0; n < 400 && ctx.Err() == nil; n++ {
		_, api := c.pick(r)
		snap, err := api.Thread(context.Background(), threadID)
		if err != nil {
			continue // a dying instance; the next turn picks again
		}
		runID := ""
		if snap.ActiveRun == nil && snap.Queue != nil && snap.Queue.Paused && r.Intn(2) == 0 {
			l.resume(c, r, threadID)
			continue
		}
		if snap.ActiveRun != nil {
			runID = snap.ActiveRun.RunID
		} else {
			runID = l.start(ctx, c, r, threadID, snap.StateVersion, prompts[r.Intn(len(prompts))])
			if runID == "" {
				continue
			}
		}
		if r.Intn(10) < 3 {
			// The next message, queued through any instance: it starts
			// when this run completes, or waits paused after a cancel.
			l.queue(ctx, c, r, threadID, prompts[r.Intn(len(prompts))])
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
		_, api := c.pick(r)
		ack, err := api.StartRun(context.Background(), client.StartRunRequest{ThreadID: threadID,
			ExpectedStateVersion: version, UserMessage: prompt, ClientRequestID: crid})
		e := apptest.Refusal(err)
		switch {
		case err == nil:
			if ack.RunID == "" {
				l.fail("run.start acked without a run id: %+v", ack)
				return ""
			}
			l.mu.Lock()
			l.runs[ack.RunID] = threadID
			l.mu.Unlock()
			return ack.RunID
		case e == nil:
			continue // maybe executed, maybe not: the retry with the same id tells
		default:
			l.refused("run.start", e) // conflict, run already active: the next turn reloads
			return ""
		}
	}
	return ""
}

func (l *ledger) cancel(c *cluster, r *rand.Rand, runID string) {
	_, api := c.pick(r)
	ack, err := api.CancelRun(context.Background(), client.CancelRunRequest{RunID: runID})
	if e := apptest.Refusal(err); e != nil {
		l.refused("run.cancel", e) // run_not_active: it completed first
		return
	}
	if err != nil {
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
		_, api := c.pick(r)
		run, err := api.Run(context.Background(), runID)
		if err != nil {
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
	ctx := context.Background()
	_, api := c.pick(r)
	snap, err := api.Thread(ctx, threadID)
	if err != nil {
		return
	}
	ops, err := api.Operations(ctx, threadID)
	if err != nil {
		return
	}
	for _, op := range ops {
		if op.RunID != runID || op.Phase != "prepared" {
			continue
		}
		confirm := r.Intn(10) < 7
		_, api := c.pick(r)
		verb, decide := "reject", api.RejectTool
		if confirm {
			verb, decide = "confirm", api.ConfirmTool
		}
		_, err := decide(ctx, op.OperationID, snap.StateVersion)
		if e := apptest.Refusal(err); e != nil {
			l.refused("tool."+verb, e)
			return
		}
		if err != nil {
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

// queue sends queue.add, retrying with the same client_request_id on
// other instances when an answer is lost.
func (l *ledger) queue(ctx context.Context, c *cluster, r *rand.Rand, threadID, prompt string) {
	crid := fmt.Sprintf("q-%d", r.Int63())
	for try := 0; try < 5 && ctx.Err() == nil; try++ {
		_, api := c.pick(r)
		ack, err := api.QueueAdd(context.Background(), client.QueueAddRequest{ThreadID: threadID, UserMessage: prompt,
			ClientRequestID: crid})
		e := apptest.Refusal(err)
		switch {
		case err == nil:
			l.mu.Lock()
			l.queued[ack.ItemID] = threadID
			l.mu.Unlock()
			return
		case e == nil:
			continue // maybe executed, maybe not: the retry with the same id tells
		default:
			l.refused("queue.add", e)
			return
		}
	}
}

// resume sends queue.resume to a random instance.
func (l *ledger) resume(c *cluster, r *rand.Rand, threadID string) {
	_, api := c.pick(r)
	_, err := api.QueueResume(context.Background(), client.QueueItemRequest{ThreadID: threadID})
	if e := apptest.Refusal(err); e != nil {
		l.refused("queue.resume", e)
		return
	}
	if err == nil {
		l.mu.Lock()
		l.resumes++
		l.mu.Unlock()
	}
}
