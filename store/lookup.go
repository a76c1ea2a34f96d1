package store

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/chat"
)

// MessagesByID returns the messages of the thread among ids, whatever
// branch holds them, in the order asked and each once; an id that is not a
// message of this thread, or names a fragment deleted since, is left out.
// The answer stops before the message that would take its content past
// maxBytes (the first is always in it). The page names other branches by
// their first words with it.
func (s *Store) MessagesByID(ctx context.Context, userID, threadID string, ids []string, maxBytes int64) ([]chat.Message, error) {
	out := []chat.Message{}
	if err := s.settled(ctx); err != nil {
		return out, err
	}
	err := s.read(ctx, func(q *sqlx.Tx) error {
		out = out[:0]
		if _, err := readThread(ctx, q, userID, threadID); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		query, args, err := sqlx.In(`SELECT `+messageCols+` FROM messages
			WHERE thread_id = ? AND deleted_at IS NULL AND message_id IN (?)`, threadID, ids)
		if err != nil {
			return err
		}
		var rows []messageRow
		if err := q.SelectContext(ctx, &rows, q.Rebind(query), args...); err != nil {
			return fmt.Errorf("look up messages: %w", err)
		}
		byID := make(map[string]messageRow, len(rows))
		for _, r := range rows {
			byID[r.MessageID] = r
		}
		var total int64
		for _, id := range ids {
			r, ok := byID[id]
			if !ok {
				continue
			}
			delete(byID, id) // each once
			if total += int64(len(r.Content)); len(out) > 0 && total > maxBytes {
				break
			}
			m, err := r.message()
			if err != nil {
				return err
			}
			out = append(out, m)
		}
		return nil
	})
	return out, err
}
