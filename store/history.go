package store

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// historyWindow picks a part of a thread's history to read: the messages
// just before before ("": the latest ones), oldest first, at most limit of
// them and, but for the newest of them (always taken, whatever its size),
// at most maxBytes of their content in all.
type historyWindow struct {
	before   string
	limit    int
	maxBytes int64
}

// pick returns the bounds [from, to) of the window in ids, the head's
// history. It reads only the messages' sizes, never their text: a window
// over a long conversation costs what the window holds.
func (w historyWindow) pick(ctx context.Context, q *sqlx.Tx, ids []string) (from, to int, err error) {
	to = len(ids)
	if w.before != "" {
		to = -1
		for i, id := range ids {
			if id == w.before {
				to = i
				break
			}
		}
		if to < 0 {
			return 0, 0, chat.Errorf(
				chat.CodeNotFound,
				"message %s is not in this conversation's current history (another branch was checked out, "+
					"or it is not a message of it): read the conversation again and page back from its latest messages",
				w.before,
			)
		}
	}
	if to == 0 {
		return 0, 0, nil
	}
	// Only the ids that can be in the window are measured.
	candidates := ids[max(0, to-w.limit):to]
	query, args, err := sqlx.In(
		`SELECT message_id, octet_length(content) AS size FROM messages WHERE message_id IN (?)`,
		candidates,
	)
	if err != nil {
		return 0, 0, err
	}
	var rows []struct {
		MessageID string `db:"message_id"`
		Size      int64  `db:"size"`
	}
	if err := q.SelectContext(ctx, &rows, q.Rebind(query), args...); err != nil {
		return 0, 0, fmt.Errorf("measure messages: %w", err)
	}
	size := make(map[string]int64, len(rows))
	for _, r := range rows {
		size[r.MessageID] = r.Size
	}
	from, total := to, int64(0)
	for from > 0 && to-from < w.limit {
		next := total + size[ids[from-1]]
		if from < to && next > w.maxBytes {
			break
		}
		from, total = from-1, next
	}
	return from, to, nil
}

// SnapshotLatest is Snapshot with only the latest messages of the history:
// at most limit of them and, but for the latest one, at most maxBytes of
// content; EarlierMessages counts those left out. It is the conversation
// page's first paint, which fetches the rest when asked (History).
func (s *Store) SnapshotLatest(
	ctx context.Context,
	userID, threadID string,
	limit int,
	maxBytes int64,
) (chat.Snapshot, error) {
	return s.snapshot(ctx, userID, threadID, &historyWindow{limit: max(limit, 1), maxBytes: maxBytes})
}

// History reads a page of the thread's history (the head checkpoint's
// messages), oldest first: the messages just before the message before
// ("": the latest ones), at most limit of them and, but for the newest of
// them, at most maxBytes of content. A before that is not in the head's
// history answers not_found.
func (s *Store) History(
	ctx context.Context,
	userID, threadID, before string,
	limit int,
	maxBytes int64,
) (chat.HistoryPage, error) {
	var page chat.HistoryPage
	if err := s.settled(ctx); err != nil {
		return page, err
	}
	err := s.read(ctx, func(q *sqlx.Tx) error {
		row, err := readThread(ctx, q, userID, threadID)
		if err != nil {
			return err
		}
		head, err := loadCheckpoint(ctx, q, s.cps, threadID, row.HeadCheckpointID)
		if err != nil {
			return err
		}
		w := historyWindow{before: before, limit: max(limit, 1), maxBytes: maxBytes}
		from, to, err := w.pick(ctx, q, head.MessageIDs)
		if err != nil {
			return err
		}
		msgs, err := loadMessages(ctx, q, head.MessageIDs[from:to])
		if err != nil {
			return err
		}
		page = chat.HistoryPage{ThreadID: row.ThreadID, HeadCheckpointID: row.HeadCheckpointID,
			StateVersion: row.StateVersion, Messages: msgs}
		if from > 0 {
			next := head.MessageIDs[from]
			page.NextBefore = &next
		}
		return nil
	})
	return page, err
}
