package store_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/honestcancel/gateway/chat"
)

// A working tool's progress is a tool.updated event carrying it, one
// state_version each, while the run runs and the call works; it is never
// stored with the operation, and it is refused once a cancel is recorded
// or the call settled, writing nothing.
func TestRecordToolProgress(t *testing.T) {
	var events []*chat.Event
	st, _ := openWithClock(t, 0, &events)
	snap := newThread(t, st)
	lease, opID := committingRun(t, st, snap.ThreadID)

	before := version(t, st, snap.ThreadID)
	events = nil
	p := chat.ToolProgress{Progress: 2, Total: 5, Message: "uploading"}
	if err := st.RecordToolProgress(ctx, lease, opID, p); err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 || events[0].Type != chat.EventToolUpdated || events[0].StateVersion != before+1 {
		t.Fatalf("events %+v, want one tool.updated at version %d", events, before+1)
	}
	reported := events[0].Body.(chat.ToolBody).Operation
	if reported.OperationID != opID || reported.Phase != chat.PhaseCommitting || reported.Progress == nil || *reported.Progress != p {
		t.Fatalf("reported %+v", reported)
	}
	var wire struct {
		Operation struct {
			Progress chat.ToolProgress `json:"progress"`
		} `json:"operation"`
	}
	if err := json.Unmarshal(events[0].Raw, &wire); err != nil || wire.Operation.Progress != p {
		t.Fatalf("on the wire: %s (%v)", events[0].Raw, err)
	}
	if op := operation(t, st, opID); op.Progress != nil {
		t.Fatalf("the stored operation holds progress: %+v", op)
	}

	runID := operation(t, st, opID).RunID
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: runID, Reason: chat.ReasonUserRequested, RequestedBy: "tab:a"}); err != nil {
		t.Fatal(err)
	}
	events = nil
	v := version(t, st, snap.ThreadID)
	var notRunning *chat.ErrNotRunning
	if err := st.RecordToolProgress(ctx, lease, opID, p); !errors.As(err, &notRunning) {
		t.Fatalf("progress after the cancel: %v, want ErrNotRunning", err)
	}
	if len(events) != 0 || version(t, st, snap.ThreadID) != v {
		t.Fatalf("a refused report wrote %+v", events)
	}
}
