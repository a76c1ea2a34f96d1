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

// StoreVar set to "postgres" runs the suites written for either database
// (the store's, the email provider's) on PostgreSQL instead of SQLite.
const StoreVar = "GATEWAY_TEST_STORE"

// OnPostgres reports whether StoreVar asks for PostgreSQL.
func OnPostgres() bool { return os.Getenv(StoreVar) == "postgres" }

// DSN is a fresh, empty database for a test of such a suite: a fresh
// schema when OnPostgres, else sqlitePath (a file in the test's TempDir).
func DSN(t testing.TB, sqlitePath string) string {
	t.Helper()
	if OnPostgres() {
		return Schema(t)
	}
	return sqlitePath
}

// skipMessage says what to set to run a test that needs PostgreSQL.
const skipMessage = "this test needs PostgreSQL: set " + URLVar +
	"='postgres://USER@HOST:5432/DB?sslmode=disable' (a database the tests may create schemas in)"

// Schema creates a schema with a random name in the database at URLVar
// and returns the URL that uses it (search_path as a runtime parameter).
// Without URLVar the test is skipped, saying what to set.
func Schema(t testing.TB) string {
	t.Helper()
	base := os.Getenv(URLVar)
	if base == "" {
		t.Skip(skipMessage)
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
