package main

// End-to-end tests against the real binary: build it once, start it on a
// free port with a temporary database, and drive it the way a program
// using the API would: through package client, the protocol's Go client
// (typed HTTP, Server-Sent Events, WebSocket). Tests whose subject is the
// wire itself (status lines, headers, raw bodies, malformed requests,
// close codes, pages, the CLI, /livez, /readyz, /metrics) read it raw and
// say so. Every wait is bounded by a deadline, so a bug fails the test
// instead of hanging it.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// ---------------------------------------------------------------------------
// Building the binary once.

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// gatewayBinary builds the binary on first use, with the race detector: the
// scenarios that need a process boundary (kill, signal, restart, crash,
// several instances) run the server under -race too, and a race it
// reports fails the test that ran it (raceReport).
func gatewayBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "gateway-e2e-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "gateway")
		cmd := exec.Command("go", "build", "-race", "-o", binPath, ".")
		out, err := cmd.CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatalf("cannot build the gateway binary: %v", binErr)
	}
	return binPath
}

// childEnv is the test's environment without any GATEWAY_* variable, so the
// flags the tests pass are what the binary uses; extra is appended. The
// race detector reports every race and goes on (the test fails on the
// report, see raceReport; the process then exits 66, not 0).
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GATEWAY_") && !strings.HasPrefix(kv, "GORACE=") {
			env = append(env, kv)
		}
	}
	return append(append(env, "GORACE=halt_on_error=0"), extra...)
}

// raceMark starts a race detector report on the binary's stderr.
const raceMark = "WARNING: DATA RACE"

// noRace fails the test when a process's stderr holds a race detector
// report.
func noRace(t *testing.T, what, stderr string) {
	t.Helper()
	if i := strings.Index(stderr, raceMark); i >= 0 {
		t.Errorf("%s reported a data race:\n%s", what, stderr[i:])
	}
}

// ---------------------------------------------------------------------------
// Running the server.

var servingLine = regexp.MustCompile(`msg="gateway serving" addr=(http://127\.0\.0\.1:\d+)`)

type server struct {
	t    *testing.T
	db   string
	cmd  *exec.Cmd // nil: the server runs in the test's process
	base string
	// In the test's process: cancel ends serving (as SIGTERM does), code
	// is serveWith's exit code once exited is closed.
	cancel context.CancelFunc
	code   int

	mu    sync.Mutex
	logs  []string       // the last lines of stderr, for failure reports
	msgs  map[string]int // msg="…" of every stderr line -> how many lines said it
	races []string       // the lines of every race detector report, whole

	apiClient *client.Client // see api

	exited  chan struct{} // closed once the process was waited for
	waitErr error
}

const keepLogLines = 300

// startServer serves the gateway in the test's process (serveWith: the
// serve subcommand, flags parsed as the binary parses them) on a free port
// with db and demo pace, waits until it logs its address and answers
// /readyz 200, and stops it when the test ends (whatever happened). A
// test whose subject needs a process boundary (a kill, a signal, a frozen
// process, a restart after a crash, the process's environment or exit)
// uses startProcess: the binary, built with -race.
func startServer(t *testing.T, db, pace string) *server {
	t.Helper()
	return startServerWith(t, db, pace)
}

// startServerWith is startServer with extra flags (e.g. "-auth",
// "password").
func startServerWith(t *testing.T, db, pace string, flags ...string) *server {
	t.Helper()
	s := &server{t: t, db: db, exited: make(chan struct{}), msgs: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	logsR, logsW := io.Pipe()
	addr := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		s.readLogs(logsR, addr)
		close(done)
	}()
	go func() {
		s.code = serveWith(ctx, append([]string{"-addr", "127.0.0.1:0", "-db", db, "-demo-pace", pace}, flags...), logsW, nil)
		logsW.Close()
		<-done
		close(s.exited)
	}()
	s.started(addr)
	return s
}

// startProcess runs the binary (built with -race) on a free port with db
// and demo pace, as startServer does, and kills it when the test ends.
func startProcess(t *testing.T, db, pace string, flags ...string) *server {
	t.Helper()
	return startServerEnv(t, nil, db, pace, flags...)
}

// startServerEnv is startServerWith with extra environment variables
// (NAME=value) for the binary.
func startServerEnv(t *testing.T, env []string, db, pace string, flags ...string) *server {
	t.Helper()
	return startBinary(t, gatewayBinary(t), env, db, pace, flags...)
}

func startBinary(t *testing.T, bin string, env []string, db, pace string, flags ...string) *server {
	t.Helper()
	s := &server{t: t, db: db, exited: make(chan struct{}), msgs: map[string]int{}}
	s.cmd = exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-db", db, "-demo-pace", pace}, flags...)...)
	s.cmd.Env = childEnv(env...)
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatalf("stderr pipe: %v", err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	addr := make(chan string, 1)
	go func() {
		// Keep reading after the address line so the pipe never blocks the
		// server; Wait only after the last read, as os/exec requires.
		s.readLogs(stderr, addr)
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	s.started(addr)
	return s
}

// readLogs reads the server's log lines until r ends: kept for failure
// reports, counted by msg, race reports collected, and the address sent
// on addr once it is logged.
func (s *server) readLogs(r io.Reader, addr chan<- string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sent := false
	inRace := false
	for sc.Scan() {
		line := sc.Text()
		s.mu.Lock()
		switch {
		case strings.Contains(line, raceMark):
			inRace = true
			s.races = append(s.races, line)
		case inRace:
			s.races = append(s.races, line)
			inRace = !strings.HasPrefix(line, "==================") // the report's end
		}
		s.logs = append(s.logs, line)
		if len(s.logs) > keepLogLines {
			s.logs = s.logs[len(s.logs)-keepLogLines:]
		}
		if _, rest, ok := strings.Cut(line, ` msg="`); ok {
			if msg, _, ok := strings.Cut(rest, `"`); ok {
				s.msgs[msg]++
			}
		}
		s.mu.Unlock()
		if m := servingLine.FindStringSubmatch(line); m != nil && !sent {
			addr <- m[1]
			sent = true
		}
	}
	io.Copy(io.Discard, r)
}

// started registers the server's end at the test's end and waits until
// it serves (its address on addr) and is ready.
func (s *server) started(addr <-chan string) {
	t := s.t
	t.Helper()
	t.Cleanup(func() {
		s.end()
		s.mu.Lock()
		races := strings.Join(s.races, "\n")
		s.mu.Unlock()
		if races != "" {
			t.Errorf("the gateway (db %s) reported a data race:\n%s", s.db, races)
		}
		if t.Failed() {
			t.Logf("server stderr (db %s), last lines:\n%s", s.db, s.stderr())
		}
	})
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	select {
	case s.base = <-addr:
	case <-s.exited:
		t.Fatalf("gateway exited before serving (%s); log:\n%s", s.exitReport(), s.stderr())
	case <-deadline.C:
		t.Fatalf("gateway did not log %q within 30s; log:\n%s", "gateway serving", s.stderr())
	}
	s.waitReady()
}

// exitReport says how the server ended (once exited is closed).
func (s *server) exitReport() string {
	if s.cmd == nil {
		return fmt.Sprintf("serve returned %d", s.code)
	}
	return fmt.Sprint(s.waitErr)
}

// needProcess fails a test that asks a server in its own process for what
// only a process can do.
func (s *server) needProcess(what string) {
	s.t.Helper()
	if s.cmd == nil {
		s.t.Fatalf("%s needs the gateway in a process of its own: start it with startProcess", what)
	}
}

// end stops the server whatever state it is in: a process is killed, a
// server in the test's process is cancelled and waited for.
func (s *server) end() {
	if s.cmd != nil {
		s.kill()
		return
	}
	s.cancel()
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.t.Errorf("the in-process gateway (db %s) did not stop within 20s", s.db)
	}
}

func (s *server) stderr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.logs, "\n")
}

// logged counts the stderr lines so far whose msg is exactly msg (all of
// them, not only the last lines kept for failure reports).
func (s *server) logged(msg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.msgs[msg]
}

func (s *server) waitReady() {
	s.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		resp, err := httpClient.Get(s.base + "/readyz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("GET /readyz never answered 200 within 15s (last: %s)", last)
		}
		select {
		case <-tick.C:
		case <-s.exited:
			s.t.Fatalf("gateway exited while waiting for /readyz (%s)", s.exitReport())
		}
	}
}

// kill sends SIGKILL (if the process still runs) and waits for it.
func (s *server) kill() {
	s.needProcess("kill")
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		s.t.Errorf("gateway pid %d did not exit 15s after SIGKILL", s.cmd.Process.Pid)
	}
}

// freeze stops the process where it is (SIGSTOP: a pause, an overloaded
// machine, a VM migrated): it holds its sockets, answers nothing and runs
// nothing until thaw. SIGKILL (kill, at cleanup) still ends it; a SIGCONT
// is sent at cleanup anyway, before that kill, so nothing waits on a
// stopped process.
func (s *server) freeze() {
	s.t.Helper()
	s.needProcess("freeze")
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("SIGSTOP gateway pid %d: %v", s.cmd.Process.Pid, err)
	}
	s.t.Cleanup(func() { _ = s.cmd.Process.Signal(syscall.SIGCONT) })
	// kill(2) returns once the signal is queued; each thread stops when the
	// kernel next runs it. Return only when every thread is stopped, so
	// that what the test counts as after the freeze really is.
	deadline := time.Now().Add(5 * time.Second)
	for !allThreadsStopped(s.cmd.Process.Pid) {
		if time.Now().After(deadline) {
			s.t.Fatalf("gateway pid %d: not every thread stopped 5s after SIGSTOP", s.cmd.Process.Pid)
		}
		time.Sleep(time.Millisecond) // polling the kernel's view of the threads, bounded by the deadline
	}
}

// allThreadsStopped reports whether every thread of process pid is in
// the stopped state (T in /proc/PID/task/TID/stat).
func allThreadsStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// pid (comm) state …: the state follows the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || (stat[i+2] != 'T' && stat[i+2] != 't') {
			return false
		}
	}
	return true
}

// thaw lets a frozen process go on (SIGCONT).
func (s *server) thaw() {
	s.t.Helper()
	s.needProcess("thaw")
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatalf("SIGCONT gateway pid %d: %v", s.cmd.Process.Pid, err)
	}
}

// waitExit waits (bounded) for the process to end on its own and returns
// its exit code.
func (s *server) waitExit(timeout time.Duration) int {
	s.t.Helper()
	if s.cmd == nil {
		select {
		case <-s.exited:
		case <-time.After(timeout):
			s.t.Fatalf("the in-process gateway still serves %v later, want it to have ended", timeout)
		}
		return s.code
	}
	select {
	case <-s.exited:
	case <-time.After(timeout):
		s.t.Fatalf("gateway pid %d still runs %v later, want it to have exited", s.cmd.Process.Pid, timeout)
	}
	return s.cmd.ProcessState.ExitCode()
}

// stop asks for a graceful shutdown (SIGTERM; in the test's process, the
// end of serve's context, as SIGTERM ends it) and expects exit status 0.
func (s *server) stop() {
	s.t.Helper()
	if s.cmd == nil {
		s.cancel()
		select {
		case <-s.exited:
		case <-time.After(20 * time.Second):
			s.t.Fatalf("gateway did not stop within 20s of the end of its context")
		}
		if s.code != 0 {
			s.t.Fatalf("serve returned %d after the end of its context, want 0", s.code)
		}
		return
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		s.t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.t.Fatalf("gateway did not stop within 20s of SIGTERM")
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		s.t.Fatalf("gateway exited %d after SIGTERM (%v), want 0", code, s.waitErr)
	}
}

// ---------------------------------------------------------------------------
// The protocol client.

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

func TestBinaryCrashRecovery(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	const pace = "50ms"
	srv := startProcess(t, db, pace)
	tid := srv.createThread().ThreadID

	var runs []string
	// Kill at different moments of the stream: right after the first
	// delta, a little later, well into the reply.
	for i, killAfter := range []int{1, 6, 15} {
		snap := srv.snapshot(tid)
		if want := 2 * i; len(snap.Messages) != want {
			t.Fatalf("round %d: history has %d messages, want %d", i, len(snap.Messages), want)
		}
		evs := srv.events(tid, snap.LastSeq)
		started := srv.startRun(tid, snap.StateVersion, fmt.Sprintf("Round %d: describe durable checkpoints, leases and recovery after crashes", i+1))
		runID := started.RunID
		runs = append(runs, runID)

		lost := evs.waitDeltas(time.Now().Add(20*time.Second), runID, killAfter)
		seenSeq := evs.lastSeq
		partial := evs.text(lost)

		srv.kill()
		evs.close()
		checkDB(t, db) // the invariants hold even mid-run

		srv = startProcess(t, db, pace)
		evs = srv.eventsAfterCrash(tid, seenSeq)
		var published *chat.Message
		evs.waitFor(time.Now().Add(30*time.Second), fmt.Sprintf("run.completed of run %s after the restart", runID), func(ev client.Event) bool {
			if ev.RunID == runID {
				switch ev.Type {
				case chat.EventMessagePublished:
					if published != nil {
						t.Errorf("run %s published twice: %s and %s", runID, published.MessageID, ev.Published().Message.MessageID)
					}
					published = &ev.Published().Message
				case chat.EventRunFailed, chat.EventRunCancelled:
					t.Fatalf("round %d: run %s ended %s after the restart: %s", i, runID, ev.Type, ev.Raw)
				}
			}
			return ev.Type == chat.EventRunCompleted && ev.RunID == runID
		})
		if published == nil {
			t.Fatalf("round %d: run %s completed without message.published", i, runID)
		}
		if published.MessageID == lost {
			t.Fatalf("round %d: the interrupted message %s was published after the restart", i, lost)
		}
		if got := evs.text(published.MessageID); got != published.Content || got == "" {
			t.Errorf("round %d: published content is not the concatenation of its deltas:\ncontent: %q\ndeltas:  %q", i, published.Content, got)
		}
		if n := len(strings.Fields(published.Content)); n < 40 {
			t.Errorf("round %d: the published reply has %d words, want a full reply: %q", i, n, published.Content)
		}
		if r := srv.run(runID); r.Status != "completed" || r.Attempt != 2 {
			t.Errorf("round %d: GET /api/runs/%s = %+v, want completed at attempt 2", i, runID, r)
		}

		snap = srv.snapshot(tid)
		if want := 2 * (i + 1); len(snap.Messages) != want {
			t.Fatalf("round %d: history has %d messages after recovery, want %d: %+v", i, len(snap.Messages), want, snap.Messages)
		}
		var ofRun []chat.Message
		for _, m := range snap.Messages {
			if m.MessageID == lost {
				t.Errorf("round %d: history holds the interrupted message %s (%q)", i, lost, m.Content)
			}
			if m.Role == "assistant" && m.RunID != nil && *m.RunID == runID {
				ofRun = append(ofRun, m)
			}
		}
		if len(ofRun) != 1 || ofRun[0].MessageID != published.MessageID || ofRun[0].Content != published.Content {
			t.Fatalf("round %d: history has %d assistant messages of run %s (%+v), want exactly the published %s",
				i, len(ofRun), runID, ofRun, published.MessageID)
		}
		if last := snap.Messages[len(snap.Messages)-1]; last.MessageID != published.MessageID {
			t.Errorf("round %d: the last history message is %s, want %s", i, last.MessageID, published.MessageID)
		}
		for _, m := range snap.Messages {
			if m.Content == partial {
				t.Errorf("round %d: history message %s holds exactly the interrupted text %q", i, m.MessageID, partial)
			}
		}
		if snap.ActiveRun != nil {
			t.Errorf("round %d: active_run after run.completed: %+v", i, snap.ActiveRun)
		}
		evs.close()
	}

	for _, id := range runs {
		if r := srv.run(id); r.Status != "completed" {
			t.Errorf("run %s is %s after recovery, want completed", id, r.Status)
		}
	}
	srv.stop()
	checkDB(t, db)
}

// ---------------------------------------------------------------------------
// Test 3: the command line.

func TestCLIErrors(t *testing.T) {
	dir := t.TempDir()

	t.Run("check missing database", func(t *testing.T) {
		missing := filepath.Join(dir, "missing.db")
		code, out, errOut := runCLI(t, nil, "check", "-db", missing)
		if code != 2 || !strings.Contains(errOut, missing) {
			t.Errorf("check -db %s: exit %d, stderr %q, stdout %q; want exit 2 and a message naming the path", missing, code, errOut, out)
		}
		if _, err := os.Stat(missing); err == nil {
			t.Errorf("check created %s", missing)
		}
	})

	t.Run("no accounts on a non-loopback address", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "gw.db")
		for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
			code, _, errOut := runCLI(t, nil, "-addr", addr, "-db", db)
			if code != 2 || !strings.Contains(errOut, "not a loopback address") || !strings.Contains(errOut, "-insecure-remote") {
				t.Errorf("-addr %s: exit %d, stderr %q; want exit 2 naming the way out", addr, code, errOut)
			}
		}
		if _, err := os.Stat(db); err == nil {
			t.Error("a refused start created the database")
		}
	})

	t.Run("unknown command", func(t *testing.T) {
		code, out, errOut := runCLI(t, nil, "bogus")
		if code != 2 || !strings.Contains(errOut, "bogus") || !strings.Contains(errOut, "Usage") {
			t.Errorf("gateway bogus: exit %d, stderr %q, stdout %q; want exit 2 with the command named and the usage", code, errOut, out)
		}
	})

	t.Run("invalid env duration", func(t *testing.T) {
		db := filepath.Join(dir, "never.db")
		code, out, errOut := runCLI(t, []string{"GATEWAY_DEMO_PACE=abc"}, "-addr", "127.0.0.1:0", "-db", db)
		if code != 2 || !strings.Contains(errOut, "GATEWAY_DEMO_PACE") || !strings.Contains(errOut, "abc") {
			t.Errorf("GATEWAY_DEMO_PACE=abc gateway -addr: exit %d, stderr %q, stdout %q; want exit 2 naming the variable and its value", code, errOut, out)
		}
		if _, err := os.Stat(db); err == nil {
			t.Errorf("a refused configuration still created the database %s", db)
		}
	})

	t.Run("invalid flags", func(t *testing.T) {
		db := filepath.Join(dir, "never2.db")
		for _, args := range [][]string{
			{"-addr", "127.0.0.1:0", "-db", db, "-demo-pace", "-1s"},
			{"-addr", "127.0.0.1:0", "-db", db, "-model", "gpt"},
			{"-addr", "127.0.0.1:0", "-db", db, "extra"},
			{"serve", "-no-such-flag"},
		} {
			if code, _, errOut := runCLI(t, nil, args...); code != 2 || errOut == "" {
				t.Errorf("gateway %s: exit %d, stderr %q; want exit 2 with a message", strings.Join(args, " "), code, errOut)
			}
		}
	})

	t.Run("scale-out settings", func(t *testing.T) {
		wantStartsRefused(t, filepath.Join(dir, "never3.db"), []refusedStart{
			{[]string{"-nats", "nats://127.0.0.1:4222"}, "needs a PostgreSQL -db"},
			{[]string{"-db", "postgres://u:secret@127.0.0.1:5432/db", "-nats", "127.0.0.1:4222"}, "use a URL like nats://"},
			{[]string{"-lease-ttl", "10ms"}, "-lease-ttl must be at least"},
			{[]string{"-nats-subject", "a.*"}, "-nats-subject"},
		})
	})

	t.Run("help", func(t *testing.T) {
		if code, out, _ := runCLI(t, nil, "help"); code != 0 || !strings.Contains(out, "gateway check") {
			t.Errorf("gateway help: exit %d, stdout %q; want 0 and the usage", code, out)
		}
	})
}

func TestLoopbackAddresses(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "localhost:80": true, "[::1]:8080": true, "127.0.0.2:1": true,
		"0.0.0.0:8080": false, ":8080": false, "[::]:8080": false, "192.168.1.10:80": false, "example.com:80": false, "nonsense": false,
	} {
		if got := loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
