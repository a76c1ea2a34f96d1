package store_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/jmoiron/sqlx"
	_ "github.com/mattn/go-sqlite3"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/internal/pgtest"
	"github.com/honestcancel/gateway/store"
)

// Which database the tests run on. By default every test gets a fresh
// SQLite file. With GATEWAY_TEST_STORE=postgres every test gets a fresh
// schema of the PostgreSQL database at GATEWAY_TEST_POSTGRES_URL (dropped
// when the test ends). The tests of several instances sharing one
// database run whenever GATEWAY_TEST_POSTGRES_URL is set.

// onPostgres reports whether the suite runs on PostgreSQL.
func onPostgres() bool { return pgtest.OnPostgres() }

// testDSN names a fresh, empty database for one test (see above).
func testDSN(t testing.TB) string {
	t.Helper()
	return pgtest.DSN(t, filepath.Join(t.TempDir(), "gw.db"))
}

// postgresDSN is a fresh PostgreSQL schema whatever GATEWAY_TEST_STORE
// says, for the tests of several instances; without
// GATEWAY_TEST_POSTGRES_URL the test is skipped.
func postgresDSN(t testing.TB) string {
	t.Helper()
	return pgtest.Schema(t)
}

// rawConn reaches a test's database behind the store's back (to look at
// rows or corrupt them); ? placeholders are rebound for the database.
type rawConn struct{ db *sqlx.DB }

// rawDB opens dsn (a store's, from testDSN) directly; closed when the test
// ends.
func rawDB(t testing.TB, dsn string) *rawConn {
	t.Helper()
	driver := "sqlite3"
	if store.IsPostgres(dsn) {
		driver = "pgx"
	}
	db, err := sqlx.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &rawConn{db: db}
}

func (c *rawConn) QueryRow(q string, args ...any) *sql.Row {
	return c.db.QueryRow(c.db.Rebind(q), args...)
}

func (c *rawConn) Query(q string, args ...any) (*sql.Rows, error) {
	return c.db.Query(c.db.Rebind(q), args...)
}

func (c *rawConn) Exec(q string, args ...any) (sql.Result, error) {
	return c.db.Exec(c.db.Rebind(q), args...)
}

// leaseW is the lease of a run claimed once by worker "w" (a run's first
// claim takes epoch 1; TestClaimsFenceEachOther checks it).
func leaseW(runID string) chat.Lease { return chat.Lease{RunID: runID, Owner: "w", Epoch: 1} }

// pendingStep is the step the run's thread waits on, as a worker reads it.
func pendingStep(t testing.TB, st *store.Store, runID string) chat.Pending {
	t.Helper()
	in, err := st.RunInput(context.Background(), runID)
	if err != nil || in.Pending == nil {
		t.Fatalf("run input of %s: %+v, %v", runID, in.Pending, err)
	}
	return *in.Pending
}

func ptr[T any](v T) *T { return &v }
