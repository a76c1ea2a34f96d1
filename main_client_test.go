// What the root tests send and read: the protocol client against a served
// gateway, its typed calls and refusals, an event stream with bounded
// waits, the CLI subcommands, and the database check at the end.

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// httpClient is for what the tests read raw: /readyz, /livez, /metrics,
// pages and requests whose subject is the wire itself.
var httpClient = &http.Client{Timeout: 15 * time.Second}

// apiTransport is the transport of the tests' protocol clients. It holds
// every successful answer under /api to the status docs/protocol.md gives its
// route (the client takes any 2xx as success; these tests always
// required the exact one: 201 for a created thread, a started run, a
// saved fragment and a fork, 202 for a cancel, 200 for the rest), and it
// adds header, headers the client has no option for (a __Host- session
// cookie over plain http, which a server with -secure-cookies names so).
type apiTransport struct {
	t      *testing.T
	header http.Header
}

func (a apiTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if len(a.header) > 0 {
		req = req.Clone(req.Context())
		for k, v := range a.header {
			req.Header[k] = v
		}
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && resp.StatusCode/100 == 2 && strings.HasPrefix(req.URL.Path, "/api/") {
		if want := apiStatus(req.Method, req.URL.Path); resp.StatusCode != want {
			a.t.Errorf("%s %s answered %d, want %d (docs/protocol.md)", req.Method, req.URL.Path, resp.StatusCode, want)
		}
	}
	return resp, err
}

// apiStatus is the status docs/protocol.md gives a successful answer of
// method path.
func apiStatus(method, path string) int {
	if method != http.MethodPost {
		return http.StatusOK
	}
	switch {
	case path == "/api/threads",
		strings.HasPrefix(path, "/api/threads/") && (strings.HasSuffix(path, "/runs") || strings.HasSuffix(path, "/fragments") || strings.HasSuffix(path, "/fork")):
		return http.StatusCreated
	case strings.HasPrefix(path, "/api/runs/") && strings.HasSuffix(path, "/cancel"):
		return http.StatusAccepted
	}
	return http.StatusOK
}

// newAPI is a protocol client of the gateway at base: each request
// bounded by timeout, its event streams and connections by their
// callers (no idle timer: a test may hold a stream it reads later),
// header added to every request (see apiTransport).
func newAPI(t *testing.T, base string, timeout time.Duration, header http.Header, opts ...client.Option) *client.Client {
	t.Helper()
	hc := &http.Client{Timeout: timeout, Transport: apiTransport{t: t, header: header}}
	c, err := client.New(base, append([]client.Option{client.WithHTTPClient(hc), client.WithIdleTimeout(-1)}, opts...)...)
	if err != nil {
		t.Fatalf("protocol client of %s: %v", base, err)
	}
	return c
}

// api is the server's protocol client, without credentials.
func (s *server) api() *client.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.apiClient == nil {
		s.apiClient = newAPI(s.t, s.base, 15*time.Second, nil)
	}
	return s.apiClient
}

// refusal is the server's refusal err holds (*client.Error), or nil: err
// is none, or no answer came.
func refusal(err error) *client.Error {
	var e *client.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// refusedStatus is the HTTP status of the server's refusal err holds (0:
// none).
func refusedStatus(err error) int {
	if e := refusal(err); e != nil {
		return e.Status
	}
	return 0
}

// answer is what call (a method of the server's protocol client) answers
// for arg; any error stops the test, saying what was asked.
func answer[A, T any](s *server, what string, call func(context.Context, A) (T, error), arg A) T {
	s.t.Helper()
	v, err := call(context.Background(), arg)
	if err != nil {
		s.t.Fatalf("%s: %v", what, err)
	}
	return v
}

func (s *server) snapshot(threadID string) chat.Snapshot {
	s.t.Helper()
	return answer(s, "GET /api/threads/"+threadID, s.api().Thread, threadID)
}

func (s *server) run(runID string) chat.Run {
	s.t.Helper()
	return answer(s, "GET /api/runs/"+runID, s.api().Run, runID)
}

func (s *server) createThread() chat.Snapshot {
	s.t.Helper()
	return s.newThread("")
}

// newThread creates a thread titled title ("": none).
func (s *server) newThread(title string) chat.Snapshot {
	s.t.Helper()
	snap := answer(s, "POST /api/threads", s.api().CreateThread, title)
	if !strings.HasPrefix(snap.ThreadID, "thr_") {
		s.t.Fatalf("new thread id %q does not start with thr_", snap.ThreadID)
	}
	if snap.StateVersion != 1 || snap.HeadCheckpointID == "" || len(snap.Messages) != 0 {
		s.t.Fatalf("new thread: state_version %d, head %q, %d messages; want 1, a checkpoint, none",
			snap.StateVersion, snap.HeadCheckpointID, len(snap.Messages))
	}
	return snap
}

// startRun starts a run with text at the thread's version expected (text
// "": continue from the saved point).
func (s *server) startRun(threadID string, expected int64, text string) chat.RunStartAck {
	s.t.Helper()
	return answer(s, "POST /api/threads/"+threadID+"/runs", s.api().StartRun,
		client.StartRunRequest{ThreadID: threadID, ExpectedStateVersion: expected, UserMessage: text})
}

// cancelRun requests a run's cancel (an empty body).
func (s *server) cancelRun(runID string) chat.CancelAck {
	s.t.Helper()
	return answer(s, "POST /api/runs/"+runID+"/cancel", s.api().CancelRun, client.CancelRunRequest{RunID: runID})
}

// threads is the first page of GET /api/threads.
func (s *server) threads() []chat.Thread {
	s.t.Helper()
	return answer(s, "GET /api/threads", s.api().ListThreads, client.ListThreadsOptions{}).Threads
}

// ---------------------------------------------------------------------------
// Server-Sent Events.

// stream is a thread's event stream (client.Stream), read by the test
// goroutine with next/waitFor, which also require that the stream needed
// no repair (one connection; no duplicate, no gap, no event of another
// thread, no SSE id or event line that disagrees with its data: the
// client's Stats) and keep the text of each streamed message.
type stream struct {
	t         *testing.T
	threadID  string
	es        *client.Stream
	anomalies int64 // of es.Stats reported so far

	lastSeq int64
	deltas  map[string]*strings.Builder // message id -> concatenated delta text
	seen    []client.Event
	// afterCrash: the stream resumes from a position seen before the
	// server was killed, so its first event may be a thread.snapshot
	// standing for a gap (Event.Gap: the deltas in memory at the kill
	// are lost, and recorded lost).
	afterCrash bool
}

func (s *server) events(threadID string, after int64) *stream {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	es, err := s.api().Events(ctx, threadID, after)
	if err != nil {
		s.t.Fatalf("open the event stream of %s: %v", threadID, err)
	}
	st := &stream{t: s.t, threadID: threadID, es: es, lastSeq: after, deltas: map[string]*strings.Builder{}}
	s.t.Cleanup(st.close)
	return st
}

// eventsAfterCrash is events for a position a tab saw before the server
// was killed: the stream may start with a snapshot (see stream.afterCrash).
func (s *server) eventsAfterCrash(threadID string, after int64) *stream {
	s.t.Helper()
	st := s.events(threadID, after)
	st.afterCrash = true
	return st
}

func (st *stream) close() { st.es.Close() }

// next returns the next event, failing the test at the deadline or when
// the stream ends (or was cut and resumed).
func (st *stream) next(deadline time.Time, what string) client.Event {
	st.t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	ev, err := st.es.Next(ctx)
	cancel()
	stats := st.es.Stats()
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		st.t.Fatalf("timed out waiting for %s on thread %s; last seq %d; last events:\n%s", what, st.threadID, st.lastSeq, st.tail(8))
	case err != nil:
		st.t.Fatalf("event stream of %s ended (%v) while waiting for %s; last seq %d", st.threadID, err, what, st.lastSeq)
	case stats.Connects != 1:
		st.t.Fatalf("event stream of %s ended and was resumed (%d connections) while waiting for %s; last seq %d", st.threadID, stats.Connects, what, st.lastSeq)
	}
	if n := stats.Malformed + stats.Duplicates + stats.Jumps + stats.Stray; n > st.anomalies {
		st.anomalies = n
		st.t.Errorf("event stream of %s: %d SSE events whose id or event line disagrees with the data (or unreadable), %d duplicates, %d gaps, %d events of another thread; the last: %s",
			st.threadID, stats.Malformed, stats.Duplicates, stats.Jumps, stats.Stray, stats.LastAnomaly)
	}
	if ev.Gap != nil {
		if !st.afterCrash || len(st.seen) > 0 {
			st.t.Fatalf("event stream of %s answered after_seq=%d with a thread.snapshot, but every event after it should still be held: %s",
				st.threadID, ev.Gap.After, ev.Raw)
		}
		// Seqs never repeat across a crash: the snapshot ends past
		// everything the tab saw before it.
		if ev.Gap.Through <= ev.Gap.After {
			st.t.Fatalf("after the crash, event stream of %s resynced with a snapshot at seq %d, not past seq %d seen before it: %s", st.threadID, ev.Gap.Through, ev.Gap.After, ev.Raw)
		}
		st.deltas = map[string]*strings.Builder{}
		if a := ev.Snapshot().ActiveRun; a != nil && a.MessageID != nil {
			b := &strings.Builder{}
			b.WriteString(a.PartialText)
			st.deltas[*a.MessageID] = b
		}
	}
	st.lastSeq = ev.Seq
	if d := ev.Delta(); d != nil {
		b := st.deltas[d.MessageID]
		if b == nil {
			b = &strings.Builder{}
			st.deltas[d.MessageID] = b
		}
		b.WriteString(d.Text)
	}
	st.seen = append(st.seen, ev)
	return ev
}

// waitFor consumes events until one matches.
func (st *stream) waitFor(deadline time.Time, what string, match func(client.Event) bool) client.Event {
	st.t.Helper()
	for {
		if ev := st.next(deadline, what); match(ev) {
			return ev
		}
	}
}

func (st *stream) text(messageID string) string {
	if b := st.deltas[messageID]; b != nil {
		return b.String()
	}
	return ""
}

func (st *stream) tail(n int) string {
	from := max(0, len(st.seen)-n)
	var b strings.Builder
	for _, ev := range st.seen[from:] {
		raw := string(ev.Raw)
		if len(raw) > 300 {
			raw = raw[:300] + "…"
		}
		b.WriteString("  " + raw + "\n")
	}
	return b.String()
}

// waitDeltas waits until n message.delta events of runID arrived and
// returns the message id they stream.
func (st *stream) waitDeltas(deadline time.Time, runID string, n int) string {
	st.t.Helper()
	messageID := ""
	for got := 0; got < n; {
		ev := st.next(deadline, fmt.Sprintf("%d deltas of run %s", n, runID))
		if ev.RunID != runID {
			continue
		}
		switch ev.Type {
		case chat.EventMessageDelta:
			if d := ev.Delta(); messageID != "" && d.MessageID != messageID {
				st.t.Fatalf("deltas of run %s switched message from %s to %s", runID, messageID, d.MessageID)
			}
			messageID = ev.Delta().MessageID
			got++
		case chat.EventRunCompleted, chat.EventRunFailed, chat.EventRunCancelled, chat.EventMessagePublished:
			st.t.Fatalf("run %s reached %s after only %d deltas (wanted %d first): raise the demo pace", runID, ev.Type, got, n)
		}
	}
	if !strings.HasPrefix(messageID, "msg_") {
		st.t.Fatalf("delta message_id %q does not start with msg_", messageID)
	}
	return messageID
}

// isEnd reports whether ev ends run runID (completed, failed, cancelled).
func isEnd(runID string) func(client.Event) bool {
	return func(ev client.Event) bool {
		return ev.RunID == runID && (ev.Type == chat.EventRunCompleted || ev.Type == chat.EventRunFailed || ev.Type == chat.EventRunCancelled)
	}
}

// ---------------------------------------------------------------------------
// The CLI.

// runCLI runs the binary to completion (bounded) and returns its exit code
// and output.
func runCLI(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCLIWith(t, env, "", args...)
}

// runCLIWith is runCLI with input on stdin (a password line for user
// add/passwd).
func runCLIWith(t *testing.T, env []string, input string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, gatewayBinary(t), args...)
	cmd.Env = childEnv(env...)
	cmd.Stdin = strings.NewReader(input)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("gateway %s did not exit within 30s (stdout %q, stderr %q)", strings.Join(args, " "), out.String(), errb.String())
	}
	noRace(t, "gateway "+strings.Join(args, " "), errb.String())
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("gateway %s: %v", strings.Join(args, " "), err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// checkDB runs `gateway check -db path` and requires exit 0 and "ok".
func checkDB(t *testing.T, db string) {
	t.Helper()
	code, out, errOut := runCLI(t, nil, "check", "-db", db)
	if code != 0 || !strings.HasPrefix(out, "ok") {
		t.Fatalf("gateway check -db %s: exit %d, want 0 and \"ok\"\nstdout:\n%s\nstderr:\n%s", db, code, out, errOut)
	}
}

// refusedStart is a serve configuration (its flags come after -addr
// 127.0.0.1:0 -db DB) that must not start, and what the refusal says.
type refusedStart struct {
	args []string
	want string
}

// wantStartsRefused requires that each configuration exits 2 saying its
// want (and never the password "secret" of a URL it was given), and that
// none of them created the database db.
func wantStartsRefused(t *testing.T, db string, starts []refusedStart) {
	t.Helper()
	for _, tc := range starts {
		args := append([]string{"-addr", "127.0.0.1:0", "-db", db}, tc.args...)
		code, _, errOut := runCLI(t, nil, args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "secret") {
			t.Errorf("gateway %s: exit %d, stderr %q; want exit 2 saying %q (and never the password)", strings.Join(args, " "), code, errOut, tc.want)
		}
	}
	if exists(db) {
		t.Errorf("a refused configuration still created the database %s", db)
	}
}

// ---------------------------------------------------------------------------
// Test 2: crash recovery.
