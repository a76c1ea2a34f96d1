package store

import (
	"slices"

	"github.com/honestcancel/gateway/chat"
)

// ---- 0: the purge watermarks themselves ----

func checkWatermarks(a *auditor, th *auditThread) {
	t := th.row
	if t.EventsPurgedThrough < 0 || t.EventsPurgedThrough > t.LastSeq ||
		(t.EventsPurgedThrough == 0) != (t.EventsPurgedVersion == 0) ||
		(t.EventsPurgedThrough > 0 && t.EventsPurgedVersion >= t.StateVersion) {
		a.add(0, "thread %s has an impossible event purge watermark (seq %d, v%d; thread at seq %d, v%d)",
			t.ThreadID, t.EventsPurgedThrough, t.EventsPurgedVersion, t.LastSeq, t.StateVersion)
	}
	if t.DeltasPurgedThrough < 0 || t.DeltasPurgedThrough > t.LastSeq {
		a.add(
			0,
			"thread %s has an impossible stream purge mark %d (thread at seq %d)",
			t.ThreadID, t.DeltasPurgedThrough, t.LastSeq,
		)
	}
	if len(th.events) > 0 && th.events[0].Seq <= t.EventsPurgedThrough {
		a.add(
			0,
			"thread %s still holds event seq %d at or below its purge watermark %d",
			t.ThreadID, th.events[0].Seq, t.EventsPurgedThrough,
		)
	}
	if len(th.deltas) > 0 && th.deltas[0].Seq <= t.DeltasPurgedThrough {
		a.add(
			0,
			"thread %s still holds delta seq %d at or below its stream purge mark %d",
			t.ThreadID, th.deltas[0].Seq, t.DeltasPurgedThrough,
		)
	}
}

// ---- 1: no published message without a checkpoint that contains it ----

func checkMessagesInCheckpoints(a *auditor, th *auditThread) {
	for _, m := range th.msgs {
		cp, ok := th.cpByID[m.CheckpointID]
		if !ok || !slices.Contains(cp.MessageIDs, m.MessageID) {
			a.add(
				1,
				"message %s (thread %s) names checkpoint %s, which is not one of the thread's that contains it",
				m.MessageID, m.ThreadID, m.CheckpointID,
			)
		}
	}
}

// checkDeleted: a thread is deleted (deleted_at) exactly when its log holds
// a thread.deleted, which is its last event (the event log's purge keeps a
// thread's last event, so it is never purged); nothing follows it, no
// delta either, and no run of the thread is still going on.
func checkDeleted(a *auditor, th *auditThread) {
	t := th.row
	var at int64
	for _, e := range th.events {
		if e.Type == chat.EventThreadDeleted {
			if at != 0 {
				a.add(0, "thread %s has two thread.deleted events (seq %d and %d)", t.ThreadID, at, e.Seq)
			}
			at = e.Seq
		}
	}
	switch {
	case at == 0 && t.DeletedAt.Valid:
		a.add(0, "thread %s is deleted but its log has no thread.deleted", t.ThreadID)
	case at != 0 && !t.DeletedAt.Valid:
		a.add(0, "thread %s has thread.deleted (seq %d) but is not deleted", t.ThreadID, at)
	}
	if at == 0 {
		return
	}
	if t.LastSeq != at {
		a.add(0, "thread %s was deleted at seq %d, but its last seq is %d", t.ThreadID, at, t.LastSeq)
	}
	for _, e := range th.events {
		if e.Seq > at {
			a.add(0, "thread %s emitted %s (seq %d) after thread.deleted (seq %d)", t.ThreadID, e.Type, e.Seq, at)
		}
	}
	for _, d := range th.deltas {
		if d.Seq > at {
			a.add(0, "thread %s streamed a delta (seq %d) after thread.deleted (seq %d)", t.ThreadID, d.Seq, at)
		}
	}
	for _, r := range th.runs {
		if !r.status().Terminal() {
			a.add(0, "thread %s was deleted with run %s still %s", t.ThreadID, r.RunID, r.Status)
		}
	}
}

// ---- 5: state_version moves by exactly one per durable event ----

func checkStateVersion(a *auditor, th *auditThread) {
	t := th.row
	// The held log starts right after the purge mark and counts up by one.
	want := t.EventsPurgedVersion + 1
	for _, e := range th.events {
		if e.StateVersion != want {
			a.add(
				5,
				"thread %s event seq %d (%s) has state_version %d, want %d (one more than the durable event before it)",
				t.ThreadID, e.Seq, e.Type, e.StateVersion, want,
			)
		}
		want = e.StateVersion + 1
	}
	if want-1 != t.StateVersion {
		a.add(
			5,
			"thread %s is at state_version %d but its last durable event says %d",
			t.ThreadID, t.StateVersion, want-1,
		)
	}
	// A checkpoint and a message carry the version of their own event.
	versionOf := map[string]int64{} // checkpoint or message id -> its event's version
	for _, e := range th.events {
		switch e.Type {
		case chat.EventCheckpointCreated:
			versionOf[e.body.CheckpointID] = e.StateVersion
		case chat.EventMessagePublished:
			if e.MessageID.Valid {
				versionOf[e.MessageID.String] = e.StateVersion
			}
		}
	}
	for _, cp := range th.cps {
		if v, ok := versionOf[cp.CheckpointID]; ok && v != cp.StateVersion {
			a.add(
				5,
				"checkpoint %s has state_version %d but its checkpoint.created says %d",
				cp.CheckpointID, cp.StateVersion, v,
			)
		}
		if cp.StateVersion > t.StateVersion {
			a.add(
				5,
				"checkpoint %s (v%d) is newer than its thread %s (v%d)",
				cp.CheckpointID, cp.StateVersion, t.ThreadID, t.StateVersion,
			)
		}
		if cp.ParentCheckpointID != nil {
			if p, ok := th.cpByID[*cp.ParentCheckpointID]; ok && p.StateVersion >= cp.StateVersion {
				a.add(
					5,
					"checkpoint %s (v%d) has parent %s with version %d",
					cp.CheckpointID, cp.StateVersion, p.CheckpointID, p.StateVersion,
				)
			}
		}
	}
	for _, m := range th.msgs {
		if v, ok := versionOf[m.MessageID]; ok && v != m.StateVersion {
			a.add(
				5,
				"message %s has state_version %d but its message.published says %d",
				m.MessageID, m.StateVersion, v,
			)
		}
	}
	if head, ok := th.cpByID[t.HeadCheckpointID]; !ok {
		a.add(5, "thread %s has head %s, not one of its checkpoints", t.ThreadID, t.HeadCheckpointID)
	} else if head.StateVersion > t.StateVersion {
		a.add(5, "thread %s head %s is newer (v%d) than the thread "+
			"(v%d)", t.ThreadID, head.CheckpointID, head.StateVersion, t.StateVersion)
	}
}
