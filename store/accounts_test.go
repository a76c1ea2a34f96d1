package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// An administrator's view of a user's sign-ins: listing them (times only),
// ending them all, and a password reset that also revokes the tokens.
func TestSessionsListEndAndResetWithTokens(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, testDSN(t), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	alice, err := st.Accounts().CreateUser(ctx, "alice", "hash-1")
	if err != nil {
		t.Fatal(err)
	}
	bob, err := st.Accounts().CreateUser(ctx, "bob", "hash-2")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, s := range []struct {
		user    string
		expires time.Time
	}{{alice.UserID, now.Add(time.Hour)}, {alice.UserID, now.Add(2 * time.Hour)}, {alice.UserID, now.Add(-time.Minute)}, {bob.UserID, now.Add(time.Hour)}} {
		if err := st.Accounts().CreateSession(ctx, "session-hash-"+string(rune('a'+i)), s.user, s.expires); err != nil {
			t.Fatal(err)
		}
	}
	got, err := st.Accounts().Sessions(ctx, "alice", now)
	if err != nil || len(got) != 2 || got[0].CreatedAt.IsZero() || got[0].ExpiresAt.Sub(now.Add(time.Hour)).Abs() > time.Millisecond ||
		got[1].ExpiresAt.Sub(now.Add(2*time.Hour)).Abs() > time.Millisecond {
		t.Fatalf("alice's sessions: %+v %v, want her two unexpired ones", got, err)
	}
	if _, err := st.Accounts().Sessions(ctx, "nobody", now); chat.ErrorCode(err) != chat.CodeNotFound {
		t.Fatalf("sessions of an unknown user: %v", err)
	}
	n, err := st.Accounts().EndSessions(ctx, "alice")
	if err != nil || n != 2 {
		t.Fatalf("end alice's sessions: %d %v, want 2", n, err)
	}
	for _, h := range []string{"session-hash-a", "session-hash-b"} {
		if _, err := st.Accounts().SessionUser(ctx, h, now); chat.ErrorCode(err) != chat.CodeNotFound {
			t.Fatalf("alice's session %s after EndSessions: %v", h, err)
		}
	}
	if _, err := st.Accounts().SessionUser(ctx, "session-hash-d", now); err != nil {
		t.Fatalf("bob's session after alice's ended: %v", err)
	}
	if _, err := st.Accounts().EndSessions(ctx, "nobody"); chat.ErrorCode(err) != chat.CodeNotFound {
		t.Fatalf("end sessions of an unknown user: %v", err)
	}

	// A reset with revokeTokens: alice's live tokens end, bob's stay.
	for _, tok := range []struct{ id, user string }{{"tok_a1", "alice"}, {"tok_a2", "alice"}, {"tok_b1", "bob"}} {
		if _, err := st.Accounts().CreateToken(ctx, tok.user, chat.APIToken{TokenID: tok.id}, "secret-"+tok.id); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Accounts().RevokeToken(ctx, "tok_a2"); err != nil {
		t.Fatal(err)
	}
	if err := st.Accounts().CreateSession(ctx, "session-hash-e", alice.UserID, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	revoked, err := st.Accounts().ResetPassword(ctx, "alice", "hash-3", true)
	if err != nil || revoked != 1 {
		t.Fatalf("reset alice's password revoking tokens: %d %v, want 1 (one was revoked already)", revoked, err)
	}
	if _, _, err := st.Accounts().TokenUser(ctx, "tok_a1", now); chat.ErrorCode(err) != chat.CodeNotFound {
		t.Fatalf("alice's token after the reset: %v", err)
	}
	if _, _, err := st.Accounts().TokenUser(ctx, "tok_b1", now); err != nil {
		t.Fatalf("bob's token after alice's reset: %v", err)
	}
	if _, err := st.Accounts().SessionUser(ctx, "session-hash-e", now); chat.ErrorCode(err) != chat.CodeNotFound {
		t.Fatalf("alice's session after the reset: %v", err)
	}
	if _, hash, _ := st.Accounts().UserByName(ctx, "alice"); hash != "hash-3" {
		t.Fatalf("alice's hash after the reset: %q", hash)
	}
	// Without revokeTokens the tokens stay.
	if _, err := st.Accounts().CreateToken(ctx, "alice", chat.APIToken{TokenID: "tok_a3"}, "secret-a3"); err != nil {
		t.Fatal(err)
	}
	if n, err := st.Accounts().ResetPassword(ctx, "alice", "hash-4", false); err != nil || n != 0 {
		t.Fatalf("reset without revoking: %d %v", n, err)
	}
	if _, _, err := st.Accounts().TokenUser(ctx, "tok_a3", now); err != nil {
		t.Fatalf("a token after a reset that keeps them: %v", err)
	}
}
