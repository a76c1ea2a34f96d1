package store_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// A checkpoint that continues its parent's lists is stored as what it
// appended: the row of the 40th exchange is as small as the first's, so
// bytes written per exchange do not grow with the conversation (issue
// 31). Reading gives the lists whole: through a warm cache, and from a
// freshly opened store that must walk the stored chain (longer than one
// page of the walk) back to a row stored whole.
func TestCheckpointsStoreWhatTheyAppend(t *testing.T) {
	path := testDSN(t)
	opts := store.Options{Exclusive: true, StreamBuffer: true}
	st, err := store.Open(ctx, path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { st.Close() }()
	th := newThread(t, st)
	const exchanges = 40
	for i := range exchanges {
		completeRun(t, st, th.ThreadID, "question", "answer")
		if i == exchanges/4 {
			// A deleted draft: the checkpoint that drops it from the
			// middle of the history cannot be stored as appended.
			_, msgID, last := streamAndCancel(t, st, th.ThreadID, version(t, st, th.ThreadID), "draft")
			deleteDraft(t, st, th.ThreadID, saveDraft(t, st, th.ThreadID, msgID, last).MessageID)
		}
	}

	// As stored: the thread's first checkpoint and the deletion's whole,
	// every other one at most the one message it added.
	db := rawDB(t, path)
	rows, err := db.Query(`SELECT checkpoint_id, appended, message_ids FROM checkpoints WHERE thread_id = ? ORDER BY state_version`, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	var whole, appended, longest int
	for rows.Next() {
		var id, raw string
		var app int64
		if err := rows.Scan(&id, &app, &raw); err != nil {
			t.Fatal(err)
		}
		var ids []string
		if err := json.Unmarshal([]byte(raw), &ids); err != nil {
			t.Fatal(err)
		}
		if app == 1 {
			appended++
			longest = max(longest, len(ids))
		} else {
			whole++
		}
	}
	rows.Close()
	if whole != 2 || appended < 2*exchanges || longest > 1 {
		t.Fatalf("stored %d checkpoints whole and %d as appended (each at most %d message ids); want 2 whole (the first, the deletion's), the rest appended with at most 1 id each",
			whole, appended, longest)
	}

	// Read whole: the head holds every message not deleted, in order.
	var want []string
	mrows, err := db.Query(`SELECT message_id FROM messages WHERE thread_id = ? AND deleted_at IS NULL ORDER BY state_version`, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	for mrows.Next() {
		var id string
		if err := mrows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	mrows.Close()
	readWhole := func(when string) {
		t.Helper()
		head, cps, err := st.Checkpoints(ctx, user, th.ThreadID)
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]chat.Checkpoint{}
		for _, cp := range cps {
			byID[cp.CheckpointID] = cp
			if cp.ParentCheckpointID == nil {
				continue
			}
			parent := byID[*cp.ParentCheckpointID]
			if cp.CheckpointID != head && len(cp.MessageIDs) < len(parent.MessageIDs)-1 {
				t.Fatalf("%s: checkpoint %s holds %d message ids, its parent %d", when, cp.CheckpointID, len(cp.MessageIDs), len(parent.MessageIDs))
			}
		}
		if got := byID[head]; !slices.Equal(got.MessageIDs, want) || len(got.CompletedSteps) != exchanges {
			t.Fatalf("%s: the listed head holds %d ids and %d steps; want the %d messages not deleted, and %d steps",
				when, len(got.MessageIDs), len(got.CompletedSteps), len(want), exchanges)
		}
		page, err := st.History(ctx, user, th.ThreadID, "", len(want)+1, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range page.Messages {
			got = append(got, m.MessageID)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: history %v\nwant %v", when, got, want)
		}
	}
	readWhole("warm")
	mustCheck(t, st, "after the exchanges")

	// A fresh store has nothing cached: it reads the chain back to the
	// deletion's whole row, more than one page of the walk.
	st.Close()
	if st, err = store.Open(ctx, path, opts); err != nil {
		t.Fatal(err)
	}
	readWhole("after reopening")
	completeRun(t, st, th.ThreadID, "one more", "answer") // its start reads the head cold
	mustCheck(t, st, "after reopening")
}

// CheckpointDeltas tells each checkpoint's lists as what they change from
// its parent's: rebuilt oldest first, they are exactly the lists
// Checkpoints gives whole, a deleted draft's row included (it keeps the
// start of its parent's lists before the draft); and what they add comes
// to about one entry per checkpoint, so the answer grows with the
// conversation, not with its square.
func TestCheckpointDeltasRebuildTheWholeLists(t *testing.T) {
	st, err := store.Open(ctx, testDSN(t), store.Options{Exclusive: true, StreamBuffer: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	th := newThread(t, st)
	const exchanges = 30
	for i := range exchanges {
		completeRun(t, st, th.ThreadID, "question", "answer")
		if i == exchanges/3 {
			_, msgID, last := streamAndCancel(t, st, th.ThreadID, version(t, st, th.ThreadID), "draft")
			saved := saveDraft(t, st, th.ThreadID, msgID, last)
			// One more exchange after the fragment, so that the draft is
			// in the middle of the history when it is deleted.
			completeRun(t, st, th.ThreadID, "question", "answer")
			deleteDraft(t, st, th.ThreadID, saved.MessageID)
		}
	}
	head, whole, err := st.Checkpoints(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	dhead, deltas, err := st.CheckpointDeltas(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	if dhead != head || len(deltas) != len(whole) {
		t.Fatalf("deltas: head %s and %d checkpoints; whole: head %s and %d", dhead, len(deltas), head, len(whole))
	}
	type lists struct {
		msgs, steps []string
		tools       []chat.ToolResult
	}
	rebuilt := map[string]lists{}
	added, keptShort := 0, 0
	for i, d := range deltas {
		w := whole[i]
		if d.CheckpointID != w.CheckpointID || d.StateVersion != w.StateVersion || (d.ParentCheckpointID == nil) != (w.ParentCheckpointID == nil) ||
			(d.Pending == nil) != (w.Pending == nil) || !d.CreatedAt.Equal(w.CreatedAt) {
			t.Fatalf("checkpoint %d: delta %+v, whole %+v", i, d, w)
		}
		var p lists
		if d.ParentCheckpointID != nil {
			var ok bool
			if p, ok = rebuilt[*d.ParentCheckpointID]; !ok {
				t.Fatalf("checkpoint %s comes before its parent %s", d.CheckpointID, *d.ParentCheckpointID)
			}
			if d.MessageIDsKept < len(p.msgs) {
				keptShort++
			}
		} else if d.MessageIDsKept != 0 || d.CompletedStepsKept != 0 || d.ToolResultsKept != 0 {
			t.Fatalf("checkpoint %s has no parent but keeps %d, %d, %d entries of it", d.CheckpointID, d.MessageIDsKept, d.CompletedStepsKept, d.ToolResultsKept)
		}
		got := lists{
			msgs:  append(slices.Clone(p.msgs[:d.MessageIDsKept]), d.MessageIDsAdded...),
			steps: append(slices.Clone(p.steps[:d.CompletedStepsKept]), d.CompletedStepsAdded...),
			tools: append(slices.Clone(p.tools[:d.ToolResultsKept]), d.ToolResultsAdded...),
		}
		if !slices.Equal(got.msgs, w.MessageIDs) || !slices.Equal(got.steps, w.CompletedSteps) || !slices.Equal(got.tools, w.ToolResults) {
			t.Fatalf("checkpoint %s rebuilt: %v %v %v\nwhole: %v %v %v", d.CheckpointID, got.msgs, got.steps, got.tools, w.MessageIDs, w.CompletedSteps, w.ToolResults)
		}
		rebuilt[d.CheckpointID] = got
		added += len(d.MessageIDsAdded) + len(d.CompletedStepsAdded) + len(d.ToolResultsAdded)
	}
	if keptShort != 1 {
		t.Errorf("%d checkpoints keep less than their parent's messages; want 1 (the deleted draft's)", keptShort)
	}
	// Each exchange adds two messages and a step; the deletion re-adds the
	// message after the draft.
	if limit := 3*(exchanges+2) + 2; added > limit {
		t.Errorf("the deltas add %d entries for %d checkpoints; want at most %d", added, len(deltas), limit)
	}
	if _, _, err := st.CheckpointDeltas(ctx, "usr_someone_else", th.ThreadID); chat.ErrorCode(err) != chat.CodeNotFound {
		t.Errorf("another user's thread: %v, want not_found", err)
	}
}
