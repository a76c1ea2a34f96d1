package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// The generator drives the gateway through package client, as any
// program would: a client.Client per simulated user for HTTP, and per tab
// a client.Conn (its TabID, its own reader goroutine, reconnection and
// replay by seq) with one Subscription. What the client checks (each seq
// once and in order, the thread's events only, every answer to a command
// in flight, the ack before the events) it counts in Conn.Stats; the
// generator reports those counts as protocol errors, with its own checks
// on what Next returns.

// gwEnv is what every gateway client of one scenario shares.
type gwEnv struct {
	base      string   // http://127.0.0.1:PORT: threads are created here
	bases     []string // every instance's base; tab k of thread i dials bases[(i+k) % len]
	auth      string   // "header" (a user per thread) or "none"
	scenario  string
	errs      *errorLog
	http      *http.Client  // the one transport of every client.Client of the scenario
	dialSem   chan struct{} // bounds concurrent connects
	measuring atomic.Bool   // latency samples are taken while true
	start     time.Time     // monotonic base of spread measurements

	pace time.Duration // the demo model's time per word
	// admission: the tabs measure the deltas of admitted and queued runs
	// apart (deltaClass); scale sets it.
	admission bool
	// queueAllowance is how long a queued run may wait for a slot, beyond
	// runTimeout, before it counts as never started.
	queueAllowance time.Duration
}

func newGWEnv(base, auth, scenario string) *gwEnv {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 256, 64 // threads are created 8 at a time; each instance keeps a few
	return &gwEnv{
		base: base, bases: []string{base}, auth: auth, scenario: scenario, errs: newErrorLog(),
		http:    &http.Client{Transport: tr, Timeout: 30 * time.Second},
		dialSem: make(chan struct{}, 32), start: time.Now(),
	}
}

// Reconnection backoff of the tabs: a planned drop is reconnected at once,
// as the generator always did, and a server that refuses connections is
// not hammered.
const (
	reconnectMin = 10 * time.Millisecond
	reconnectMax = 2 * time.Second
)

// client is user's client of the instance at base: in -auth header mode
// the gateway believes X-Forwarded-User from 127.0.0.1.
func (e *gwEnv) client(base, user string) (*client.Client, error) {
	opts := []client.Option{client.WithHTTPClient(e.http), client.WithBackoff(reconnectMin, reconnectMax)}
	if e.auth == "header" {
		opts = append(opts, client.WithProxyUser("", user))
	}
	return client.New(base, opts...)
}

// tabInstance is the instance (index into bases) that tab k of thread idx
// connects to: a thread's tabs alternate over the instances, and so do
// the threads' tab 0 (the tab that starts runs).
func tabInstance(idx, k, instances int) int {
	if instances <= 1 {
		return 0
	}
	return (idx + k) % instances
}

// createThreads creates n threads over HTTP, one user per thread in header
// mode, a few requests at a time.
func (e *gwEnv) createThreads(ctx context.Context, n int) ([]*gwThread, error) {
	threads := make([]*gwThread, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	next := atomic.Int64{}
	for range min(n, 8) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				th := &gwThread{
					env:   e,
					idx:   i,
					user:  fmt.Sprintf("bench-%s-%d", e.scenario, i),
					notes: make(chan note, 256),
				}
				for _, base := range e.bases {
					c, err := e.client(base, th.user)
					if err != nil {
						fail(err)
						return
					}
					th.clients = append(th.clients, c)
				}
				snap, err := th.clients[0].CreateThread(ctx, fmt.Sprintf("bench %s %d", e.scenario, i))
				if err != nil {
					fail(err)
					return
				}
				th.id, th.version, th.createdSeq = snap.ThreadID, snap.StateVersion, snap.LastSeq
				threads[i] = th
			}
		})
	}
	wg.Wait()
	if first != nil {
		return nil, fmt.Errorf("create threads: %w", first)
	}
	return threads, nil
}

// lastSeq asks the server for a thread's last seq.
func (e *gwEnv) lastSeq(ctx context.Context, th *gwThread) (int64, error) {
	snap, err := th.clients[0].Thread(ctx, th.id)
	return snap.LastSeq, err
}

// gwThread is one conversation and the tabs that watch it. Its driver
// (one goroutine of the scenario) starts and cancels runs through its
// tabs; the tabs' readers tell it what happened through notes.
type gwThread struct {
	env        *gwEnv
	idx        int
	id, user   string
	clients    []*client.Client // the user's client of each instance (env.bases)
	version    int64            // the state_version the driver knows (driver-owned after setup)
	createdSeq int64
	tabs       []*gwTab
	notes      chan note

	// fan-out spread: when the first tab of this thread received a seq
	spreadMu sync.Mutex
	ring     [spreadRing]struct{ seq, at int64 }

	// counted by tab 0 while measuring
	deltasProduced atomic.Int64
	deltaBytes     atomic.Int64

	// queued holds the runs whose run.start ack carried a queue_position
	// (run ID → position): the driver stores, the tabs read.
	queued sync.Map
	// adm is what the driver measured of its runs' admission (driver-owned).
	adm admissionStats
}

// classOf is the class of runID's figures: queued when its ack carried a
// queue_position, else admitted.
func (th *gwThread) classOf(runID string) int {
	if _, ok := th.queued.Load(runID); ok {
		return classQueued
	}
	return classAdmitted
}

const spreadRing = 1024

// spread records that a tab received seq at (µs since env.start) and
// returns how long after the thread's first receipt of seq that was.
func (th *gwThread) spread(seq, at int64) int64 {
	return spreadOf(&th.spreadMu, &th.ring, seq, at)
}

func spreadOf(mu *sync.Mutex, ring *[spreadRing]struct{ seq, at int64 }, seq, at int64) int64 {
	mu.Lock()
	defer mu.Unlock()
	s := &ring[seq%spreadRing]
	if s.seq != seq {
		s.seq, s.at = seq, at
		return 0
	}
	return at - s.at
}

// note tells a thread's driver about an event one of its tabs received.
type note struct {
	tab          int
	typ          string // an event type, or noteFirstDelta
	runID        string
	stateVersion int64
	at           time.Time // when the tab's connection read it
}

const noteFirstDelta = "first-delta"

// gwTab is one browser tab watching one thread: a client.Conn with its
// TabID and one Subscription from the thread's last seq. Its goroutine
// (run) connects, subscribes and reads the Subscription until the
// scenario ends; the Conn reconnects and resumes by itself. A tab with a
// planned drop has its TCP connection cut once, as a lost network would.
// The driver sends commands on conn (set before ready is closed).
type gwTab struct {
	th    *gwThread
	k     int  // index among the thread's tabs; tab 0 is the driver's
	inst  int  // index of the instance it connects to (env.bases)
	notes bool // send run notes to the driver
	tabID string

	conn  *client.Conn
	ready chan struct{} // closed once subscribed

	netMu   sync.Mutex
	netConn net.Conn     // the first connection's TCP connection, until drop cuts it
	drops   atomic.Int64 // connections drop cut

	lastSeqA           atomic.Int64 // the seq of the last event read
	deliveries, deltas atomic.Int64 // events received
	replayed, resyncs  atomic.Int64 // events of a subscribe's catch-up; snapshots for a gap
	reconnects         atomic.Int64 // planned (drop), counted when the tab closes

	// owned by the tab's goroutine
	cancelled     map[string]bool
	lastDeltaRun  string
	lastDeltaAt   time.Time
	lat, spreadUs samples
	publishUs     samples
	paced         paceTracker   // when env.admission
	classes       [2]deltaClass // by classAdmitted, classQueued; when env.admission
}

func newGWTab(th *gwThread, k int) *gwTab {
	t := &gwTab{
		th:        th,
		k:         k,
		inst:      tabInstance(th.idx, k, len(th.env.bases)),
		tabID:     fmt.Sprintf("bench.%s.%d.%d", th.env.scenario, th.idx, k),
		ready:     make(chan struct{}),
		cancelled: map[string]bool{},
	}
	t.lastSeqA.Store(th.createdSeq)
	return t
}

// maxConnects bounds the attempts at a tab's first connection.
const maxConnects = 4

// run serves the tab until ctx ends.
func (t *gwTab) run(ctx context.Context) {
	e := t.th.env
	var sub *client.Subscription
	for attempt := 0; sub == nil; attempt++ {
		if attempt == maxConnects || ctx.Err() != nil {
			return
		}
		if attempt > 0 {
			sleep(ctx, 100*time.Millisecond) // a short pause before trying again, as a page would
		}
		var kind string
		var err error
		if sub, kind, err = t.open(ctx); err != nil && ctx.Err() == nil {
			e.errs.add(kind, fmt.Sprintf("tab %s: %v", t.tabID, err))
		}
	}
	defer t.close()
	close(t.ready)
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() == nil {
				e.errs.add(errorKind("subscription_ended", err), fmt.Sprintf("tab %s: %v", t.tabID, err))
			}
			return
		}
		t.handle(ev)
	}
}

// open connects the tab (hello with its TabID) and subscribes it after
// the thread's last seq; kind names a failure.
func (t *gwTab) open(ctx context.Context) (sub *client.Subscription, kind string, err error) {
	e := t.th.env
	select {
	case e.dialSem <- struct{}{}:
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
	dialCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	// The TCP connection of the handshake (new or reused) carries the
	// WebSocket: drop cuts it.
	dialCtx = httptrace.WithClientTrace(dialCtx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		t.netMu.Lock()
		t.netConn = i.Conn
		t.netMu.Unlock()
	}})
	conn, err := t.th.clients[t.inst].Connect(dialCtx, client.ConnOptions{TabID: t.tabID})
	cancel()
	<-e.dialSem
	if err != nil {
		return nil, errorKind("connect", err), err
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	sub, err = conn.Subscribe(sctx, t.th.id, t.th.createdSeq)
	if err != nil {
		conn.Close()
		return nil, errorKind("subscribe", err), err
	}
	t.conn = conn
	return sub, "", nil
}

// close closes the tab's Conn and reports what its client counted: every
// anomaly of the protocol is an error, and so is a reconnection the
// generator did not cause.
func (t *gwTab) close() {
	t.conn.Close()
	st := t.conn.Stats()
	e := t.th.env
	for _, c := range []struct {
		kind string
		n    int64
	}{
		{"seq_duplicate", st.Duplicates}, {"seq_gap", st.Jumps}, {"foreign_thread", st.Stray},
		{"bad_json", st.Malformed}, {"unexpected_answer", st.Unanswered}, {"event_before_subscribe_ack", st.Early},
		{"client_lagged", st.Lagged},
	} {
		if c.n > 0 {
			e.errs.addN(c.kind, int(c.n), fmt.Sprintf("tab %s: %s", t.tabID, st.LastAnomaly))
		}
	}
	planned := min(t.drops.Load(), st.Connects-1)
	t.reconnects.Store(planned)
	if n := st.Connects - 1 - planned; n > 0 {
		e.errs.addN(
			"reconnect_unexpected",
			int(n),
			fmt.Sprintf("tab %s: %d connections, %d drops", t.tabID, st.Connects, t.drops.Load()),
		)
	}
}

// errorKind names an error of op: op_<code> for the server's refusal.
func errorKind(op string, err error) string {
	if code := client.ErrorCode(err); code != "" {
		return op + "_" + code
	}
	return op
}

// drop cuts the tab's TCP connection, as a lost network would; its Conn
// reconnects and subscribes again after the last seq it received. It
// reports whether there was a connection to cut.
func (t *gwTab) drop() bool {
	t.netMu.Lock()
	defer t.netMu.Unlock()
	if t.netConn == nil {
		return false
	}
	t.netConn.Close()
	t.netConn = nil
	t.drops.Add(1)
	return true
}

// handle applies one event, at the time its frame was read.
func (t *gwTab) handle(ev client.Event) {
	e := t.th.env
	now := ev.Received
	t.lastSeqA.Store(ev.Seq)
	if ev.Type == chat.EventThreadSnapshot { // a gap the server could not replay
		t.resyncs.Add(1)
		return
	}
	t.deliveries.Add(1)
	if ev.RunID != "" && t.cancelled[ev.RunID] && ev.Type != chat.EventToolUpdated {
		e.errs.add(
			"event_after_run_cancelled",
			fmt.Sprintf("tab %s: %s seq %d of %s", t.tabID, ev.Type, ev.Seq, ev.RunID),
		)
	}
	live := !ev.Replayed
	if !live {
		t.replayed.Add(1)
	}
	switch ev.Type {
	case chat.EventMessageDelta:
		t.deltas.Add(1)
		var gap time.Duration
		var follows bool
		if e.admission {
			if live {
				gap, follows = t.paced.gap(ev.RunID, now)
			} else {
				t.paced = paceTracker{} // a replay's gaps say nothing of the pace
			}
		}
		if live && e.measuring.Load() {
			lat := now.UnixMicro() - ev.TS*1000
			t.lat.add(lat)
			if e.admission {
				t.classes[t.th.classOf(ev.RunID)].observe(lat, gap, follows, e.pace)
			}
			t.spreadUs.add(t.th.spread(ev.Seq, now.Sub(e.start).Microseconds()))
			if t.k == 0 {
				t.th.deltasProduced.Add(1)
				t.th.deltaBytes.Add(int64(len(ev.Raw)))
			}
		}
		if t.k == 0 {
			if ev.RunID != t.lastDeltaRun && t.notes {
				t.note(note{tab: t.k, typ: noteFirstDelta, runID: ev.RunID, at: now})
			}
			t.lastDeltaRun, t.lastDeltaAt = ev.RunID, now
		}
	case chat.EventMessagePublished:
		if t.k == 0 && ev.RunID != "" && ev.RunID == t.lastDeltaRun && !t.lastDeltaAt.IsZero() {
			if live && e.measuring.Load() {
				t.publishUs.add(now.Sub(t.lastDeltaAt).Microseconds())
			}
			t.lastDeltaAt = time.Time{}
		}
	case chat.EventRunCancelled:
		t.cancelled[ev.RunID] = true
		t.runNote(ev)
	case chat.EventRunFailed:
		e.errs.add("run_failed", fmt.Sprintf("%.300s", ev.Raw))
		t.runNote(ev)
	case chat.EventRunCompleted:
		t.runNote(ev)
	}
}

// runNote tells the driver that a run ended, if this tab reports to it.
func (t *gwTab) runNote(ev client.Event) {
	if t.notes {
		t.note(note{tab: t.k, typ: ev.Type, runID: ev.RunID, stateVersion: ev.StateVersion, at: ev.Received})
	}
}

func (t *gwTab) note(n note) {
	select {
	case t.th.notes <- n:
	default:
		t.th.env.errs.add("note_overflow", "")
	}
}

// commandTimeout bounds the wait for one command's answer.
const commandTimeout = 10 * time.Second

// commandFailed records a command about subject (a thread or a run) that
// got no answer (a timeout, the connection lost) or a refusal other than
// the allowed ones; nothing when ctx ended.
func (e *gwEnv) commandFailed(ctx context.Context, cmd, subject string, err error, allowed ...string) {
	var ce *client.Error
	switch {
	case errors.As(err, &ce):
		for _, code := range allowed {
			if ce.Code == code {
				return
			}
		}
		e.errs.add(cmd+"_"+ce.Code, fmt.Sprintf("%s: %s", subject, ce.Message))
	case ctx.Err() == nil:
		e.errs.add("command_failed", fmt.Sprintf("%s %s: %v", cmd, subject, err))
	}
}
