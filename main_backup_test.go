package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// A backup taken while a run streams is a consistent database: it opens
// and passes gateway check, and the live database keeps serving.
func TestBinaryBackupWhileServing(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "gw.db")
	srv := startServer(t, db, "30ms")
	th := srv.CreateThread()
	evs := srv.Events(th.ThreadID, 0)
	defer evs.Close()
	started := srv.StartRun(th.ThreadID, th.StateVersion, "Tell me about backups taken while a server is busy")
	evs.WaitDeltas(time.Now().Add(20*time.Second), started.RunID, 3)

	out := filepath.Join(dir, "backups", "copy.db")
	code, stdout, stderr := runCLI(t, nil, "backup", "-db", db, out)
	if code != 0 || !strings.Contains(stdout, "gateway check -db "+out) {
		t.Fatalf("backup while serving: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	checkDB(t, out)
	if code, _, stderr := runCLI(t, nil, "backup", "-db", db, out); code == 0 || !strings.Contains(stderr, "already exists") {
		t.Fatalf("backup over an existing file: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := runCLI(t, nil, "backup", "-db", db); code != 2 || !strings.Contains(stderr, "OUT") {
		t.Fatalf("backup without a destination: exit %d, stderr %q", code, stderr)
	}
	// The served run goes on to its end.
	evs.WaitFor(time.Now().Add(30*time.Second), "run.completed", func(ev client.Event) bool {
		return ev.Type == chat.EventRunCompleted && ev.RunID == started.RunID
	})
	srv.Stop()
	checkDB(t, db)
}
