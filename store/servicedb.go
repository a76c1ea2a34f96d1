package store

import (
	"context"

	"github.com/jmoiron/sqlx"
)

// ServiceDB is the gateway's database as a service embedded in the gateway
// sees it: the simulated email provider (tools/email) keeps its tables
// there (migration 00013), as an external system keeps its own records.
// It opens no connection of its own: its writes take the store's single
// writer in their turn like every other write (so on SQLite there is one
// writer per file, and a cancel's transaction is never queued behind a
// second connection's busy wait), and its reads use the store's read
// pool. A ServiceDB is a value; it is safe for concurrent use and valid
// until the store is closed.
type ServiceDB struct{ s *Store }

// ServiceDB returns the store's handle for embedded services.
func (s *Store) ServiceDB() ServiceDB { return ServiceDB{s: s} }

// Write runs fn in one write transaction and commits it when fn returns
// nil. A transaction another instance made fail (a deadlock or
// serialization failure on PostgreSQL) runs again from scratch, fn
// included: fn must set its results afresh on every call and do nothing
// outside tx. fn must not call the store.
func (d ServiceDB) Write(ctx context.Context, fn func(tx *sqlx.Tx) error) error {
	return d.s.writeRetrying(ctx, func(t *txn) error { return fn(t.tx) })
}

// Read runs fn in one read transaction: a consistent view of the database.
// fn must not write (on SQLite the read connections are query-only).
func (d ServiceDB) Read(ctx context.Context, fn func(tx *sqlx.Tx) error) error {
	return d.s.read(ctx, fn)
}
