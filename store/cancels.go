package store

import (
	"context"
	"fmt"

	"github.com/honestcancel/gateway/chat"
)

// RequestCancel records cancel_requested (reason, who, when, audit row) and
// bumps state_version in one transaction, ahead of queued stream writes
// (writeUrgent). A second cancel changes nothing
// but the audit journal and answers already_requested.
//
// On SQLite with Exclusive, a cancel that would wait for a commit in
// progress is journaled instead (canceljournal.go): acknowledged once
// synced to the cancel journal, with the values the writer then records.
func (s *Store) RequestCancel(ctx context.Context, p chat.CancelRun) (chat.CancelAck, chat.RunStatus, error) {
	if s.journal != nil {
		if ack, prev, err, decided := s.journalCancel(ctx, p); decided {
			return ack, prev, err
		}
	}
	var ack chat.CancelAck
	var prev chat.RunStatus
	err := s.writeUrgent(ctx, func(t *txn) error {
		ack, prev = chat.CancelAck{}, ""
		row, err := t.run(p.RunID)
		if err != nil {
			return err
		}
		c, err := t.thread(p.UserID, row.ThreadID)
		if chat.ErrorCode(err) == chat.CodeNotFound {
			return chat.NotFound("run", p.RunID) // another user's: as unknown as a random id
		}
		if err != nil {
			return err
		}
		st := row.status()
		prev = st
		if err := cancellable(row); err != nil {
			return err
		}
		if st.CancelAccepted() {
			ack = acceptedCancel(row, p)
		} else {
			ack, err = t.cancelNow(c, row, p.UserID, p.Reason, p.RequestedBy)
			return err
		}
		return t.auditCancel(p.UserID, row, ack, p.RequestedBy, p.Reason, ms(t.now), chat.NewID("aud_"))
	})
	return ack, prev, err
}

// cancellable refuses a cancel of a run that ended completed or failed.
func cancellable(row runRow) error {
	if st := row.status(); st == chat.RunCompleted || st == chat.RunFailed {
		return chat.Errorf(chat.CodeRunNotActive, "run %s already ended %s: "+
			"there is nothing to cancel", row.RunID, st).
			With("run_id", row.RunID).
			With("status", st)
	}
	return nil
}

// acceptedCancel is the answer to a cancel of a run whose cancel was
// already accepted: its recorded values, already_requested unless it is
// the same requester's resent request.
func acceptedCancel(row runRow, p chat.CancelRun) chat.CancelAck {
	return chat.CancelAck{
		RunID:                row.RunID,
		Status:               row.status(),
		AlreadyRequested:     !(p.Resent && row.RequestedBy.String == p.RequestedBy),
		AcceptedStateVersion: row.CancelStateVersion.Int64,
		PublishedMessageID:   fromNullString(row.CancelPublishedMessageID),
		ResumeCheckpointID:   row.ResumeCheckpointID.String,
	}
}

// lastMessage is the id of a checkpoint's last message (nil if it has none).
func lastMessage(cp chat.Checkpoint) *string {
	if n := len(cp.MessageIDs); n > 0 {
		return &cp.MessageIDs[n-1]
	}
	return nil
}

// cancelRecord is an accepted cancel as recorded: what RequestCancel
// decides in its transaction, or what the cancel journal decided and
// acknowledged before the writer records it (canceljournal.go).
type cancelRecord struct {
	RunID              string  `json:"run_id"`
	ThreadID           string  `json:"thread_id"`
	UserID             string  `json:"user_id"`
	Reason             string  `json:"reason"`
	RequestedBy        string  `json:"requested_by"`
	At                 int64   `json:"at"` // ms
	StateVersion       int64   `json:"state_version"`
	ResumeCheckpointID string  `json:"resume_checkpoint_id"`
	PublishedMessageID *string `json:"published_message_id"`
	AuditID            string  `json:"audit_id"`
}

func (r cancelRecord) ack() chat.CancelAck {
	return chat.CancelAck{
		RunID: r.RunID, Status: chat.RunCancelRequested, AcceptedStateVersion: r.StateVersion,
		ResumeCheckpointID: r.ResumeCheckpointID, PublishedMessageID: r.PublishedMessageID,
	}
}

// cancelNow records the cancel of row, a run of c's thread whose cancel
// was not accepted yet, decided in this transaction: resume point the
// head, its last message the one published before the cancel.
func (t *txn) cancelNow(c *threadCursor, row runRow, userID, reason, requestedBy string) (chat.CancelAck, error) {
	head, err := t.checkpoint(row.ThreadID, c.row.HeadCheckpointID)
	if err != nil {
		return chat.CancelAck{}, err
	}
	return t.recordCancel(c, row, cancelRecord{
		RunID: row.RunID, ThreadID: row.ThreadID, UserID: userID, Reason: reason,
		RequestedBy: requestedBy, At: ms(t.now), StateVersion: c.row.StateVersion + 1,
		ResumeCheckpointID: head.CheckpointID, PublishedMessageID: lastMessage(head), AuditID: chat.NewID("aud_"),
	})
}

// recordCancel records rec for row, a run of c's thread whose cancel was
// not accepted yet: status cancel_requested, its event (which takes the
// thread's next state_version) and the audit row. It answers the ack the
// database now holds, which is rec's unless the thread's version moved
// since rec was decided.
func (t *txn) recordCancel(c *threadCursor, row runRow, rec cancelRecord) (chat.CancelAck, error) {
	ev := t.event(c, chat.EventRunCancelRequested, row.RunID)
	ev.Body = chat.RunCancelRequestedBody{Reason: rec.Reason, RequestedBy: rec.RequestedBy}
	if err := transition(row, chat.RunCancelRequested); err != nil {
		return chat.CancelAck{}, err
	}
	t.runChanged(row.RunID)
	if _, err := t.exec(`UPDATE runs SET status = 'cancel_requested', cancel_requested_at = ?,
		cancel_reason = ?, requested_by = ?, cancel_state_version = ?, cancel_published_message_id = ?,
		resume_checkpoint_id = ?, updated_at = ? WHERE run_id = ?`,
		rec.At, rec.Reason, rec.RequestedBy, ev.StateVersion, nullStrPtr(rec.PublishedMessageID), rec.ResumeCheckpointID,
		ms(t.now), row.RunID); err != nil {
		return chat.CancelAck{}, fmt.Errorf("record cancel: %w", err)
	}
	if err := t.append(ev); err != nil {
		return chat.CancelAck{}, err
	}
	rec.StateVersion = ev.StateVersion
	ack := rec.ack()
	return ack, t.auditCancel(rec.UserID, row, ack, rec.RequestedBy, rec.Reason, rec.At, rec.AuditID)
}

// auditCancel writes the audit row of one cancel request.
func (t *txn) auditCancel(userID string, row runRow, ack chat.CancelAck, requestedBy, reason string, at int64,
	auditID string,
) error {
	_, err := t.exec(
		`INSERT INTO cancel_audit (audit_id, run_id, thread_id, user_id, requested_by, reason, requested_at,
		accepted_state_version, already_requested) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		auditID, row.RunID, row.ThreadID, userID, requestedBy, reason, at,
		ack.AcceptedStateVersion, ack.AlreadyRequested,
	)
	if err != nil {
		return fmt.Errorf("write cancel audit: %w", err)
	}
	return nil
}
