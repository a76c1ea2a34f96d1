package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// Retention is the store's part that ages out what each artifact class
// keeps no longer (the engine's maintenance loop calls it on its purge
// tick). A value, safe for concurrent use, valid until the store is
// closed. Each class ages out by its own method taking the cutoff (what is
// older than before goes):
//
//   - PurgeStream: the stream buffer (deltas), per thread a prefix of seqs;
//     the thread's stream purge mark records what went.
//   - PurgeEvents: the event log, per thread a prefix of seqs; a thread's
//     watermark records what went (see below).
//   - PurgeCancelAudit: cancel audit rows of finished runs.
//   - RedactDeletedDrafts: the text of deleted drafts; the row stays.
//   - RedactDeletedThreads: the text of deleted threads (their messages
//     and title); the rows stay.
//
// None of them changes conversation state: no state_version bump, no event.
// Each works in short write transactions of at most purgeBatch rows and
// stops after purgeMaxBatches of them; what is left goes at the next call.

type Retention struct{ s *Store }

// Retention returns the store's retention.
func (s *Store) Retention() Retention { return Retention{s: s} }

var (
	purgeBatch      = 1000
	purgeMaxBatches = 100
)

const terminalStatuses = `('completed', 'failed', 'cancelled')`

// PurgeEvents deletes, per thread, the oldest durable events with ts before
// before, as a prefix of seqs that stops
//
//   - at the first event not older than before,
//   - before the first event of a run that is not finished, and
//   - before the thread's last event, which always stays (its state_version
//     is the thread's).
//
// The thread's watermark then says what went: events_purged_through (no
// event with a seq at or below it remains), events_purged_version (that
// event's state_version) and events_purged_ts (the latest ts purged). A
// replay from below the watermark answers with a gap (see Events); Check
// uses it to tell purged from missing. It reports how many events went.
func (r Retention) PurgeEvents(ctx context.Context, before time.Time) (int64, error) {
	s := r.s
	cutoff := ms(before)
	// Threads whose first remaining event could go, read without the
	// writer; each is checked again in the write transaction.
	list := func(after string) ([]string, error) {
		var threads []string
		err := s.reader.SelectContext(ctx, &threads, s.reader.Rebind(`SELECT t.thread_id FROM threads t
			JOIN events f ON f.thread_id = t.thread_id AND f.seq = (SELECT MIN(e.seq) FROM events e
				WHERE e.thread_id = t.thread_id AND e.seq > t.events_purged_through)
			LEFT JOIN runs r ON r.run_id = f.run_id
			WHERE t.thread_id > ? AND t.created_at < ? AND f.ts < ?
			AND (r.run_id IS NULL OR r.status IN `+terminalStatuses+`)
			AND f.seq < (SELECT MAX(e.seq) FROM events e WHERE e.thread_id = t.thread_id)
			ORDER BY t.thread_id LIMIT ?`), after, cutoff, cutoff, purgeBatch)
		if err != nil {
			return nil, fmt.Errorf("find threads to purge: %w", err)
		}
		return threads, nil
	}
	return purgeByThread(ctx, s, list, func(id string) string { return id },
		func(t *txn, id string, budget int64) (int64, bool, error) {
			return t.purgeThreadEvents(id, cutoff, budget)
		})
}

// purgeByThread runs one retention class thread by thread, in write
// transactions of at most purgeBatch rows and at most purgeMaxBatches of
// them: list returns the next threads with something to purge after a
// thread id (read without the writer, in id order), purge removes at most
// budget rows of one of them inside the transaction and reports whether
// the budget ran out before it was done. It reports how many rows went.
func purgeByThread[T any](ctx context.Context, s *Store, list func(after string) ([]T, error), id func(T) string,
	purge func(t *txn, thread T, budget int64) (int64, bool, error)) (int64, error) {
	var total int64
	batches := 0
	from := ""
	for batches < purgeMaxBatches {
		threads, err := list(from)
		if err != nil {
			return total, err
		}
		if len(threads) == 0 {
			break
		}
		from = id(threads[len(threads)-1])
		for i := 0; i < len(threads) && batches < purgeMaxBatches; batches++ {
			var n int64
			start := i
			err := s.write(ctx, func(t *txn) error {
				i, n = start, 0 // from scratch when run again
				for i < len(threads) && n < int64(purgeBatch) {
					d, more, err := purge(t, threads[i], int64(purgeBatch)-n)
					if err != nil {
						return err
					}
					n += d
					if !more {
						i++
					}
				}
				return nil
			})
			if err != nil {
				return total, err
			}
			total += n
		}
		if len(threads) < purgeBatch {
			break
		}
	}
	return total, nil
}

// purgeThreadEvents deletes at most budget events of one thread's purgeable
// prefix and moves its watermark; more reports that the budget ran out.
func (t *txn) purgeThreadEvents(threadID string, cutoff, budget int64) (int64, bool, error) {
	var mark struct {
		Through int64 `db:"events_purged_through"`
		TS      int64 `db:"events_purged_ts"`
	}
	err := t.get(
		&mark,
		`SELECT events_purged_through, events_purged_ts FROM threads WHERE thread_id = ?`+t.skipLocked(),
		threadID,
	)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil // busy (PostgreSQL: another transaction holds it): the next pass purges it
	}
	if err != nil {
		return 0, false, fmt.Errorf("load purge watermark: %w", err)
	}
	var bounds struct {
		Last   sql.NullInt64 `db:"last_seq"`
		Young  sql.NullInt64 `db:"young_seq"`
		Active sql.NullInt64 `db:"active_seq"`
	}
	if err := t.get(&bounds, `SELECT
		(SELECT MAX(seq) FROM events WHERE thread_id = ?) AS last_seq,
		(SELECT seq FROM events WHERE thread_id = ? AND seq > ? AND ts >= ? ORDER BY seq LIMIT 1) AS young_seq,
		(SELECT MIN(e.seq) FROM runs r JOIN events e ON e.run_id = r.run_id AND e.thread_id = r.thread_id
			WHERE r.thread_id = ? AND r.status NOT IN `+terminalStatuses+`
			AND e.run_id IS NOT NULL) AS active_seq`, // e.run_id IS NOT NULL: events_by_run is partial
		threadID, threadID, mark.Through, cutoff, threadID); err != nil {
		return 0, false, fmt.Errorf("bound purge: %w", err)
	}
	if !bounds.Last.Valid {
		return 0, false, nil
	}
	upTo := bounds.Last.Int64 - 1
	if bounds.Young.Valid {
		upTo = min(upTo, bounds.Young.Int64-1)
	}
	if bounds.Active.Valid {
		upTo = min(upTo, bounds.Active.Int64-1)
	}
	var rows []struct {
		Seq          int64 `db:"seq"`
		StateVersion int64 `db:"state_version"`
		TS           int64 `db:"ts"`
	}
	if err := t.sel(&rows, `SELECT seq, state_version, ts FROM events WHERE thread_id = ? AND seq > ? AND seq <= ?
		ORDER BY seq LIMIT ?`, threadID, mark.Through, upTo, budget); err != nil {
		return 0, false, fmt.Errorf("list events to purge: %w", err)
	}
	if len(rows) == 0 {
		return 0, false, nil
	}
	last := rows[len(rows)-1]
	maxTS := mark.TS
	for _, r := range rows {
		maxTS = max(maxTS, r.TS)
	}
	res, err := t.exec(
		`DELETE FROM events WHERE thread_id = ? AND seq > ? AND seq <= ?`,
		threadID, mark.Through, last.Seq,
	)
	if err != nil {
		return 0, false, fmt.Errorf("purge events: %w", err)
	}
	if n, _ := res.RowsAffected(); n != int64(len(rows)) {
		return 0, false, fmt.Errorf("purge events of thread %s: deleted %d, expected %d", threadID, n, len(rows))
	}
	if _, err := t.exec(`UPDATE threads SET events_purged_through = ?, events_purged_version = ?, events_purged_ts = ?
		WHERE thread_id = ?`, last.Seq, last.StateVersion, maxTS, threadID); err != nil {
		return 0, false, fmt.Errorf("move purge watermark: %w", err)
	}
	return int64(len(rows)), int64(len(rows)) == budget, nil
}

// PurgeStream deletes the stream buffer's deltas older than before, per
// thread as a prefix of seqs: every delta of a thread up to its newest one
// older than before (a newer delta among them goes too: one thread's deltas
// are written in seq order, so that is rare), and moves the thread's
// deltas_purged_through to that seq, so the log records the absence
// (invariant 8) and a replay from before it answers with a snapshot. It
// reports how many deltas went. History never depends on them.
func (r Retention) PurgeStream(ctx context.Context, before time.Time) (int64, error) {
	s := r.s
	cutoff := ms(before)
	type thread struct {
		ThreadID string `db:"thread_id"`
		UpTo     int64  `db:"up_to"`
	}
	// Threads with deltas to purge and how far, read without the writer;
	// each is bounded again in its write transaction.
	list := func(after string) ([]thread, error) {
		var threads []thread
		if err := s.reader.SelectContext(ctx, &threads, s.reader.Rebind(`SELECT thread_id, MAX(last_seq) AS up_to
			FROM stream_batches
			WHERE ts < ? AND thread_id > ? GROUP BY thread_id ORDER BY thread_id
			LIMIT ?`), cutoff, after, purgeBatch); err != nil {
			return nil, fmt.Errorf("find deltas to purge: %w", err)
		}
		return threads, nil
	}
	return purgeByThread(ctx, s, list, func(th thread) string { return th.ThreadID },
		func(t *txn, th thread, budget int64) (int64, bool, error) {
			n, more, err := t.purgeThreadDeltas(th.ThreadID, th.UpTo, budget)
			t.buffered -= n
			return n, more, err
		})
}

// purgeThreadDeltas deletes at most budget of one thread's deltas with seq
// up to upTo, oldest first, and moves its stream purge mark; more reports
// that the budget ran out.
func (t *txn) purgeThreadDeltas(threadID string, upTo, budget int64) (int64, bool, error) {
	var through int64
	err := t.get(&through, `SELECT deltas_purged_through FROM threads WHERE thread_id = ?`+t.skipLocked(), threadID)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil // busy (PostgreSQL: another transaction holds it), or gone: the next pass sees it
	}
	if err != nil {
		return 0, false, fmt.Errorf("load stream purge mark: %w", err)
	}
	// Whole batches, oldest first, as many as hold at most budget deltas
	// (at least one).
	var batches []struct {
		FirstSeq int64 `db:"first_seq"`
		LastSeq  int64 `db:"last_seq"`
	}
	if err := t.sel(&batches, `SELECT first_seq, last_seq FROM stream_batches WHERE thread_id = ? AND last_seq <= ?
		ORDER BY first_seq LIMIT ?`,
		threadID, upTo, budget); err != nil {
		return 0, false, fmt.Errorf("list deltas to purge: %w", err)
	}
	if len(batches) == 0 {
		return 0, false, nil
	}
	var n int64
	last, taken := batches[0].LastSeq, 0
	for _, b := range batches {
		size := b.LastSeq - b.FirstSeq + 1
		if n > 0 && n+size > budget {
			break
		}
		n, last, taken = n+size, b.LastSeq, taken+1
	}
	more := last < upTo && (taken < len(batches) || int64(len(batches)) == budget)
	if _, err := t.exec(`DELETE FROM stream_batches WHERE thread_id = ? AND last_seq <= ?`,
		threadID, last); err != nil {
		return 0, false, fmt.Errorf("purge deltas: %w", err)
	}
	if _, err := t.exec(`UPDATE threads SET deltas_purged_through = ? WHERE thread_id = ?
		AND deltas_purged_through < ?`,
		last, threadID, last); err != nil {
		return 0, false, fmt.Errorf("move stream purge mark: %w", err)
	}
	return n, more, nil
}

// PurgeCancelAudit deletes cancel audit rows requested before before whose
// run is finished, and reports how many went.
func (r Retention) PurgeCancelAudit(ctx context.Context, before time.Time) (int64, error) {
	return inPurgeBatches(func() (int64, bool, error) {
		var n int64
		err := r.s.write(ctx, func(t *txn) error {
			res, err := t.exec(`DELETE FROM cancel_audit WHERE audit_id IN (SELECT a.audit_id FROM cancel_audit a
				JOIN runs r ON r.run_id = a.run_id
				WHERE a.requested_at < ? AND r.status IN `+terminalStatuses+` ORDER BY a.requested_at LIMIT ?)`,
				ms(before), purgeBatch)
			if err != nil {
				return fmt.Errorf("purge cancel audit: %w", err)
			}
			n, err = res.RowsAffected()
			return err
		})
		return n, n < int64(purgeBatch), err
	})
}

// inPurgeBatches calls batch (one short write transaction) until it
// reports that it was the last or purgeMaxBatches have run, and returns
// the sum of what each counted; on an error, what the batches before it
// counted.
func inPurgeBatches(batch func() (n int64, last bool, err error)) (int64, error) {
	var total int64
	for range purgeMaxBatches {
		n, last, err := batch()
		if err != nil {
			return total, err
		}
		total += n
		if last {
			break
		}
	}
	return total, nil
}

// RedactDeletedDrafts purges the text of drafts deleted before before: the
// message's content and the content in its message.published event become
// "" (ids, fragment_of and the event stay, so every invariant still holds)
// and redacted_at is set. A draft whose id is in the head checkpoint of its
// thread or of a fork of it is history again and keeps its text. It reports
// how many drafts were redacted.
func (r Retention) RedactDeletedDrafts(ctx context.Context, before time.Time) (int64, error) {
	var afterAt int64 = -1 << 62
	afterID := ""
	return inPurgeBatches(func() (int64, bool, error) {
		var n, seen int
		fromAt, fromID := afterAt, afterID
		err := r.s.write(ctx, func(t *txn) error {
			n, seen, afterAt, afterID = 0, 0, fromAt, fromID // from scratch when run again
			var drafts []struct {
				MessageID string `db:"message_id"`
				ThreadID  string `db:"thread_id"`
				DeletedAt int64  `db:"deleted_at"`
			}
			if err := t.sel(&drafts, `SELECT message_id, thread_id, deleted_at FROM messages
				WHERE deleted_at IS NOT NULL AND redacted_at IS NULL AND kind = ? AND deleted_at < ?
				AND (deleted_at > ? OR (deleted_at = ? AND message_id > ?))
				ORDER BY deleted_at, message_id LIMIT ?`,
				chat.KindFragment, ms(before), afterAt, afterAt, afterID, purgeBatch); err != nil {
				return fmt.Errorf("find deleted drafts: %w", err)
			}
			seen = len(drafts)
			for _, d := range drafts {
				afterAt, afterID = d.DeletedAt, d.MessageID
				inHead, err := t.inSomeHead(d.ThreadID, d.MessageID)
				if errors.Is(err, errLineageBusy) {
					continue // the next pass
				}
				if err != nil {
					return err
				}
				if inHead {
					continue
				}
				if err := t.redactMessage(d.ThreadID, d.MessageID); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		return int64(n), seen < purgeBatch, err
	})
}

// inSomeHead reports whether a message of threadID is in the head
// checkpoint of that thread or of a thread forked from it (at any depth),
// leaving out deleted threads: only those copy its id, and a deleted
// thread's history is nobody's any more. On PostgreSQL those threads stay locked until the
// redaction commits, so no other instance moves a head back onto the draft
// in between; when another transaction holds one of those threads it
// answers errLineageBusy (retention never waits for live work: the next
// pass redacts it).
func (t *txn) inSomeHead(threadID, messageID string) (bool, error) {
	lineage := `WITH RECURSIVE lineage (thread_id) AS (
			SELECT thread_id FROM threads WHERE thread_id = ?
			UNION
			SELECT th.thread_id FROM threads th JOIN lineage l ON th.forked_from_thread_id = l.thread_id
		)`
	var heads []threadHead
	if !t.pg {
		if err := t.sel(&heads, lineage+` SELECT th.thread_id, th.head_checkpoint_id FROM lineage l JOIN threads th
			ON th.thread_id = l.thread_id
			WHERE th.deleted_at IS NULL`, threadID); err != nil {
			return false, fmt.Errorf("find heads holding a draft: %w", err)
		}
		return t.headsHold(heads, messageID)
	}
	// PostgreSQL: lock the lineage, then read the heads in a statement of
	// their own (one that waited for a lock would see the other rows as
	// they were before). A fork locks its source first, so once every
	// thread of the lineage is locked the lineage cannot grow; it is read
	// again until it stops growing.
	locked := map[string]bool{}
	for range 8 {
		var ids []string
		if err := t.sel(&ids, lineage+` SELECT thread_id FROM lineage`, threadID); err != nil {
			return false, fmt.Errorf("find the draft's lineage: %w", err)
		}
		var fresh []string
		for _, id := range ids {
			if !locked[id] {
				fresh = append(fresh, id)
			}
		}
		if len(fresh) == 0 {
			q, args, err := sqlx.In(`SELECT thread_id, head_checkpoint_id FROM threads
				WHERE thread_id IN (?) AND deleted_at IS NULL`, ids)
			if err != nil {
				return false, err
			}
			if err := t.sel(&heads, q, args...); err != nil {
				return false, fmt.Errorf("find heads holding a draft: %w", err)
			}
			return t.headsHold(heads, messageID)
		}
		q, args, err := sqlx.In(
			`SELECT thread_id FROM threads WHERE thread_id IN (?) ORDER BY thread_id FOR UPDATE SKIP LOCKED`,
			fresh,
		)
		if err != nil {
			return false, err
		}
		var got []string
		if err := t.sel(&got, q, args...); err != nil {
			return false, fmt.Errorf("lock the draft's lineage: %w", err)
		}
		if len(got) < len(fresh) {
			return false, errLineageBusy
		}
		for _, id := range got {
			locked[id] = true
		}
	}
	return false, errLineageBusy // still growing
}

// errLineageBusy: inSomeHead could not tell now (PostgreSQL: a thread of
// the lineage is locked by live work, or the lineage kept growing); the
// message is left for the next pass.
var errLineageBusy = errors.New("the lineage is busy: try at the next pass")

// threadHead is a thread and its head checkpoint.
type threadHead struct {
	ThreadID string `db:"thread_id"`
	HeadID   string `db:"head_checkpoint_id"`
}

// headsHold reports whether any of heads holds messageID in its message
// ids.
func (t *txn) headsHold(heads []threadHead, messageID string) (bool, error) {
	for _, h := range heads {
		cp, err := t.checkpoint(h.ThreadID, h.HeadID)
		if err != nil {
			return false, fmt.Errorf("head of thread %s: %w", h.ThreadID, err)
		}
		if slices.Contains(cp.MessageIDs, messageID) {
			return true, nil
		}
	}
	return false, nil
}

// RedactDeletedThreads empties the text of threads deleted before before:
// every message of the thread that is not in the head of a live fork of it
// (redactMessage: its content and its message.published event's content
// become "", ids stay), and its title. The thread is then marked redacted
// (redacted_at) and not visited again: a message a fork's head still held
// keeps its text. Deltas go with the stream buffer's own TTL. It reports
// how many threads were redacted.
func (r Retention) RedactDeletedThreads(ctx context.Context, before time.Time) (int64, error) {
	return inPurgeBatches(func() (int64, bool, error) {
		var n int
		err := r.s.write(ctx, func(t *txn) error {
			n = 0
			var threads []string
			if err := t.sel(&threads, `SELECT thread_id FROM threads WHERE deleted_at IS NOT NULL
				AND redacted_at IS NULL
				AND deleted_at < ? ORDER BY deleted_at, thread_id LIMIT ?`, ms(before), 16); err != nil {
				return fmt.Errorf("find deleted threads: %w", err)
			}
			budget := purgeBatch
		threads:
			for _, id := range threads {
				var msgs []string
				if err := t.sel(&msgs, `SELECT message_id FROM messages WHERE thread_id = ? AND redacted_at IS NULL
					ORDER BY message_id`, id); err != nil {
					return fmt.Errorf("find messages of deleted thread %s: %w", id, err)
				}
				if len(msgs) > budget && n > 0 {
					break // the next transaction takes it whole
				}
				for _, m := range msgs {
					held, err := t.inSomeHead(id, m)
					if errors.Is(err, errLineageBusy) {
						continue threads // the next pass, whole
					}
					if err != nil {
						return err
					}
					if held {
						continue
					}
					if err := t.redactMessage(id, m); err != nil {
						return err
					}
				}
				budget -= len(msgs)
				if err := t.redactResponses(id); err != nil {
					return err
				}
				if _, err := t.exec(`UPDATE threads SET title = ?, redacted_at = ? WHERE thread_id = ?`,
					deletedTitle, ms(t.now), id); err != nil {
					return fmt.Errorf("redact deleted thread %s: %w", id, err)
				}
				n++
			}
			return nil
		})
		return int64(n), n == 0, err
	})
}

// deletedTitle replaces a deleted thread's title when its text is emptied.
const deletedTitle = "Deleted conversation"

// redactMessage empties a message's text in its row and in its
// message.published event (when the event log still holds it).
func (t *txn) redactMessage(threadID, messageID string) error {
	if _, err := t.exec(`UPDATE messages SET content = '', redacted_at = ? WHERE message_id = ?`,
		ms(t.now), messageID); err != nil {
		return fmt.Errorf("redact message: %w", err)
	}
	var evs []struct {
		Seq     int64  `db:"seq"`
		Payload string `db:"payload"`
	}
	if err := t.sel(&evs, `SELECT seq, payload FROM events WHERE thread_id = ? AND message_id = ? AND type = ?`,
		threadID, messageID, chat.EventMessagePublished); err != nil {
		return fmt.Errorf("load draft event: %w", err)
	}
	for _, ev := range evs {
		payload, err := redactPublished([]byte(ev.Payload))
		if err != nil {
			return fmt.Errorf("redact message.published seq %d of thread %s: %w", ev.Seq, threadID, err)
		}
		if _, err := t.exec(`UPDATE events SET payload = ? WHERE thread_id = ? AND seq = ?`,
			string(payload), threadID, ev.Seq); err != nil {
			return fmt.Errorf("redact draft event: %w", err)
		}
	}
	return nil
}

// redactPublished returns a message.published payload with the message's
// content "" and everything else unchanged. It re-encodes the event as the
// store writes it (same field order); a payload that does not round-trip
// so is rewritten field by field instead.
func redactPublished(payload []byte) ([]byte, error) {
	var want map[string]any
	if err := json.Unmarshal(payload, &want); err != nil {
		return nil, err
	}
	msg, ok := want["message"].(map[string]any)
	if !ok {
		return nil, errors.New("no message object")
	}
	msg["content"] = ""

	var p struct {
		chat.EventHeader
		chat.MessagePublishedBody
	}
	if err := json.Unmarshal(payload, &p); err == nil {
		p.Message.Content = ""
		ev := p.EventHeader.Event(p.MessagePublishedBody)
		if err := ev.Encode(); err == nil {
			var got map[string]any
			if json.Unmarshal(ev.Raw, &got) == nil && reflect.DeepEqual(got, want) {
				return ev.Raw, nil
			}
		}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(payload, &fields); err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(fields["message"], &m); err != nil {
		return nil, err
	}
	m["content"] = json.RawMessage(`""`)
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	fields["message"] = b
	return json.Marshal(fields)
}
