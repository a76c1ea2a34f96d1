// The root tests' process harness: the gateway served in the test's process
// (startServer) or as the binary built with -race (startProcess), its logs,
// and Kill, Freeze, Thaw and Stop for the tests whose subject is a process
// boundary.

package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/honestcancel/gateway/internal/apptest"
)

// server is a gateway the root tests started, served in the test's
// process (startServer) or as a process of its own (startProcess). Its
// protocol helpers (API, As, Snapshot, StartRun, CancelRun, Events, …)
// are those of the embedded apptest.Server, attached (apptest.Attach)
// once the gateway serves and is ready; its log (Stderr, Logged) and
// lifecycle (Kill, Freeze, Thaw, Stop, WaitExit) are the server's own:
// they shadow the embedded Server's (whose Stderr is empty and whose
// Stop fails the test). A server belongs to the test that started it:
// its methods are called from the test's goroutine, except Stderr,
// Logged and API.
// The goroutines reading its log and waiting for it end with it, at the
// latest when the test ends.
type server struct {
	*apptest.Server

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
			t.Logf("server stderr (db %s), last lines:\n%s", s.db, s.Stderr())
		}
	})
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	select {
	case s.base = <-addr:
	case <-s.exited:
		t.Fatalf("gateway exited before serving (%s); log:\n%s", s.exitReport(), s.Stderr())
	case <-deadline.C:
		t.Fatalf("gateway did not log %q within 30s; log:\n%s", "gateway serving", s.Stderr())
	}
	s.waitReady()
	s.Server = apptest.Attach(t, s.db, s.base)
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
		s.Kill()
		return
	}
	s.cancel()
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.t.Errorf("the in-process gateway (db %s) did not stop within 20s", s.db)
	}
}

// Stderr is the last lines of the gateway's stderr (up to keepLogLines),
// one a line.
func (s *server) Stderr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.logs, "\n")
}

// Logged counts the stderr lines so far whose msg is exactly msg (all of
// them, not only the last lines kept for failure reports).
func (s *server) Logged(msg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.msgs[msg]
}

func (s *server) waitReady() {
	s.t.Helper()
	apptest.WaitReady(s.t, s.base, s.exited, s.exitReport)
}

// Kill sends SIGKILL (if the process still runs) and waits for it.
func (s *server) Kill() {
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

// Freeze stops the process where it is (SIGSTOP: a pause, an overloaded
// machine, a VM migrated): it holds its sockets, answers nothing and runs
// nothing until Thaw. SIGKILL (Kill, at cleanup) still ends it; a SIGCONT
// is sent at cleanup anyway, before that kill, so nothing waits on a
// stopped process.
func (s *server) Freeze() {
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

// Thaw lets a frozen process go on (SIGCONT).
func (s *server) Thaw() {
	s.t.Helper()
	s.needProcess("thaw")
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatalf("SIGCONT gateway pid %d: %v", s.cmd.Process.Pid, err)
	}
}

// WaitExit waits (bounded) for the process to end on its own and returns
// its exit code.
func (s *server) WaitExit(timeout time.Duration) int {
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

// Stop asks for a graceful shutdown (SIGTERM; in the test's process, the
// end of serve's context, as SIGTERM ends it) and expects exit status 0.
func (s *server) Stop() {
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
