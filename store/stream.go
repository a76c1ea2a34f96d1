package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// SaveFragment rebuilds the text a tab displayed (the streamed message's
// deltas up to last_seq) from the stream buffer and publishes it as a
// message of kind fragment under a new head checkpoint, which keeps the
// parent's pending step.
func (s *Store) SaveFragment(ctx context.Context, p chat.SaveFragment) (chat.FragmentSaved, error) {
	if err := p.Validate(); err != nil {
		return chat.FragmentSaved{}, err
	}
	var out chat.FragmentSaved
	err := s.writeAnswering(ctx, func(t *txn) error {
		c, err := t.thread(p.UserID, p.ThreadID)
		if err != nil {
			return err
		}
		q := p.Text()
		sm, err := t.streamedMessage(q)
		if err != nil {
			return err
		}
		if err := t.checkVersion(c, p.ExpectedStateVersion, ""); err != nil {
			return err
		}
		text, err := t.streamedText(c, q, sm)
		if err != nil {
			return err
		}
		head, err := t.checkpoint(p.ThreadID, c.row.HeadCheckpointID)
		if err != nil {
			return err
		}
		msgID := chat.NewID(chat.PrefixMessage)
		cpID := chat.NewID(chat.PrefixCheckpoint)
		if _, err := t.publishMessage(c, chat.Message{
			MessageID: msgID, Role: chat.RoleAssistant, Kind: chat.KindFragment, Content: text,
			FragmentOf: &chat.FragmentOf{RunID: sm.RunID, MessageID: p.MessageID, LastSeq: p.LastSeq},
		}, cpID, ""); err != nil {
			return err
		}
		cp, err := t.addCheckpoint(c, chat.Checkpoint{
			CheckpointID: cpID, ParentCheckpointID: &head.CheckpointID,
			MessageIDs:     append(append([]string{}, head.MessageIDs...), msgID),
			CompletedSteps: head.CompletedSteps, ToolResults: head.ToolResults, Pending: head.Pending,
		}, "")
		if err != nil {
			return err
		}
		if err := t.pauseQueue(c, chat.PausedHeadMoved); err != nil {
			return err
		}
		out = chat.FragmentSaved{MessageID: msgID, CheckpointID: cp.CheckpointID, StateVersion: c.row.StateVersion}
		return nil
	})
	return out, err
}

// writeAnswering is write for a read of the stream buffer that may answer
// fragment_unavailable: when the transaction itself recorded lost the seqs
// it answers about (their holder did not answer, see streambuf.go), that
// is committed, so the answer holds.
func (s *Store) writeAnswering(ctx context.Context, fn func(t *txn) error) error {
	var unavailable error
	err := s.write(ctx, func(t *txn) error {
		unavailable = nil
		err := fn(t)
		if chat.ErrorCode(err) == chat.CodeFragmentUnavailable && t.wrotePast {
			unavailable, err = err, nil
		}
		return err
	})
	if err == nil {
		err = unavailable
	}
	return err
}

// StreamedText answers what SaveFragment would keep of p's message up to
// p.LastSeq, or the error it would give, and changes nothing. It runs as a
// write so that the deltas this process still holds in memory are written
// first and counted.
func (s *Store) StreamedText(ctx context.Context, p chat.StreamedTextQuery) (chat.StreamedText, error) {
	if err := p.Validate(); err != nil {
		return chat.StreamedText{}, err
	}
	var out chat.StreamedText
	err := s.writeAnswering(ctx, func(t *txn) error {
		c, err := t.thread(p.UserID, p.ThreadID)
		if err != nil {
			return err
		}
		sm, err := t.streamedMessage(p)
		if err != nil {
			return err
		}
		text, err := t.streamedText(c, p, sm)
		if err != nil {
			return err
		}
		out = chat.StreamedText{MessageID: p.MessageID, RunID: sm.RunID, LastSeq: p.LastSeq,
			Content: text, Chars: int64(utf8.RuneCountInString(text))}
		return nil
	})
	return out, err
}

// streamedMessage is the stream buffer's record of p's message.
type streamedMessage struct {
	RunID    string `db:"run_id"`
	FirstSeq int64  `db:"first_seq"`
}

// streamedMessage loads p's message from the stream buffer: not_found when
// it never streamed in p's thread, fragment_unavailable when a crash lost
// every delta of it.
func (t *txn) streamedMessage(p chat.StreamedTextQuery) (streamedMessage, error) {
	var sm streamedMessage
	err := t.get(
		&sm,
		`SELECT run_id, first_seq FROM stream_messages WHERE message_id = ? AND thread_id = ?`,
		p.MessageID, p.ThreadID,
	)
	if errors.Is(err, sql.ErrNoRows) {
		// A message lost whole (streambuf.go): the tab saw seqs that were
		// recorded lost.
		lost, err := firstGap(t.ctx, t.tx, p.ThreadID, p.LastSeq, p.LastSeq)
		switch {
		case err != nil:
			return sm, err
		case lost != nil && lost.Reason == gapWrittenPast:
			return sm, chat.Errorf(chat.CodeFragmentUnavailable, "the streamed text of message %s was lost before "+
				"any of it was written: another instance wrote past this reply's reserved seqs while its holder was "+
				"stalled (seqs %d–%d were never written), so nothing of what you saw can be saved: "+
				"continue from the saved point",
				p.MessageID, lost.First, lost.Last).
				With("cause", chat.CauseWrittenPast)
		case lost != nil:
			return sm, chat.Errorf(chat.CodeFragmentUnavailable, "the streamed text of message %s was lost when the "+
				"server stopped before any of it was written (seqs %d–%d were never written), "+
				"so nothing of what you saw can be saved: continue from the saved point",
				p.MessageID, lost.First, lost.Last).
				With("cause", chat.CauseServerStopped)
		}
		return sm, chat.NotFound("streamed message", p.MessageID)
	}
	if err != nil {
		return sm, fmt.Errorf("load streamed message: %w", err)
	}
	return sm, nil
}

// streamedText rebuilds the text of sm's deltas up to p.LastSeq, exactly,
// or says why it cannot.
func (t *txn) streamedText(c *threadCursor, p chat.StreamedTextQuery, sm streamedMessage) (string, error) {
	if p.LastSeq < sm.FirstSeq {
		return "", chat.Invalid(
			"last_seq %d is before the first delta of message %s (seq %d): nothing of it was displayed",
			p.LastSeq, p.MessageID, sm.FirstSeq,
		)
	}
	if p.LastSeq > c.row.LastSeq {
		return "", chat.Invalid("last_seq %d is beyond the thread's last event (%d)", p.LastSeq, c.row.LastSeq)
	}
	var batches []deltaBatch
	if err := t.sel(&batches, `SELECT `+batchCols+` FROM stream_batches WHERE message_id = ? AND first_seq <= ?
		ORDER BY first_seq`, p.MessageID, p.LastSeq); err != nil {
		return "", fmt.Errorf("load deltas: %w", err)
	}
	deltas, err := expandBatches(batches, func(d bufferedDelta) bool { return d.Seq <= p.LastSeq })
	if err != nil {
		return "", err
	}
	// Seqs recorded lost among the message's (streambuf.go): what the tab
	// saw there is gone, and no fragment is saved across it. (The first seq
	// is a delta, so a gap starts after it.)
	lost, err := firstGap(t.ctx, t.tx, p.ThreadID, sm.FirstSeq, p.LastSeq)
	if err != nil {
		return "", err
	}
	if lost != nil {
		known := deltas
		for len(known) > 0 && known[len(known)-1].Seq >= lost.First {
			known = known[:len(known)-1]
		}
		if n := len(known); n > 0 && known[0].Part == 0 && known[n-1].Part == n-1 {
			end := known[n-1].Seq
			if lost.Reason == gapWrittenPast {
				return "", chat.Errorf(chat.CodeFragmentUnavailable, "the streamed text of message %s after seq %d "+
					"was lost: another instance wrote past this reply's reserved seqs while its holder was stalled "+
					"(seqs %d–%d were never written), so what you saw cannot be saved exactly: "+
					"what is still known ends at seq %d (save with last_seq %d), "+
					"or continue from the saved point",
					p.MessageID, end, lost.First, lost.Last, end, end).
					With("cause", chat.CauseWrittenPast).
					With("known_last_seq", end)
			}
			return "", chat.Errorf(chat.CodeFragmentUnavailable, "the streamed text of message %s after seq %d was "+
				"lost when the server stopped (seqs %d–%d were never written), "+
				"so what you saw cannot be saved exactly: what is still known ends at seq %d "+
				"(save with last_seq %d), or continue from the saved point",
				p.MessageID, end, lost.First, lost.Last, end, end).
				With("cause", chat.CauseServerStopped).
				With("known_last_seq", end)
		}
		deltas = nil // what is before the gap is not whole either
	}
	if len(deltas) == 0 || deltas[0].Part != 0 || deltas[len(deltas)-1].Part != len(deltas)-1 {
		return "", chat.Errorf(chat.CodeFragmentUnavailable, "the streamed text of message %s is no longer "+
			"buffered, so it cannot be saved exactly: continue from the saved point instead", p.MessageID).
			With("cause", chat.CauseExpired)
	}
	var b strings.Builder
	for _, d := range deltas {
		b.WriteString(d.Text)
	}
	return b.String(), nil
}

// streamGap is one stream_gaps row: seqs recorded lost, and why.
type streamGap struct {
	First  int64  `db:"first_seq"`
	Last   int64  `db:"last_seq"`
	Reason string `db:"reason"` // gapStopped or gapWrittenPast
}

// firstGap is the first range of the thread's seqs recorded lost that
// meets from..to (nil: none).
func firstGap(ctx context.Context, q queryer, threadID string, from, to int64) (*streamGap, error) {
	var g streamGap
	err := q.GetContext(ctx, &g, q.Rebind(`SELECT first_seq, last_seq, reason FROM stream_gaps
		WHERE thread_id = ? AND first_seq <= ? AND last_seq >= ? ORDER BY first_seq LIMIT 1`), threadID, to, from)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look for lost stream seqs: %w", err)
	}
	return &g, nil
}

// streamedWhole refuses (chat.ErrDeltasLost) to publish content as the
// streamed message messageID unless it is exactly that message's deltas:
// this process dropped none of them (streamBuffer.lost), no seq among
// them is recorded lost, and the stored ones hold all of content. Called
// once the thread's pending deltas are written. A message nothing of which
// was stored or dropped here was not streamed: nothing to compare.
func (t *txn) streamedWhole(messageID, content string) error {
	if t.buf != nil {
		if err := t.buf.lostDeltas(messageID); err != nil {
			return err
		}
	}
	var sm struct {
		ThreadID string `db:"thread_id"`
		FirstSeq int64  `db:"first_seq"`
		LastSeq  int64  `db:"last_seq"`
		Parts    int    `db:"parts"`
		Chars    int64  `db:"chars"`
	}
	err := t.get(&sm, `SELECT thread_id, first_seq, parts, chars,
		COALESCE((SELECT MAX(b.last_seq) FROM stream_batches b WHERE b.message_id = sm.message_id),
		first_seq) AS last_seq
		FROM stream_messages sm WHERE message_id = ?`, messageID)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load streamed message: %w", err)
	}
	lost, err := firstGap(t.ctx, t.tx, sm.ThreadID, sm.FirstSeq, sm.LastSeq)
	if err != nil {
		return err
	}
	if lost != nil {
		return fmt.Errorf(
			"%w: message %s: seqs %d–%d among its deltas were never written (%s)",
			chat.ErrDeltasLost, messageID, lost.First, lost.Last, lost.Reason,
		)
	}
	if sm.Chars == int64(utf8.RuneCountInString(content)) {
		return nil
	}
	// Deltas cut inside a character count its bytes apart: compare the
	// text itself while all of it is held.
	var batches []deltaBatch
	if err := t.sel(&batches, `SELECT `+batchCols+` FROM stream_batches WHERE message_id = ? ORDER BY first_seq`,
		messageID); err != nil {
		return fmt.Errorf("load deltas: %w", err)
	}
	deltas, err := expandBatches(batches, nil)
	if err != nil {
		return err
	}
	var b strings.Builder
	for i, d := range deltas {
		if d.Part != i {
			b.Reset()
			break
		}
		b.WriteString(d.Text)
	}
	if len(deltas) == sm.Parts && b.String() == content {
		return nil
	}
	return fmt.Errorf("%w: message %s: its stored deltas hold %d characters, the text to publish %d",
		chat.ErrDeltasLost, messageID, sm.Chars, utf8.RuneCountInString(content))
}

// DeleteDraft removes a saved fragment from history: a new head checkpoint
// without it and message.deleted. The message row stays for audit, marked
// deleted_at, until the draft TTL redacts its text (RedactDeletedDrafts).
func (s *Store) DeleteDraft(ctx context.Context, p chat.DeleteDraft) (chat.DraftDeleted, error) {
	if err := p.Validate(); err != nil {
		return chat.DraftDeleted{}, err
	}
	userID, threadID, messageID, expected := p.UserID, p.ThreadID, p.MessageID, p.ExpectedStateVersion
	var out chat.DraftDeleted
	err := s.write(ctx, func(t *txn) error {
		c, err := t.thread(userID, threadID)
		if err != nil {
			return err
		}
		var kind string
		err = t.get(&kind, `SELECT kind FROM messages WHERE message_id = ? AND thread_id = ?`, messageID, threadID)
		if errors.Is(err, sql.ErrNoRows) {
			return chat.NotFound("message", messageID)
		}
		if err != nil {
			return fmt.Errorf("load message: %w", err)
		}
		if err := t.checkVersion(c, expected, ""); err != nil {
			return err
		}
		if kind != chat.KindFragment {
			return chat.Invalid(
				"message %s is a published %s message, not a saved fragment: only drafts can be deleted",
				messageID, kind,
			)
		}
		head, err := t.checkpoint(threadID, c.row.HeadCheckpointID)
		if err != nil {
			return err
		}
		i := slices.Index(head.MessageIDs, messageID)
		if i < 0 {
			return chat.NotFound("draft in this conversation's history", messageID)
		}
		cpID := chat.NewID(chat.PrefixCheckpoint)
		ev := t.event(c, chat.EventMessageDeleted, "")
		ev.MessageID = messageID
		ev.Body = chat.MessageDeletedBody{MessageID: messageID, CheckpointID: cpID}
		if err := t.append(ev); err != nil {
			return err
		}
		if _, err := t.exec(`UPDATE messages SET deleted_at = ? WHERE message_id = ?`,
			ms(t.now), messageID); err != nil {
			return fmt.Errorf("mark draft deleted: %w", err)
		}
		cp, err := t.addCheckpoint(c, chat.Checkpoint{
			CheckpointID: cpID, ParentCheckpointID: &head.CheckpointID,
			MessageIDs:     slices.Delete(slices.Clone(head.MessageIDs), i, i+1),
			CompletedSteps: head.CompletedSteps, ToolResults: head.ToolResults, Pending: head.Pending,
		}, "")
		if err != nil {
			return err
		}
		if err := t.pauseQueue(c, chat.PausedHeadMoved); err != nil {
			return err
		}
		out = chat.DraftDeleted{CheckpointID: cp.CheckpointID, StateVersion: c.row.StateVersion}
		return nil
	})
	return out, err
}

// MaxReplay bounds one replay read in events, and maxReplayBytes in the
// size of their text (payloads, and delta texts with their envelope): a
// longer or larger gap is answered with a snapshot, so no replay holds
// more than a few MiB in memory or in a tab's queue.
const MaxReplay = 20000

var maxReplayBytes int64 = 4 << 20

// deltaEnvelope is about what a message.delta's JSON adds to its text.
const deltaEnvelope = 160

// Events reads the thread's durable events from the log and its deltas from
// the stream buffer with seq > after, merged in seq order. It answers
// without events and not Complete when it cannot give every event after
// after: deltas purged from the stream buffer, or after below the thread's
// event-log watermark (PurgeEvents); the reader then needs a snapshot.
func (s *Store) Events(ctx context.Context, userID, threadID string, after int64) (chat.Replay, error) {
	return s.replay(ctx, threadID, after, func(q *sqlx.Tx) (threadRow, error) {
		return readThread(ctx, q, userID, threadID)
	})
}

// ThreadEvents is Events without the owner check, for the event bus
// recovering the events it missed (no user is involved): a thread that does
// not exist answers not_found.
func (s *Store) ThreadEvents(ctx context.Context, threadID string, after int64) (chat.Replay, error) {
	return s.replay(ctx, threadID, after, func(q *sqlx.Tx) (threadRow, error) {
		return readAnyThread(ctx, q, threadID)
	})
}

// replay is Events, reading the thread row with load (in the same read
// transaction).
func (s *Store) replay(
	ctx context.Context,
	threadID string,
	after int64,
	load func(q *sqlx.Tx) (threadRow, error),
) (chat.Replay, error) {
	var out chat.Replay
	// The deltas only memory holds yet (streambuf.go), all above the
	// database's last_seq: read with the database under the thread's
	// sequencer, so the two join without a gap or an overlap.
	var pending []*chat.Event
	if s.buf != nil {
		ts := s.buf.thread(threadID)
		ts.mu.Lock()
		defer ts.mu.Unlock()
		for _, pb := range ts.pending {
			pending = append(pending, pb.events...)
		}
	}
	err := s.read(ctx, func(q *sqlx.Tx) error {
		row, err := load(q)
		if err != nil {
			return err
		}
		last := row.LastSeq
		if n := len(pending); n > 0 && pending[0].Seq != row.LastSeq+1 {
			if !s.pg {
				return fmt.Errorf(
					"thread %s: the deltas in memory start at seq %d, the database ends at %d",
					threadID, pending[0].Seq, row.LastSeq,
				)
			}
			// Another instance wrote past this process's reservation
			// (streambuf.go): what memory holds is lost.
			pending = nil
		}
		if n := len(pending); n > 0 {
			last = pending[n-1].Seq
		}
		out.LastSeq, out.StateVersion = last, row.StateVersion
		if after >= last {
			// Nothing missed; a seq beyond the thread's end was never
			// sent by this server, so the reader must start over.
			out.Complete = after == last
			return nil
		}
		if last-after > MaxReplay || after < row.EventsPurgedThrough || after < row.DeltasPurgedThrough {
			return nil
		}
		// What the database holds, then what only memory holds.
		var logged []*chat.Event
		if after < row.LastSeq {
			var complete bool
			if logged, complete, err = readLogged(ctx, q, threadID, after, row.LastSeq); err != nil || !complete {
				return err
			}
		}
		out.Events = logged
		for _, ev := range pending {
			if ev.Seq > after {
				out.Events = append(out.Events, ev)
			}
		}
		out.Complete = true
		return nil
	})
	return out, err
}

// readLogged reads a thread's events after seq after up to upTo, its
// last_seq, from the event log and the stream buffer, merged in seq
// order; complete is false when they do not make every seq in between
// (purged, lost in a crash) or are too many to replay.
func readLogged(
	ctx context.Context,
	q *sqlx.Tx,
	threadID string,
	after, upTo int64,
) (events []*chat.Event, complete bool, err error) {
	var size int64
	if err := q.GetContext(ctx, &size, q.Rebind(`SELECT CAST(
		COALESCE((SELECT SUM(LENGTH(payload)) FROM events WHERE thread_id = ? AND seq > ?), 0) +
		COALESCE((SELECT SUM(LENGTH(texts) + (last_seq - first_seq + 1) * ?) FROM stream_batches WHERE thread_id = ?
		AND last_seq > ?), 0) AS BIGINT)`),
		threadID, after, deltaEnvelope, threadID, after); err != nil {
		return nil, false, fmt.Errorf("size the replay: %w", err)
	}
	if size > maxReplayBytes {
		return nil, false, nil
	}
	var durable []struct {
		Seq     int64  `db:"seq"`
		Type    string `db:"type"`
		Payload string `db:"payload"`
	}
	if err := q.SelectContext(ctx, &durable, q.Rebind(`SELECT seq, type, payload FROM events WHERE thread_id = ?
		AND seq > ? ORDER BY seq`), threadID, after); err != nil {
		return nil, false, fmt.Errorf("read event log: %w", err)
	}
	var batches []deltaBatch
	if err := q.SelectContext(ctx, &batches, q.Rebind(`SELECT `+batchCols+` FROM stream_batches
		WHERE thread_id = ? AND last_seq > ? ORDER BY first_seq`), threadID, after); err != nil {
		return nil, false, fmt.Errorf("read stream buffer: %w", err)
	}
	deltas, err := expandBatches(batches, func(d bufferedDelta) bool { return d.Seq > after })
	if err != nil {
		return nil, false, err
	}
	events = make([]*chat.Event, 0, len(durable)+len(deltas))
	next := after + 1
	i, j := 0, 0
	for i < len(durable) || j < len(deltas) {
		if i < len(durable) && (j >= len(deltas) || durable[i].Seq < deltas[j].Seq) {
			if durable[i].Seq != next {
				return nil, false, nil // a gap: purged or lost deltas
			}
			d := durable[i]
			events = append(events, &chat.Event{Type: d.Type, ThreadID: threadID, Seq: d.Seq, Raw: []byte(d.Payload)})
			i++
		} else {
			d := deltas[j]
			if d.Seq != next {
				return nil, false, nil
			}
			ev := chat.Event{Type: chat.EventMessageDelta, ThreadID: threadID, Seq: d.Seq, TS: d.TS, RunID: d.RunID,
				Body: chat.MessageDeltaBody{MessageID: d.MessageID, Text: d.Text}}
			if err := ev.Encode(); err != nil {
				return nil, false, err
			}
			events = append(events, &ev)
			j++
		}
		next++
	}
	if next != upTo+1 {
		return nil, false, nil
	}
	return events, true, nil
}

// lastSeqsChunk bounds the ids in one LastSeqs query.
const lastSeqsChunk = 500

// LastSeqs reports the last_seq of each of the given threads, read with
// one query per lastSeqsChunk ids; ids of threads that do not exist are
// absent from the result. (For the event bus: which threads moved on
// without it.)
func (s *Store) LastSeqs(ctx context.Context, threadIDs []string) (map[string]int64, error) {
	out := make(map[string]int64, len(threadIDs))
	for chunk := range slices.Chunk(threadIDs, lastSeqsChunk) {
		query, args, err := sqlx.In(`SELECT thread_id, last_seq FROM threads WHERE thread_id IN (?)`, chunk)
		if err != nil {
			return nil, err
		}
		var rows []struct {
			ThreadID string `db:"thread_id"`
			LastSeq  int64  `db:"last_seq"`
		}
		if err := s.reader.SelectContext(ctx, &rows, s.reader.Rebind(query), args...); err != nil {
			return nil, fmt.Errorf("read last seqs: %w", err)
		}
		for _, r := range rows {
			out[r.ThreadID] = r.LastSeq
		}
	}
	return out, nil
}

// Operations lists a thread's tool calls, oldest first.
func (s *Store) Operations(ctx context.Context, userID, threadID string) ([]chat.Operation, error) {
	if _, err := s.Thread(ctx, userID, threadID); err != nil {
		return nil, err
	}
	var rows []operationRow
	if err := s.reader.SelectContext(ctx, &rows, s.reader.Rebind(`SELECT `+operationCols+` FROM operations
		WHERE thread_id = ? ORDER BY created_at, operation_id`), threadID); err != nil {
		return nil, fmt.Errorf("list operations: %w", err)
	}
	out := make([]chat.Operation, len(rows))
	for i, r := range rows {
		out[i] = r.operation()
	}
	return out, nil
}
