package app_test

// The scenario tests (scenario_*_test.go): whole gateways served in this
// process by apptest.Start from apptest.CommandConfig (the serve
// command's defaults), driven through their listeners with package
// client or raw HTTP where the wire itself is the subject. A flag the
// command would have been given is the Config field it sets. What needs
// a process boundary (a kill, a signal, the exit status, the
// environment, the CLI subcommands) stays in the root package's tests.
// Every wait is bounded by a deadline, so a bug fails the test instead
// of hanging it.

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/store"
)

// httpClient is for what the tests read raw: /readyz, /livez, /metrics,
// pages and requests whose subject is the wire itself.
var httpClient = &http.Client{Timeout: 15 * time.Second}

// addUser adds the account name with password to db (creating db if
// need be), as `gateway user add NAME -db DB` does.
func addUser(t *testing.T, db, name, password string) {
	t.Helper()
	hash, err := auth.HashPassword(password, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Accounts().CreateUser(context.Background(), name, hash); err != nil {
		t.Fatalf("add user %s: %v", name, err)
	}
}

// createToken creates an API token for the account user in db, valid
// until revoked, as `gateway token create -user NAME -db DB` does, and
// returns the whole token and its id.
func createToken(t *testing.T, db, user string) (token, id string) {
	t.Helper()
	st, err := store.Open(context.Background(), db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tok, secret, err := auth.CreateToken(context.Background(), st.Accounts(), user, "", 0, time.Now())
	if err != nil {
		t.Fatalf("create a token for %s: %v", user, err)
	}
	return secret, tok.TokenID
}
