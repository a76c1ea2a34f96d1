package app_test

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

// Admission (docs/protocol.md): at capacity a new run waits queued, says its
// place in line in the run.start ack, the snapshot and GET /api/runs/{id},
// cancels at once without ever starting while the run holding the slot
// streams on, and starts when the slot frees. /readyz shows the state.
func TestAQueuedRunWaitsVisiblyCancelsAtOnceAndStartsWhenASlotFrees(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	cfg := apptest.Config(db)
	cfg.Workers, cfg.MaxRunsPerUser = 1, 1
	base, stop := apptest.Serve(t, cfg)
	api := newClient(t, base)

	threadA, threadB := createThread(t, base), createThread(t, base)
	tabA, tabB := openTab(t, base, threadA.ThreadID, "a"), openTab(t, base, threadB.ThreadID, "b")
	tabA.next() // the snapshots
	tabB.next()

	// A takes the one slot with a reply that never ends.
	runA, err := tabA.conn.StartRun(bounded(t), client.StartRunRequest{ThreadID: threadA.ThreadID,
		ExpectedStateVersion: threadA.StateVersion, UserMessage: "endless: hold the slot"})
	if err != nil || runA.QueuePosition != 0 || runA.Status != chat.RunRunning {
		t.Fatalf("run.start on an idle server: %+v, %v; want it running (claimed by its start), not queued", runA, err)
	}
	var deltasA []string
	tabA.until(chat.EventMessageDelta, runA.RunID, &deltasA)

	// B waits, and every way of asking says so.
	runB, err := tabB.conn.StartRun(bounded(t), client.StartRunRequest{ThreadID: threadB.ThreadID,
		ExpectedStateVersion: threadB.StateVersion, UserMessage: "what is next?"})
	if err != nil || runB.Status != chat.RunQueued || runB.QueuePosition != 1 {
		t.Fatalf("run.start at capacity: %+v, %v; want status queued, queue_position 1", runB, err)
	}
	snap, err := api.Thread(bounded(t), threadB.ThreadID)
	if err != nil || snap.ActiveRun == nil || snap.ActiveRun.Status != chat.RunQueued || snap.ActiveRun.QueuePosition != 1 {
		t.Fatalf("snapshot of the waiting thread: active_run %+v, %v; want queued at position 1", snap.ActiveRun, err)
	}
	if r, err := api.Run(bounded(t), runB.RunID); err != nil || r.QueuePosition != 1 {
		t.Fatalf("GET /api/runs/%s: %+v, %v; want queue_position 1", runB.RunID, r, err)
	}
	waitAdmission(t, base, chat.Admission{Capacity: 1, Executing: 1, Waiting: 1})

	// Cancelled while it waits: the receipt comes, nothing was streamed,
	// and A streams on.
	ack, err := tabB.conn.CancelRun(bounded(t), client.CancelRunRequest{RunID: runB.RunID})
	if err != nil || ack.AlreadyRequested {
		t.Fatalf("cancel of the queued run: %+v, %v", ack, err)
	}
	var deltasB []string
	ev := tabB.until(chat.EventRunCancelled, runB.RunID, &deltasB)
	if c := ev.Cancelled(); len(deltasB) != 0 || c == nil || c.DiscardedStreamChars != 0 || len(c.Operations) != 0 || c.Executed == nil || *c.Executed {
		t.Fatalf("the queued run's receipt: %s after %d deltas; want cancelled with nothing streamed or discarded, executed false", ev.Raw, len(deltasB))
	}
	if r, err := api.Run(bounded(t), runB.RunID); err != nil || r.Status != chat.RunCancelled || r.Executed {
		t.Fatalf("GET /api/runs/%s after its cancel: %+v, %v; want cancelled, never executed", runB.RunID, r, err)
	}
	before := len(deltasA)
	for len(deltasA) < before+3 {
		ev := tabA.next()
		if ev.RunID == runA.RunID && ev.Type != chat.EventMessageDelta {
			t.Fatalf("the run holding the slot changed while another was cancelled: %s", ev.Raw)
		}
		if d := ev.Delta(); d != nil {
			deltasA = append(deltasA, d.Text)
		}
	}

	// Queued again; the slot frees when A is cancelled; B starts.
	threadB, err = api.Thread(bounded(t), threadB.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	runB2, err := tabB.conn.StartRun(bounded(t), client.StartRunRequest{ThreadID: threadB.ThreadID,
		ExpectedStateVersion: threadB.StateVersion, UserMessage: "what is next, then?"})
	if err != nil || runB2.QueuePosition != 1 {
		t.Fatalf("run.start at capacity again: %+v, %v; want queue_position 1", runB2, err)
	}
	if _, err := tabA.conn.CancelRun(bounded(t), client.CancelRunRequest{RunID: runA.RunID}); err != nil {
		t.Fatal(err)
	}
	if c := tabA.until(chat.EventRunCancelled, runA.RunID, &deltasA).Cancelled(); c == nil || c.Executed == nil || !*c.Executed {
		t.Fatalf("the receipt of the run that held the slot: %+v; want executed true", c)
	}
	var deltasB2 []string
	tabB.until(chat.EventMessageDelta, runB2.RunID, &deltasB2)
	if r, err := api.Run(bounded(t), runB2.RunID); err != nil || r.QueuePosition != 0 || r.Status == chat.RunQueued || !r.Executed {
		t.Fatalf("GET /api/runs/%s once it streams: %+v, %v; want it running, executed, with no queue_position", runB2.RunID, r, err)
	}
	tabB.until(chat.EventRunCompleted, runB2.RunID, &deltasB2)
	waitAdmission(t, base, chat.Admission{Capacity: 1, Executing: 0, Waiting: 0})
	stop()
	apptest.CheckClean(t, db)
}

// waitAdmission polls /readyz (bounded) until it reports want.
func waitAdmission(t *testing.T, base string, want chat.Admission) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	var got struct {
		Admission *chat.Admission `json:"admission"`
	}
	for time.Now().Before(deadline) {
		res, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(res.Body).Decode(&got)
		res.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got.Admission != nil && *got.Admission == want {
			return
		}
		time.Sleep(10 * time.Millisecond) // a poll interval, bounded by the deadline
	}
	t.Fatalf("/readyz admission = %+v, want %+v", got.Admission, want)
}
