// Package pgtest gives a test a database of its own on the PostgreSQL
// server that GATEWAY_TEST_POSTGRES_URL names: a fresh schema, dropped with
// everything in it when the test ends, so tests can run in parallel on one
// database. Like net/http/httptest, it is for tests only.
package pgtest

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
)

// URLVar is the environment variable naming the test database.
const URLVar = "GATEWAY_TEST_POSTGRES_URL"

// Available reports whether URLVar is set.
func Available() bool { return os.Getenv(URLVar) != "" }

// SkipMessage says what to set to run a test that needs PostgreSQL.
const SkipMessage = "this test needs PostgreSQL: set " + URLVar +
	"='postgres://USER@HOST:5432/DB?sslmode=disable' (a database the tests may create schemas in)"

// Schema creates a schema with a random name in the database at URLVar
// and returns the URL that uses it (search_path as a runtime parameter).
// Without URLVar the test is skipped with SkipMessage.
func Schema(t testing.TB) string {
	t.Helper()
	base := os.Getenv(URLVar)
	if base == "" {
		t.Skip(SkipMessage)
	}
	var b [6]byte
	rand.Read(b[:])
	schema := "gwtest_" + hex.EncodeToString(b[:])
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatalf("%s: %v", URLVar, err)
	}
	defer admin.Close()
	if _, err := admin.Exec(`CREATE SCHEMA ` + schema); err != nil {
		t.Fatalf("create schema %s in %s: %v (is PostgreSQL running?)", schema, URLVar, err)
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
		t.Fatalf("%s: %v", URLVar, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
