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
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
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

// ---------------------------------------------------------------------------
// Test 2: crash recovery.

func TestBinaryCrashRecovery(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	const pace = "50ms"
	srv := startProcess(t, db, pace)
	tid := srv.CreateThread().ThreadID

	var runs []string
	// Kill at different moments of the stream: right after the first
	// delta, a little later, well into the reply.
	for i, killAfter := range []int{1, 6, 15} {
		snap := srv.Snapshot(tid)
		if want := 2 * i; len(snap.Messages) != want {
			t.Fatalf("round %d: history has %d messages, want %d", i, len(snap.Messages), want)
		}
		evs := srv.Events(tid, snap.LastSeq)
		started := srv.StartRun(tid, snap.StateVersion, fmt.Sprintf("Round %d: describe durable checkpoints, leases and recovery after crashes", i+1))
		runID := started.RunID
		runs = append(runs, runID)

		lost := evs.WaitDeltas(time.Now().Add(20*time.Second), runID, killAfter)
		seenSeq := evs.LastSeq()
		partial := evs.Text(lost)

		srv.Kill()
		evs.Close()
		checkDB(t, db) // the invariants hold even mid-run

		srv = startProcess(t, db, pace)
		evs = srv.EventsAfterCrash(tid, seenSeq)
		var published *chat.Message
		evs.WaitFor(time.Now().Add(30*time.Second), fmt.Sprintf("run.completed of run %s after the restart", runID), func(ev client.Event) bool {
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
		if got := evs.Text(published.MessageID); got != published.Content || got == "" {
			t.Errorf("round %d: published content is not the concatenation of its deltas:\ncontent: %q\ndeltas:  %q", i, published.Content, got)
		}
		if n := len(strings.Fields(published.Content)); n < 40 {
			t.Errorf("round %d: the published reply has %d words, want a full reply: %q", i, n, published.Content)
		}
		if r := srv.Run(runID); r.Status != "completed" || r.Attempt != 2 {
			t.Errorf("round %d: GET /api/runs/%s = %+v, want completed at attempt 2", i, runID, r)
		}

		snap = srv.Snapshot(tid)
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
		evs.Close()
	}

	for _, id := range runs {
		if r := srv.Run(id); r.Status != "completed" {
			t.Errorf("run %s is %s after recovery, want completed", id, r.Status)
		}
	}
	srv.Stop()
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
