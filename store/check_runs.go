package store

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"

	"github.com/honestcancel/gateway/chat"
)

// ---- 3: resumes reference real checkpoints of their lineage ----

func checkResumeLineage(a *auditor, th *auditThread) {
	in := func(cpID string) bool {
		ok, err := a.lineage(th.row.ThreadID, cpID)
		a.lookupErr(err)
		return ok
	}
	for _, r := range th.runs {
		if !in(r.BaseCheckpointID) {
			a.add(
				3,
				"run %s starts from checkpoint %s, not in thread %s or its fork source",
				r.RunID, r.BaseCheckpointID, r.ThreadID,
			)
		}
		if r.ResumeCheckpointID.Valid && !in(r.ResumeCheckpointID.String) {
			a.add(
				3,
				"run %s resumes from checkpoint %s, not in thread %s or its fork source",
				r.RunID, r.ResumeCheckpointID.String, r.ThreadID,
			)
		}
	}
	if t := th.row; t.ForkedFromCheckpointID.Valid {
		ok, err := a.lineage(t.ForkedFromThreadID.String, t.ForkedFromCheckpointID.String)
		a.lookupErr(err)
		if !ok {
			a.add(
				3,
				"thread %s is forked from checkpoint %s, which is not in its source thread %s",
				t.ThreadID, t.ForkedFromCheckpointID.String, t.ForkedFromThreadID.String,
			)
		}
	}
	for _, cp := range th.cps {
		if cp.ParentCheckpointID == nil {
			continue
		}
		if _, ok := th.cpByID[*cp.ParentCheckpointID]; !ok {
			a.add(
				3,
				"checkpoint %s continues %s, which is not a checkpoint of thread %s",
				cp.CheckpointID, *cp.ParentCheckpointID, th.row.ThreadID,
			)
		}
	}
}

// ---- 4: nothing of a run after its run.cancelled but reconciliation ----

func checkNothingAfterCancelled(a *auditor, th *auditThread) {
	at := func(runID string) (int64, bool) {
		if seq, ok := th.cancelledAt[runID]; ok {
			return seq, true
		}
		// A purged run.cancelled lay at or below the watermark: whatever of
		// the run is left above it came after it.
		if r, ok := th.runByID[runID]; ok && r.status() == chat.RunCancelled && len(th.terminal[runID]) == 0 &&
			th.terminalPurged(r) {
			return th.row.EventsPurgedThrough, true
		}
		return 0, false
	}
	for _, e := range th.events {
		if !e.RunID.Valid {
			continue
		}
		if seq, ok := at(e.RunID.String); ok && e.Seq > seq && e.Type != chat.EventToolUpdated {
			a.add(4, "run %s emitted %s (seq %d) after run.cancelled (seq %d)", e.RunID.String, e.Type, e.Seq, seq)
		}
	}
	for _, d := range th.deltas {
		if seq, ok := at(d.RunID); ok && d.Seq > seq {
			a.add(4, "run %s streamed a delta (seq %d) after run.cancelled (seq %d)", d.RunID, d.Seq, seq)
		}
	}
}

// ---- 7: one terminal status; cancelled once a cancel was accepted ----

var terminalEventOf = map[chat.RunStatus]string{
	chat.RunCompleted: chat.EventRunCompleted,
	chat.RunFailed:    chat.EventRunFailed,
	chat.RunCancelled: chat.EventRunCancelled,
}

func checkTerminalStatus(a *auditor, th *auditThread) {
	var active []string
	for _, r := range th.runs {
		st := r.status()
		if !st.Valid() {
			a.add(7, "run %s has unknown status %q", r.RunID, r.Status)
		}
		evs := th.terminal[r.RunID]
		switch {
		case len(evs) > 1:
			a.add(7, "run %s has %d terminal events", r.RunID, len(evs))
		case st.Terminal() && len(evs) == 0 && !th.terminalPurged(r):
			a.add(7, "run %s is %s without its terminal event", r.RunID, st)
		case !st.Terminal() && len(evs) > 0:
			a.add(7, "run %s is %s but emitted %s", r.RunID, st, evs[0].Type)
		case st.Terminal() && len(evs) == 1 && evs[0].Type != terminalEventOf[st]:
			a.add(7, "run %s is %s but its terminal event is %s", r.RunID, st, evs[0].Type)
		}
		if r.CancelRequestedAt.Valid && !st.CancelAccepted() {
			a.add(7, "run %s had its cancel accepted but is %s", r.RunID, st)
		}
		if st.Terminal() != r.FinishedAt.Valid {
			a.add(7, "run %s is %s with finished_at %v", r.RunID, st, r.FinishedAt.Valid)
		}
		if !st.Terminal() {
			active = append(active, r.RunID)
		}
	}
	if len(active) > 1 {
		a.add(7, "thread %s has %d active runs: %s", th.row.ThreadID, len(active), strings.Join(active, ", "))
	}
}

// ---- 9: each step of a run is published at most once ----

// checkStepsOnce reads each run's steps from the checkpoints it wrote. A
// step's checkpoint completes the pending step of its parent: a generate
// step adds at most one message of the run (and may leave a tool call
// pending), a tool step records the result of exactly the operation its
// parent waited on (or, when a cancel stopped that call, prepares it again
// as a new operation). A checkpoint whose parent had no such step pending
// is a step published twice; so is a second step checkpoint on one
// parent, or a second result of one operation.
func checkStepsOnce(a *auditor, th *auditThread) {
	stepChildren := map[string][]string{}
	for _, cp := range th.cps {
		if cp.RunID == nil {
			continue
		}
		runID := *cp.RunID
		if _, ok := th.runByID[runID]; !ok {
			a.add(
				9,
				"checkpoint %s names run %s, which is not one of thread %s",
				cp.CheckpointID, runID, th.row.ThreadID,
			)
			continue
		}
		if cp.ParentCheckpointID == nil {
			a.add(9, "checkpoint %s of run %s continues no checkpoint", cp.CheckpointID, runID)
			continue
		}
		parent, ok := th.cpByID[*cp.ParentCheckpointID]
		if !ok {
			continue // invariant 3 reports it
		}
		stepChildren[parent.CheckpointID] = append(stepChildren[parent.CheckpointID], cp.CheckpointID)
		added, ok := appended(parent.MessageIDs, cp.MessageIDs)
		if !ok {
			a.add(9, "checkpoint %s of run %s does not extend its parent's history", cp.CheckpointID, runID)
			continue
		}
		if len(added) > 1 {
			a.add(9, "checkpoint %s of run %s published %d messages in one step", cp.CheckpointID, runID, len(added))
		}
		for _, id := range added {
			if m, ok := th.msgByID[id]; !ok || m.RunID.String != runID || m.CheckpointID != cp.CheckpointID {
				a.add(
					9,
					"checkpoint %s of run %s adds message %s, which that step did not publish",
					cp.CheckpointID, runID, id,
				)
			}
		}
		p := parent.Pending
		switch {
		case p == nil:
			a.add(
				9,
				"run %s published checkpoint %s on top of %s, which had no step left to run (a step published twice)",
				runID, cp.CheckpointID, parent.CheckpointID,
			)
		case p.Step == chat.StepGenerate:
			if cp.Pending != nil && cp.Pending.Step != chat.StepTool {
				a.add(
					9,
					"generate step checkpoint %s of run %s leaves a %s step pending",
					cp.CheckpointID, runID, cp.Pending.Step,
				)
			}
			if cp.Pending != nil {
				if op, ok := th.opByID[cp.Pending.InputHash]; !ok || op.RunID != runID {
					a.add(
						9,
						"checkpoint %s of run %s waits on operation %s, which is not the run's",
						cp.CheckpointID, runID, cp.Pending.InputHash,
					)
				}
			}
			if len(added) == 0 && cp.Pending == nil {
				a.add(
					9,
					"generate step checkpoint %s of run %s produced neither a message nor a call",
					cp.CheckpointID, runID,
				)
			}
		case p.Step == chat.StepTool:
			waited, ok := th.opByID[p.InputHash]
			inherited := false
			if !ok {
				// A fork's first checkpoint may wait on a call of the thread
				// it was forked from; the fork prepares it again.
				owner, err := a.rowThread(
					a.opThread,
					`SELECT thread_id FROM operations WHERE operation_id = ?`,
					p.InputHash,
				)
				a.lookupErr(err)
				for src, depth := th.row.ThreadID, 0; owner != "" && src != "" && depth < 1000 && !inherited; depth++ {
					src, err = a.forkSource(src)
					a.lookupErr(err)
					inherited = src == owner
				}
			}
			switch {
			case inherited && len(added) == 0 && cp.Pending != nil && cp.Pending.Step == chat.StepTool:
				// The source's call, prepared again in the fork.
			case !ok:
				a.add(
					9,
					"checkpoint %s waited on operation %s, which is not one of its thread or fork source",
					parent.CheckpointID, p.InputHash,
				)
			case len(added) == 1:
				m := th.msgByID[added[0]]
				if m.Role != chat.RoleTool || toolMessageOp(m) != waited.OperationID {
					a.add(
						9,
						"tool step checkpoint %s of run %s records %s, not the result of operation %s",
						cp.CheckpointID, runID, added[0], waited.OperationID,
					)
				}
			case len(added) == 0 && cp.Pending != nil && cp.Pending.Step == chat.StepTool &&
				cp.Pending.InputHash != waited.OperationID &&
				(waited.Phase == chat.PhaseAborted || waited.Phase == chat.PhaseVoided):
				// The call a cancel stopped, prepared again.
			default:
				a.add(
					9,
					"checkpoint %s of run %s completes the tool step of %s without recording operation %s's result",
					cp.CheckpointID, runID, parent.CheckpointID, waited.OperationID,
				)
			}
		}
	}
	for parent, kids := range stepChildren {
		if len(kids) > 1 {
			sort.Strings(kids)
			a.add(
				9,
				"the step pending at checkpoint %s was published %d times: %s",
				parent, len(kids), strings.Join(kids, ", "),
			)
		}
	}
	// One recorded result per tool call.
	results := map[string][]string{}
	for _, m := range th.msgs {
		if m.Role != chat.RoleTool {
			continue
		}
		op := toolMessageOp(m)
		o, ok := th.opByID[op]
		if !ok || !m.RunID.Valid || o.RunID != m.RunID.String {
			a.add(9, "tool message %s reports operation %q, which is not one of its run", m.MessageID, op)
			continue
		}
		results[op] = append(results[op], m.MessageID)
	}
	for _, o := range th.ops {
		got := results[o.OperationID]
		if len(got) > 1 {
			a.add(9, "operation %s has %d recorded results: %s", o.OperationID, len(got), strings.Join(got, ", "))
		}
		if o.ResultRef.Valid && !slices.Contains(got, o.ResultRef.String) {
			a.add(
				9,
				"operation %s names result %s, which is not a tool message reporting it",
				o.OperationID, o.ResultRef.String,
			)
		}
	}
}

// appended returns the ids child adds at the end of parent (ok false when
// child does not start with parent).
func appended(parent, child []string) ([]string, bool) {
	if len(child) < len(parent) || !slices.Equal(parent, child[:len(parent)]) {
		return nil, false
	}
	return child[len(parent):], true
}

// toolMessageOp is the operation a tool message reports.
func toolMessageOp(m messageRow) string {
	var rec struct {
		OperationID string `json:"operation_id"`
	}
	_ = json.Unmarshal([]byte(m.Content), &rec)
	return rec.OperationID
}
