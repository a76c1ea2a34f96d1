package email

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/honestcancel/gateway/internal/pgtest"
	"github.com/honestcancel/gateway/store"
)

// The outbox tests run on a fresh SQLite file by default, and with
// GATEWAY_TEST_STORE=postgres on a fresh schema of the PostgreSQL database
// at GATEWAY_TEST_POSTGRES_URL (as the store's tests do), dropped when the
// test ends.

// testDSN names a fresh, empty database for one test; file is the SQLite
// file's name in t.TempDir().
func testDSN(t *testing.T, file string) string {
	t.Helper()
	return pgtest.DSN(t, filepath.Join(t.TempDir(), file))
}

// openOutbox opens a store of its own on dsn, as one gateway process does
// (its migrations create the provider's tables), closed when the test
// ends, and the provider on it.
func openOutbox(t *testing.T, dsn string, cfg OutboxConfig) (*Outbox, error) {
	t.Helper()
	st, err := store.Open(context.Background(), dsn, store.Options{})
	if err != nil {
		t.Fatalf("open the store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return NewOutbox(st.ServiceDB(), cfg)
}
