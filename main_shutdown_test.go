package main

// Graceful shutdown against the real binary: SIGTERM in the middle of
// several streaming runs. Readiness goes 503 (or the port closes) before
// the process ends, every WebSocket gets 1001 going away, the process exits
// 0, and after a restart on the same database every run continues to
// completion — none cancelled, none failed, one published reply each — and
// the invariants hold.

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/internal/apptest"
)

func TestBinaryGracefulRestartContinuesRuns(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	const pace = "60ms"
	srv := startProcess(t, db, pace)
	const n = 4
	type live struct {
		thread chat.Snapshot
		runID  string
		evs    *apptest.Stream
	}
	runs := make([]live, n)
	for i := range runs {
		th := srv.CreateThread()
		ack := srv.StartRun(th.ThreadID, th.StateVersion, "Tell me about graceful restarts of streaming servers, in detail")
		runs[i] = live{thread: th, runID: ack.RunID, evs: srv.Events(th.ThreadID, th.LastSeq)}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, r := range runs {
		r.evs.WaitDeltas(deadline, r.runID, 3) // streaming, far from done
	}

	// A WebSocket tab watching the first thread must be told to go away.
	// Raw: the subject is the close code, and the protocol client would
	// take 1001 as a cue to reconnect, not show it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.base, "http")+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	closed := make(chan websocket.StatusCode, 1)
	go func() {
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				closed <- websocket.CloseStatus(err)
				return
			}
		}
	}()

	// Watch readiness as a load balancer would: polling /readyz, it must
	// see the server stop being ready (503 while draining, or the port
	// closed once it is gone). A drain can be shorter than one poll, so
	// when the process has exited the watcher polls once more.
	var sawNotReady bool
	var watch sync.WaitGroup
	stopWatch := make(chan struct{})
	watch.Go(func() {
		client := &http.Client{Timeout: time.Second}
		notReady := func() bool {
			resp, err := client.Get(srv.base + "/readyz")
			if err != nil {
				return true
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusServiceUnavailable
		}
		for i := 0; i < 2000; i++ {
			select {
			case <-stopWatch:
				sawNotReady = notReady()
				return
			default:
			}
			if notReady() {
				sawNotReady = true
				return
			}
			time.Sleep(5 * time.Millisecond) // polling readiness, bounded
		}
	})
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := srv.WaitExit(20 * time.Second); code != 0 {
		t.Fatalf("graceful shutdown exited %d, want 0; log:\n%s", code, srv.Stderr())
	}
	close(stopWatch)
	watch.Wait()
	if !sawNotReady {
		t.Error("/readyz kept answering 200 through the shutdown")
	}
	select {
	case code := <-closed:
		if code != websocket.StatusGoingAway {
			t.Errorf("the WebSocket ended with %d, want 1001 going away", code)
		}
	case <-time.After(10 * time.Second):
		t.Error("the WebSocket was not closed by the shutdown")
	}
	for _, r := range runs {
		r.evs.Close()
	}
	checkDB(t, db) // nothing half-written

	// Restarted on the same database: every run continues.
	srv = startProcess(t, db, "5ms")
	for _, r := range runs {
		snap := srv.Snapshot(r.thread.ThreadID)
		evs := srv.Events(r.thread.ThreadID, snap.LastSeq)
		if snap.ActiveRun != nil {
			evs.WaitFor(time.Now().Add(30*time.Second), "the continued run's end", apptest.IsEnd(r.runID))
		}
		evs.Close()
		got := srv.Run(r.runID)
		if got.Status != chat.RunCompleted {
			t.Errorf("run %s after a graceful restart: %s (error %v), want completed", r.runID, got.Status, got.Error)
		}
		after := srv.Snapshot(r.thread.ThreadID)
		replies := 0
		for _, m := range after.Messages {
			if m.Role == "assistant" && m.RunID != nil && *m.RunID == r.runID {
				replies++
			}
		}
		if replies != 1 || len(after.Messages) != 2 {
			t.Errorf("thread %s after the restart holds %d messages with %d replies of the run, want the question and one reply", r.thread.ThreadID, len(after.Messages), replies)
		}
	}
	srv.Stop()
	checkDB(t, db)
}
