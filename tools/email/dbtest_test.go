package email

import (
	"path/filepath"
	"testing"

	"github.com/honestcancel/gateway/internal/pgtest"
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
