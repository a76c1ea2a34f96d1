package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// A person at a provider is one user, found by issuer and subject: the
// first sign-in creates the user under the first free name offered, later
// ones find it whatever their e-mail and names say, the same subject at
// another issuer is someone else, and a deleted user's person gets a new,
// empty account.
func TestIdentitiesKeyUsersByIssuerAndSubject(t *testing.T) {
	ctx := context.Background()
	dsn := testDSN(t)
	st, err := store.Open(ctx, dsn, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	acc := st.Accounts()
	if _, err := acc.CreateUser(ctx, "jane", "hash-of-the-other-jane"); err != nil {
		t.Fatal(err)
	}
	const issuer = "https://idp.example.com/realms/main"
	u, hash, created, err := acc.SignInIdentity(ctx, issuer, "sub-1", "jane@example.com", []string{"jane", "jane-2", "jane-3"})
	if err != nil || !created || u.Name != "jane-2" || hash != "" || u.HasPassword {
		t.Fatalf("first sign-in: %+v %q created=%v %v; want a new user jane-2 (jane is another account's) without a password", u, hash, created, err)
	}
	again, _, created, err := acc.SignInIdentity(ctx, issuer, "sub-1", "jane.new@example.org", []string{"someone-else"})
	if err != nil || created || again.UserID != u.UserID || again.Name != "jane-2" {
		t.Fatalf("second sign-in with another e-mail and name: %+v created=%v %v; want the same user %s, same name", again, created, err, u.UserID)
	}
	var userID, email string
	if err := rawDB(t, dsn).QueryRow(`SELECT user_id, email FROM identities WHERE issuer = ? AND subject = ?`, issuer, "sub-1").
		Scan(&userID, &email); err != nil || userID != u.UserID || email != "jane.new@example.org" {
		t.Fatalf("the identity row: %q %q %v; want user %s and the last e-mail seen", userID, email, err, u.UserID)
	}
	other, _, created, err := acc.SignInIdentity(ctx, "https://other.example.com", "sub-1", "jane@example.com", []string{"jane", "jane-2", "jane-3"})
	if err != nil || !created || other.UserID == u.UserID || other.Name != "jane-3" {
		t.Fatalf("the same subject at another issuer: %+v created=%v %v; want another new user, jane-3", other, created, err)
	}
	if _, _, _, err := acc.SignInIdentity(ctx, issuer, "sub-2", "", []string{"jane", "jane-2"}); chat.ErrorCode(err) != chat.CodeInvalidRequest {
		t.Fatalf("every name taken: %v, want invalid_request", err)
	}
	// A password given later (gateway user passwd) is the user's: sign-in
	// answers its hash (for the device cookie).
	if err := acc.SetPassword(ctx, "jane-2", "hash-2"); err != nil {
		t.Fatal(err)
	}
	if _, hash, _, err := acc.SignInIdentity(ctx, issuer, "sub-1", "", nil); err != nil || hash != "hash-2" {
		t.Fatalf("sign-in of a user with a password: hash %q %v, want hash-2", hash, err)
	}
	if err := acc.DeleteUser(ctx, "jane-2"); err != nil {
		t.Fatal(err)
	}
	fresh, _, created, err := acc.SignInIdentity(ctx, issuer, "sub-1", "jane@example.com", []string{"jane", "jane-2"})
	if err != nil || !created || fresh.UserID == u.UserID || fresh.Name != "jane-2" {
		t.Fatalf("sign-in after the user was deleted: %+v created=%v %v; want a new user (the name is free again)", fresh, created, err)
	}
}

// A sign-in in flight is taken once: a second take, an unknown state and an
// expired one answer not_found. The rows in flight are bounded per client
// address and over all.
func TestOIDCLoginsAreSingleUseAndBounded(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, testDSN(t), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	acc := st.Accounts()
	now := time.Now()
	if err := acc.BeginOIDCLogin(ctx, "state-a", "/t/thr_1", "192.0.2.7", now.Add(10*time.Minute), 3, 10); err != nil {
		t.Fatal(err)
	}
	next, err := acc.TakeOIDCLogin(ctx, "state-a", now)
	if err != nil || next != "/t/thr_1" {
		t.Fatalf("take: %q %v, want /t/thr_1", next, err)
	}
	if _, err := acc.TakeOIDCLogin(ctx, "state-a", now); chat.ErrorCode(err) != chat.CodeNotFound {
		t.Fatalf("take again: %v, want not_found", err)
	}
	if _, err := acc.TakeOIDCLogin(ctx, "state-never", now); chat.ErrorCode(err) != chat.CodeNotFound {
		t.Fatalf("take an unknown state: %v, want not_found", err)
	}
	if err := acc.BeginOIDCLogin(ctx, "state-b", "/", "192.0.2.6", now.Add(time.Minute), 3, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := acc.TakeOIDCLogin(ctx, "state-b", now.Add(2*time.Minute)); chat.ErrorCode(err) != chat.CodeNotFound {
		t.Fatalf("take an expired state: %v, want not_found", err)
	}
	for i, s := range []string{"c", "d", "e"} {
		if err := acc.BeginOIDCLogin(ctx, "state-"+s, "/", "192.0.2.7", now.Add(10*time.Minute), 3, 10); err != nil {
			t.Fatalf("begin %d: %v", i, err)
		}
	}
	err = acc.BeginOIDCLogin(ctx, "state-f", "/", "192.0.2.7", now.Add(10*time.Minute), 3, 10)
	if secs, ok := chat.RetryAfter(err); !ok || secs < 1 {
		t.Fatalf("a 4th sign-in in flight from one address: %v, want rate_limited with retry_after_seconds", err)
	}
	if err := acc.BeginOIDCLogin(ctx, "state-g", "/", "192.0.2.8", now.Add(10*time.Minute), 3, 5); err != nil {
		t.Fatalf("another address: %v", err)
	}
	if err := acc.BeginOIDCLogin(ctx, "state-h", "/", "192.0.2.9", now.Add(10*time.Minute), 3, 5); chat.ErrorCode(err) != chat.CodeRateLimited {
		t.Fatalf("past the total: %v, want rate_limited", err)
	}
}

// First sign-ins of one person at once (several tabs, several instances)
// make one user: whichever inserts second finds the first's.
func TestIdentityFirstSignInsAtOnceMakeOneUser(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, testDSN(t), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const n = 8
	ids := make(chan string, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			u, _, _, err := st.Accounts().SignInIdentity(ctx, "https://idp.example.com", "sub-1", "", []string{"jane", "jane-2"})
			ids <- u.UserID
			errs <- err
		}()
	}
	seen := map[string]bool{}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("a concurrent first sign-in: %v", err)
		}
		seen[<-ids] = true
	}
	if len(seen) != 1 {
		t.Fatalf("%d concurrent first sign-ins made users %v, want one", n, seen)
	}
}
