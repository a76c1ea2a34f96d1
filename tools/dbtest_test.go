package tools

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"testing"
)

// The outbox tests run on a fresh SQLite file by default, and with
// GATEWAY_TEST_STORE=postgres on a fresh schema of the PostgreSQL database
// at GATEWAY_TEST_POSTGRES_URL (as the store's tests do), dropped when the
// test ends.
const (
	envStore       = "GATEWAY_TEST_STORE"
	envPostgresURL = "GATEWAY_TEST_POSTGRES_URL"
)

// testDSN names a fresh, empty database for one test; file is the SQLite
// file's name in t.TempDir().
func testDSN(t *testing.T, file string) string {
	t.Helper()
	if os.Getenv(envStore) != "postgres" {
		return filepath.Join(t.TempDir(), file)
	}
	base := os.Getenv(envPostgresURL)
	if base == "" {
		t.Skip(envStore + "=postgres needs " + envPostgresURL + " set to a PostgreSQL URL, e.g. " +
			envPostgresURL + "='postgres://postgres@127.0.0.1:5432/test?sslmode=disable'")
	}
	var b [6]byte
	rand.Read(b[:])
	schema := "gwtest_" + hex.EncodeToString(b[:])
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(`CREATE SCHEMA ` + schema); err != nil {
		t.Fatalf("create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		admin, err := sql.Open("pgx", base)
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close()
		if _, err := admin.Exec(`DROP SCHEMA ` + schema + ` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("%s: %v", envPostgresURL, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
