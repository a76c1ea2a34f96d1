package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

// Every goroutine the client starts is owned and waited for: none may be
// left once the tests closed their clients and gateways.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitLimit bounds every wait of these tests.
const waitLimit = 30 * time.Second

// serve runs a gateway on a fresh SQLite file until stop is called (at
// the latest when the test ends) and returns its base URL.
func serve(t *testing.T) (base string, stop func()) {
	t.Helper()
	return apptest.Serve(t, apptest.Config(filepath.Join(t.TempDir(), "gateway.db")))
}

// newClient is client.New that fails the test on error and closes the
// newClient is a protocol client of the gateway at base, closed when the
// test ends.
func newClient(t *testing.T, base string, opts ...client.Option) *client.Client {
	t.Helper()
	return apptest.Client(t, base, opts...)
}

// bounded is a context that ends after waitLimit.
func bounded(t *testing.T) context.Context { return apptest.Bounded(t, waitLimit) }

func connect(t *testing.T, c *client.Client, tab string) *client.Conn {
	t.Helper()
	conn, err := c.Connect(bounded(t), client.ConnOptions{TabID: tab})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// newThread serves a gateway (see serve) and returns a client of it (opts
// as newClient takes them) and a new thread titled title.
func newThread(t *testing.T, title string, opts ...client.Option) (*client.Client, chat.Snapshot) {
	t.Helper()
	base, _ := serve(t)
	c := newClient(t, base, opts...)
	return c, createThread(t, c, title)
}

// subscribe is conn.Subscribe that fails the test on error.
func subscribe(t *testing.T, conn *client.Conn, thread string, after int64) *client.Subscription {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	sub, err := conn.Subscribe(ctx, thread, after)
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// events is c.Events that fails the test on error; the stream is closed
// when the test ends.
func events(t *testing.T, c *client.Client, thread string, after int64) *client.Stream {
	t.Helper()
	stream, err := c.Events(bounded(t), thread, after)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stream.Close() })
	return stream
}

// startRun starts a run with message on th, at th's state_version, over
// cmd; an error fails the test.
func startRun(t *testing.T, cmd client.Commander, th chat.Snapshot, message string) chat.RunStartAck {
	t.Helper()
	run, err := cmd.StartRun(bounded(t), client.StartRunRequest{ThreadID: th.ThreadID, ExpectedStateVersion: th.StateVersion, UserMessage: message})
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// wantSeqsThenDeleted requires src to deliver seqs 1 to last, each once
// and in order, then to end with ErrThreadDeleted.
func wantSeqsThenDeleted(t *testing.T, src source, last int64) {
	t.Helper()
	for want := int64(1); want <= last; want++ {
		ev, err := src.Next(bounded(t))
		if err != nil || ev.Seq != want {
			t.Fatalf("event %v, %v; want seq %d", ev, err, want)
		}
	}
	if _, err := src.Next(bounded(t)); !errors.Is(err, client.ErrThreadDeleted) {
		t.Fatalf("after thread.deleted: %v", err)
	}
}

func createThread(t *testing.T, c *client.Client, title string) chat.Snapshot {
	t.Helper()
	th, err := c.CreateThread(bounded(t), title)
	if err != nil {
		t.Fatalf("create thread: %v", err)
	}
	if !strings.HasPrefix(th.ThreadID, chat.PrefixThread) || th.StateVersion != 1 || th.HeadCheckpointID == "" {
		t.Fatalf("new thread %+v: want thr_…, state_version 1, a head", th)
	}
	return th
}

// cutter is an HTTP client whose connections the test can cut, as a
// failing network would: the client's event streams and WebSockets go
// through it.
type cutter struct {
	mu    sync.Mutex
	conns []net.Conn
	tr    *http.Transport
}

func newCutter(t *testing.T) *cutter {
	k := &cutter{}
	k.tr = &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			k.mu.Lock()
			k.conns = append(k.conns, c)
			k.mu.Unlock()
		}
		return c, err
	}}
	t.Cleanup(k.tr.CloseIdleConnections)
	return k
}

func (k *cutter) client() *http.Client { return &http.Client{Transport: k.tr} }

// cut closes every connection made so far and reports how many.
func (k *cutter) cut() int {
	k.mu.Lock()
	conns := k.conns
	k.conns = nil
	k.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return len(conns)
}

// source is what the tests read events from: a Subscription or a Stream.
type source interface {
	Next(ctx context.Context) (client.Event, error)
}

// reader reads one thread's events and checks what the client promises:
// the thread's events only, each seq once and in order (a snapshot starts
// over), state_version +1 on every durable event, and a published
// message equal to its deltas.
type reader struct {
	t       *testing.T
	src     source
	thread  string
	last    int64 // -1 until known
	version int64 // -1 until known
	events  []client.Event
	deltas  map[string]*strings.Builder
	started map[string]bool
}

func newReader(t *testing.T, src source, thread string, after int64) *reader {
	r := &reader{t: t, src: src, thread: thread, last: after, version: -1,
		deltas: map[string]*strings.Builder{}, started: map[string]bool{}}
	if after == 0 {
		r.version = 0
	}
	return r
}

// next returns the next event, failing the test after waitLimit.
func (r *reader) next() client.Event {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ev, err := r.src.Next(ctx)
	if err != nil {
		r.t.Fatalf("next event of %s after seq %d: %v", r.thread, r.last, err)
	}
	r.check(ev)
	return ev
}

func (r *reader) check(ev client.Event) {
	t := r.t
	t.Helper()
	r.events = append(r.events, ev)
	if ev.ThreadID != r.thread {
		t.Fatalf("event %v of thread %s, want %s", ev, ev.ThreadID, r.thread)
	}
	if ev.Type == chat.EventThreadSnapshot {
		snap := ev.Snapshot()
		if snap == nil || snap.LastSeq != ev.Seq {
			t.Fatalf("snapshot %s: want its last_seq as its seq", ev.Raw)
		}
		r.last, r.version = ev.Seq, snap.StateVersion
		r.deltas = map[string]*strings.Builder{}
		return
	}
	if ev.Gap != nil {
		t.Fatalf("event %v has a Gap: only snapshots do", ev)
	}
	if r.last >= 0 && ev.Seq != r.last+1 {
		t.Fatalf("event %v after seq %d: a gap or a duplicate", ev, r.last)
	}
	r.last = ev.Seq
	if ev.Durable() {
		if r.version >= 0 && ev.StateVersion != r.version+1 {
			t.Fatalf("durable event %v has state_version %d after %d", ev, ev.StateVersion, r.version)
		}
		r.version = ev.StateVersion
	}
	switch ev.Type {
	case chat.EventRunStarted:
		r.started[ev.RunID] = true
	case chat.EventMessageDelta:
		d := ev.Delta()
		b := r.deltas[d.MessageID]
		if b == nil {
			b = &strings.Builder{}
			r.deltas[d.MessageID] = b
		}
		b.WriteString(d.Text)
	case chat.EventMessagePublished:
		m := ev.Published().Message
		if m.Kind != chat.KindFragment && m.Role == chat.RoleAssistant && m.RunID != nil && r.started[*m.RunID] {
			if got := r.text(m.MessageID); got != m.Content {
				t.Fatalf("published %s is %q; its deltas were %q", m.MessageID, m.Content, got)
			}
		}
	}
}

func (r *reader) text(messageID string) string {
	if b := r.deltas[messageID]; b != nil {
		return b.String()
	}
	return ""
}

// until reads up to the first event for which match holds.
func (r *reader) until(what string, match func(client.Event) bool) client.Event {
	r.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for time.Now().Before(deadline) {
		if ev := r.next(); match(ev) {
			return ev
		}
	}
	r.t.Fatalf("no %s within %v", what, waitLimit)
	return client.Event{}
}

// runEvent reads up to the event of type typ of run runID; an end of the
// run other than the one waited for fails the test.
func (r *reader) runEvent(typ, runID string) client.Event {
	r.t.Helper()
	return r.until(typ+" of "+runID, func(ev client.Event) bool {
		if ev.RunID != runID {
			return false
		}
		switch ev.Type {
		case typ:
			return true
		case chat.EventRunCompleted, chat.EventRunFailed, chat.EventRunCancelled:
			r.t.Fatalf("run %s ended %s (%s) while waiting for %s", runID, ev.Type, ev.Raw, typ)
		}
		return false
	})
}

// deltasOf reads until n deltas of the run came (counting from now) and
// returns the message they stream and the seq of the last.
func (r *reader) deltasOf(runID string, n int) (messageID string, lastSeq int64) {
	r.t.Helper()
	for i := 0; i < n; i++ {
		ev := r.runEvent(chat.EventMessageDelta, runID)
		messageID, lastSeq = ev.Delta().MessageID, ev.Seq
	}
	return messageID, lastSeq
}

// wantError requires err to be an *Error with code and status.
func wantError(t *testing.T, err error, code string, status int) *client.Error {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want a *client.Error %s", err, err, code)
	}
	if e.Code != code || e.Status != status || client.ErrorCode(err) != code || e.Message == "" {
		t.Fatalf("error %+v, want %s with status %d and a message", e, code, status)
	}
	return e
}

// wantClean requires a Conn's or Stream's stats to show no anomaly.
func wantClean(t *testing.T, st client.Stats) {
	t.Helper()
	if st.Duplicates+st.Jumps+st.Stray+st.Unanswered+st.Malformed+st.Lagged+st.Early != 0 {
		t.Fatalf("stats %+v: the server sent something out of protocol", st)
	}
}

const longRequest = "Compare desk lamps for reading: light colour, glare, brightness and price, step by step"
