package store

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// CancelsRequested lists the runs whose lease owner holds and whose cancel
// has been accepted but not yet taken up (status cancel_requested). With
// several instances a cancel is often accepted by another instance than
// the one executing the run; the executing engine asks this after a
// cancel wake-up from the bus and, in case a wake-up was lost, on a timer.
// It reads only (the read pool), so it never waits for the writer.
func (s *Store) CancelsRequested(ctx context.Context, owner string) ([]string, error) {
	var ids []string
	err := s.read(ctx, func(q *sqlx.Tx) error {
		if err := q.SelectContext(ctx, &ids, q.Rebind(`SELECT run_id FROM runs
			WHERE status = 'cancel_requested' AND lease_owner = ?`), owner); err != nil {
			return fmt.Errorf("read requested cancels: %w", err)
		}
		return nil
	})
	return ids, err
}
