package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/honestcancel/gateway/chat"
)

// The message queue (chat/queue.go, docs/protocol.md "Message queue").
//
// Items live in queue_items; the thread's pause in
// threads.queue_paused_reason. Every change is a queue.updated event in the
// transaction that makes it, so the queue replays like every other piece
// of thread state. A run's end and the start of the next item are one
// transaction (planAfterEnd and its do, called by finish and finishCancel): an item
// starts at most once, never after it was removed (both are state changes
// of its row under the thread's lock: the writer's on SQLite, the thread
// row's FOR UPDATE on PostgreSQL), and a start never sees a half-made
// edit.

// queueItemRow is one row of queue_items.
type queueItemRow struct {
	ItemID          string         `db:"item_id"`
	ThreadID        string         `db:"thread_id"`
	Ord             int            `db:"ord"`
	UserMessage     string         `db:"user_message"`
	Mode            string         `db:"mode"`
	RequestedBy     string         `db:"requested_by"`
	ClientRequestID sql.NullString `db:"client_request_id"`
	State           string         `db:"state"`
	RunID           sql.NullString `db:"run_id"`
	CreatedAt       int64          `db:"created_at"`
	UpdatedAt       int64          `db:"updated_at"`
}

const queueItemCols = `item_id, thread_id, ord, user_message, mode, requested_by, client_request_id, state, run_id,
	created_at, updated_at`

// States of a queue item.
const (
	itemWaiting = "waiting"
	itemStarted = "started"
	itemRemoved = "removed"
)

func (r queueItemRow) item() chat.QueueItem {
	return chat.QueueItem{
		ItemID: r.ItemID, UserMessage: r.UserMessage, Mode: r.Mode, RequestedBy: r.RequestedBy,
		CreatedAt: fromMS(r.CreatedAt),
	}
}

// threadQueue is a thread's queue as one transaction reads it.
type threadQueue struct {
	items  []queueItemRow // waiting, in order
	paused sql.NullString
}

func (q threadQueue) wire() chat.Queue {
	out := chat.Queue{Items: make([]chat.QueueItem, 0, len(q.items)), Paused: q.paused.Valid}
	for _, r := range q.items {
		out.Items = append(out.Items, r.item())
	}
	if q.paused.Valid {
		reason := q.paused.String
		out.PausedReason = &reason
	}
	return out
}

// readQueue reads a thread's queue.
func readQueue(ctx context.Context, q queryer, threadID string) (threadQueue, error) {
	var out threadQueue
	if err := q.SelectContext(ctx, &out.items, q.Rebind(`SELECT `+queueItemCols+` FROM queue_items
		WHERE thread_id = ? AND state = 'waiting' ORDER BY ord`), threadID); err != nil {
		return out, fmt.Errorf("read the queue: %w", err)
	}
	if err := q.GetContext(ctx, &out.paused, q.Rebind(`SELECT queue_paused_reason FROM threads WHERE thread_id = ?`),
		threadID); err != nil {
		return out, fmt.Errorf("read the queue's pause: %w", err)
	}
	return out, nil
}

func (t *txn) queue(threadID string) (threadQueue, error) {
	return readQueue(t.ctx, t.tx, threadID)
}

// queueChanged writes q as the thread's queue: the order of its items,
// its pause, and the queue.updated event that tells every tab.
func (t *txn) queueChanged(c *threadCursor, q threadQueue) error {
	for i, it := range q.items {
		if it.Ord == i+1 {
			continue
		}
		if _, err := t.exec(`UPDATE queue_items SET ord = ?, updated_at = ? WHERE item_id = ?`,
			i+1, ms(t.now), it.ItemID); err != nil {
			return fmt.Errorf("order the queue: %w", err)
		}
		q.items[i].Ord = i + 1
	}
	if len(q.items) == 0 {
		// A pause holds back what was queued when a run stopped; once
		// nothing is left, a message queued next is a new request.
		q.paused = sql.NullString{}
	}
	if _, err := t.exec(`UPDATE threads SET queue_paused_reason = ? WHERE thread_id = ?`,
		q.paused, c.row.ThreadID); err != nil {
		return fmt.Errorf("pause the queue: %w", err)
	}
	ev := t.event(c, chat.EventQueueUpdated, "")
	ev.Body = chat.QueueUpdatedBody{Queue: q.wire()}
	return t.append(ev)
}

// startItem starts the queue's item it as a run on the thread's head, as
// run.start with its text would, and marks it started: one step. It
// answers the new run's id.
func (t *txn) startItem(c *threadCursor, it queueItemRow) (string, error) {
	head, err := t.checkpoint(c.row.ThreadID, c.row.HeadCheckpointID)
	if err != nil {
		return "", err
	}
	text := it.UserMessage
	runID, base, ev, err := t.startOn(c, head, &text, "", it.ItemID)
	if err != nil {
		return "", err
	}
	ev.Body = chat.RunStartedBody{BaseCheckpointID: base.CheckpointID, Status: chat.RunQueued, Attempt: 1,
		QueueItemID: it.ItemID}
	if err := t.append(ev); err != nil {
		return "", err
	}
	res, err := t.exec(`UPDATE queue_items SET state = 'started', run_id = ?, updated_at = ?
		WHERE item_id = ? AND state = 'waiting'`, runID, ms(t.now), it.ItemID)
	if err != nil {
		return "", fmt.Errorf("start the queued message: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return "", fmt.Errorf("queue item %s is no longer waiting", it.ItemID)
	}
	t.queueStarted = true
	return runID, nil
}

// afterEnd is what a run's end does to its thread's queue, decided before
// the end's event is written (its receipt counts what waits) and done
// after it (the next run's events follow the end's).
type afterEnd struct {
	q       threadQueue
	start   bool   // the first item starts
	pause   string // the queue pauses, why ("" it does not)
	waiting int    // items left waiting once it is done
}

// planAfterEnd decides what a run's end does to the queue: status is the
// run's terminal status, reason its cancel's reason.
//   - completed: the first item starts, unless the queue is paused;
//   - cancelled: a first item that is an interrupt starts (the user asked
//     for it to replace the run); the rest pause unless the cancel was that
//     interrupt's (reason interrupted, and its item is the one starting);
//   - failed: the queue pauses.
func (t *txn) planAfterEnd(c *threadCursor, status chat.RunStatus, reason string) (afterEnd, error) {
	if c.row.DeletedAt.Valid {
		return afterEnd{}, nil
	}
	q, err := t.queue(c.row.ThreadID)
	if err != nil || len(q.items) == 0 {
		return afterEnd{q: q}, err
	}
	p := afterEnd{q: q, waiting: len(q.items)}
	switch status {
	case chat.RunCompleted:
		p.start = !q.paused.Valid
	case chat.RunCancelled:
		p.start = q.items[0].Mode == chat.QueueInterrupt
		// Only the interrupt's own cancel, whose item starts now, leaves
		// the rest going. (Its item removed before the cancel ended, the
		// cancel pauses what is left like any Stop: an unpaused queue with
		// no run would wait for nothing, and the next message added would
		// start ahead of it.)
		if !q.paused.Valid && !(p.start && reason == chat.ReasonInterrupted) {
			p.pause = chat.PausedRunCancelled
		}
	case chat.RunFailed:
		if !q.paused.Valid {
			p.pause = chat.PausedRunFailed
		}
	}
	if p.start {
		p.waiting--
	}
	return p, nil
}

// do carries the plan out (after the end's event).
func (p afterEnd) do(t *txn, c *threadCursor) error {
	if !p.start && p.pause == "" {
		return nil
	}
	q := p.q
	if p.start {
		if _, err := t.startItem(c, q.items[0]); err != nil {
			return err
		}
		q.items = q.items[1:]
	}
	if p.pause != "" {
		q.paused = sql.NullString{String: p.pause, Valid: true}
	}
	return t.queueChanged(c, q)
}

// pauseQueue pauses a thread's queue that holds items (a head move:
// what was queued was written against another point of the conversation).
func (t *txn) pauseQueue(c *threadCursor, reason string) error {
	q, err := t.queue(c.row.ThreadID)
	if err != nil || len(q.items) == 0 || q.paused.Valid {
		return err
	}
	q.paused = sql.NullString{String: reason, Valid: true}
	return t.queueChanged(c, q)
}

// activeRun is the thread's run that has not ended (nil: none).
func (t *txn) activeRun(threadID string) (*runRow, error) {
	var row runRow
	err := t.get(&row, `SELECT `+runCols+` FROM runs WHERE thread_id = ? AND status IN `+activeStatuses+t.forUpdate(),
		threadID)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up the active run: %w", err)
	}
	return &row, nil
}

// checkExpected checks an optional expected_state_version.
func (t *txn) checkExpected(c *threadCursor, expected *int64) error {
	if expected == nil {
		return nil
	}
	return t.checkVersion(c, *expected, "")
}

// QueueAdd performs queue.add. With no active run and the queue not
// paused (or an interrupt item) the item starts at once as a run; an
// interrupt item with a run active records that run's cancel (reason
// interrupted, requested by the adder) in the same transaction, and the
// item starts when the cancel is finished (finishCancel). The interrupt,
// when not nil, is the cancel recorded, which the engine must carry to
// the run as after run.cancel.
func (s *Store) QueueAdd(ctx context.Context, p chat.QueueAdd) (chat.QueueAddAck, *chat.Interruption, error) {
	if err := p.Validate(); err != nil {
		return chat.QueueAddAck{}, nil, err
	}
	mode := p.Mode
	if mode == "" {
		mode = chat.QueueAfter
	}
	var ack chat.QueueAddAck
	var interrupt *chat.Interruption
	write := s.write
	if mode == chat.QueueInterrupt {
		write = s.writeUrgent // it cancels: the cancel's lane
	}
	err := write(ctx, func(t *txn) error {
		ack, interrupt = chat.QueueAddAck{}, nil
		c, err := t.thread(p.UserID, p.ThreadID)
		if err != nil {
			return err
		}
		if p.ClientRequestID != "" {
			var row queueItemRow
			err := t.get(&row, `SELECT `+queueItemCols+` FROM queue_items WHERE thread_id = ? AND client_request_id = ?`,
				p.ThreadID, p.ClientRequestID)
			if err == nil {
				ack, err = t.itemAck(c, row)
				return err
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("look up client_request_id: %w", err)
			}
		}
		if err := t.checkExpected(c, p.ExpectedStateVersion); err != nil {
			return err
		}
		q, err := t.queue(p.ThreadID)
		if err != nil {
			return err
		}
		if len(q.items) >= chat.MaxQueueItems {
			return chat.Invalid("the queue of this conversation holds %d messages, the most it may: "+
				"remove one, or wait for the reply to finish", chat.MaxQueueItems)
		}
		active, err := t.activeRun(p.ThreadID)
		if err != nil {
			return err
		}
		row := queueItemRow{
			ItemID: chat.NewID(chat.PrefixQueueItem), ThreadID: p.ThreadID, UserMessage: p.UserMessage, Mode: mode,
			RequestedBy: p.RequestedBy, ClientRequestID: sql.NullString{String: p.ClientRequestID,
				Valid: p.ClientRequestID != ""}, State: itemWaiting, CreatedAt: ms(t.now), UpdatedAt: ms(t.now),
		}
		// Interrupt items go ahead of the after items (after the
		// interrupts already waiting): they are what starts next.
		at := len(q.items)
		if mode == chat.QueueInterrupt {
			at = 0
			for at < len(q.items) && q.items[at].Mode == chat.QueueInterrupt {
				at++
			}
		}
		row.Ord = at + 1
		if _, err := t.exec(`INSERT INTO queue_items (`+queueItemCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			row.ItemID, row.ThreadID, row.Ord, row.UserMessage, row.Mode, row.RequestedBy, row.ClientRequestID,
			row.State, row.RunID, row.CreatedAt, row.UpdatedAt); err != nil {
			return fmt.Errorf("add to the queue: %w", err)
		}
		ack.ItemID = row.ItemID
		if active == nil && (!q.paused.Valid || mode == chat.QueueInterrupt) {
			// Nothing to wait for: it starts now, and the queue as the
			// tabs see it does not change.
			if ack.RunID, err = t.startItem(c, row); err != nil {
				return err
			}
			ack.StateVersion = c.row.StateVersion
			return nil
		}
		q.items = slices.Insert(q.items, at, row)
		ack.Position = at + 1
		if active != nil && mode == chat.QueueInterrupt && !active.status().CancelAccepted() {
			if _, err := t.cancelNow(c, *active, p.UserID, chat.ReasonInterrupted, p.RequestedBy); err != nil {
				return err
			}
			interrupt = &chat.Interruption{RunID: active.RunID, Prev: active.status()}
			ack.Interrupted = active.RunID
		}
		if err := t.queueChanged(c, q); err != nil {
			return err
		}
		ack.StateVersion = c.row.StateVersion
		return nil
	})
	return ack, interrupt, err
}

// itemAck answers a queue.add retried with the same client_request_id:
// the item's place now, or the run it started.
func (t *txn) itemAck(c *threadCursor, row queueItemRow) (chat.QueueAddAck, error) {
	ack := chat.QueueAddAck{ItemID: row.ItemID, StateVersion: c.row.StateVersion, RunID: row.RunID.String}
	if row.State != itemWaiting {
		return ack, nil
	}
	q, err := t.queue(c.row.ThreadID)
	if err != nil {
		return ack, err
	}
	for i, it := range q.items {
		if it.ItemID == row.ItemID {
			ack.Position = i + 1
		}
	}
	return ack, nil
}

// waitingItem finds item id in q (not_found when it is not waiting there:
// unknown, started or removed).
func (t *txn) waitingItem(q threadQueue, threadID, id string) (int, error) {
	for i, it := range q.items {
		if it.ItemID == id {
			return i, nil
		}
	}
	var row queueItemRow
	err := t.get(&row, `SELECT `+queueItemCols+` FROM queue_items WHERE item_id = ? AND thread_id = ?`, id, threadID)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, chat.NotFound("queue item", id)
	case err != nil:
		return 0, fmt.Errorf("look up the queue item: %w", err)
	case row.State == itemStarted:
		return 0, chat.Errorf(chat.CodeNotFound, "queue item %s is no longer in the queue: it was sent as run %s "+
			"(reload the conversation to see it)", id, row.RunID.String).With("run_id", row.RunID.String)
	default:
		return 0, chat.Errorf(chat.CodeNotFound, "queue item %s is no longer in the queue: it was removed", id)
	}
}

// waitingOf loads the user's thread, its queue and the place in it of the
// waiting item itemID, in the protocol's order of refusals: the thread,
// the item (not_found, saying whether it was sent or removed), then the
// expected version.
func (t *txn) waitingOf(userID, threadID, itemID string, expected *int64) (*threadCursor, threadQueue, int, error) {
	c, err := t.thread(userID, threadID)
	if err != nil {
		return nil, threadQueue{}, 0, err
	}
	q, err := t.queue(threadID)
	if err != nil {
		return nil, q, 0, err
	}
	i, err := t.waitingItem(q, threadID, itemID)
	if err != nil {
		return nil, q, 0, err
	}
	return c, q, i, t.checkExpected(c, expected)
}

// QueueUpdate performs queue.update: a waiting item's new text and/or
// place. An item that started (or was removed) in the meantime is
// not_found: it started as it was, or not at all.
func (s *Store) QueueUpdate(ctx context.Context, p chat.QueueUpdate) (chat.QueueItemAck, error) {
	if err := p.Validate(); err != nil {
		return chat.QueueItemAck{}, err
	}
	var ack chat.QueueItemAck
	err := s.write(ctx, func(t *txn) error {
		c, q, i, err := t.waitingOf(p.UserID, p.ThreadID, p.ItemID, p.ExpectedStateVersion)
		if err != nil {
			return err
		}
		it := q.items[i]
		if p.UserMessage != nil {
			it.UserMessage = *p.UserMessage
			if _, err := t.exec(`UPDATE queue_items SET user_message = ?, updated_at = ? WHERE item_id = ?`,
				it.UserMessage, ms(t.now), it.ItemID); err != nil {
				return fmt.Errorf("edit the queued message: %w", err)
			}
		}
		q.items = slices.Delete(q.items, i, i+1)
		to := i
		if p.Position != nil {
			to = min(*p.Position, len(q.items)+1) - 1
		}
		q.items = slices.Insert(q.items, to, it)
		if err := t.queueChanged(c, q); err != nil {
			return err
		}
		ack = chat.QueueItemAck{ItemID: it.ItemID, StateVersion: c.row.StateVersion}
		return nil
	})
	return ack, err
}

// QueueRemove performs queue.remove.
func (s *Store) QueueRemove(ctx context.Context, p chat.QueueRemove) (chat.QueueItemAck, error) {
	if err := p.Validate(); err != nil {
		return chat.QueueItemAck{}, err
	}
	var ack chat.QueueItemAck
	err := s.write(ctx, func(t *txn) error {
		c, q, i, err := t.waitingOf(p.UserID, p.ThreadID, p.ItemID, p.ExpectedStateVersion)
		if err != nil {
			return err
		}
		if _, err := t.exec(`UPDATE queue_items SET state = 'removed', updated_at = ? WHERE item_id = ?`,
			ms(t.now), p.ItemID); err != nil {
			return fmt.Errorf("remove the queued message: %w", err)
		}
		q.items = slices.Delete(q.items, i, i+1)
		if err := t.queueChanged(c, q); err != nil {
			return err
		}
		ack = chat.QueueItemAck{ItemID: p.ItemID, StateVersion: c.row.StateVersion}
		return nil
	})
	return ack, err
}

// QueueResume performs queue.resume: the queue is no longer paused, and
// with no run active its first item starts now. A queue that is not
// paused is left as it is (no event).
func (s *Store) QueueResume(ctx context.Context, p chat.QueueResume) (chat.QueueResumeAck, error) {
	if err := p.Validate(); err != nil {
		return chat.QueueResumeAck{}, err
	}
	var ack chat.QueueResumeAck
	err := s.write(ctx, func(t *txn) error {
		ack = chat.QueueResumeAck{}
		c, err := t.thread(p.UserID, p.ThreadID)
		if err != nil {
			return err
		}
		if err := t.checkExpected(c, p.ExpectedStateVersion); err != nil {
			return err
		}
		q, err := t.queue(p.ThreadID)
		if err != nil {
			return err
		}
		if !q.paused.Valid {
			ack.StateVersion = c.row.StateVersion
			return nil
		}
		q.paused = sql.NullString{}
		// First the queue as resumed (so the log shows every start of an
		// after item behind a queue that was not paused: invariant 11),
		// then, with no run active, its first item's start.
		if err := t.queueChanged(c, q); err != nil {
			return err
		}
		active, err := t.activeRun(p.ThreadID)
		if err != nil {
			return err
		}
		if active == nil && len(q.items) > 0 {
			if ack.RunID, err = t.startItem(c, q.items[0]); err != nil {
				return err
			}
			q.items = q.items[1:]
			if err := t.queueChanged(c, q); err != nil {
				return err
			}
		}
		ack.StateVersion = c.row.StateVersion
		return nil
	})
	return ack, err
}

// QueueStarts is signalled after a commit that started a run from a
// thread's message queue: a run's end, queue.add or queue.resume made a
// queued run that no run.start announced to the engine, whose dispatcher
// then claims it at once rather than at its next poll. Wake-ups coalesce;
// a lost one costs a poll period.
func (s *Store) QueueStarts() <-chan struct{} { return s.queueStarts }

func (s *Store) signalQueueStarts() {
	select {
	case s.queueStarts <- struct{}{}:
	default:
	}
}
