package main

// Header mode's one-name rule and the account commands that end sessions
// and tokens while the server runs — against the real binary, whose CLI
// makes and reads the accounts (helpers of main_auth_test.go and
// main_test.go). The sign-in brake under a burst, the audit lines and the
// __Host- cookie are tested in-process: app/scenario_signin_test.go.

import (
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// -auth header: a request naming the user twice is refused 400 and
// creates neither account.
func TestAuthHeaderModeRefusesTwoNames(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	srv := startServerWith(t, db, "5ms", "-auth", "header", "-trusted-proxies", "127.0.0.1/32", "-auth-header", "X-Test-User")
	for _, h := range []http.Header{
		{"X-Test-User": {"mallory", "trent"}}, // two header lines
		{"X-Test-User": {"mallory, trent"}},   // one, comma-joined
	} {
		for _, path := range []string{"/api/threads", "/"} {
			resp, raw := srv.send(who{header: h}, "GET", path, nil)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), "exactly one user") ||
				path == "/api/threads" && !strings.Contains(string(raw), `"invalid_request"`) {
				t.Errorf("GET %s with X-Test-User %q: %d %s, want 400 invalid_request saying why", path, h["X-Test-User"], resp.StatusCode, raw)
			}
		}
	}
	srv.Stop()
	if code, out, errOut := runCLI(t, nil, "user", "list", "-db", db); code != 0 || strings.Contains(out, "mallory") || strings.Contains(out, "trent") {
		t.Errorf("user list after the refused requests: exit %d, stdout %q, stderr %q; want neither name", code, out, errOut)
	}
}

// A database first served with -auth none, then with -auth header: a
// proxy naming the user "Local" (any case) does not become the no-auth
// user and does not see its conversations: every surface answers 403 with
// what to do, and the server logs the refusal.
func TestAuthHeaderModeRefusesTheLocalUser(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	srv := startServer(t, db, "5ms")
	private := srv.CreateThread()
	srv.Stop()

	srv = startServerWith(t, db, "5ms", "-auth", "header", "-trusted-proxies", "127.0.0.1/32", "-auth-header", "X-Test-User")
	for _, name := range []string{"Local", "local", "LOCAL"} {
		as := who{proxy: [2]string{"X-Test-User", name}}
		for _, path := range []string{"/api/threads", "/api/threads/" + private.ThreadID, "/", "/t/" + private.ThreadID} {
			resp, raw := srv.send(as, "GET", path, nil)
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(raw), "rename that user at the proxy") ||
				strings.HasPrefix(path, "/api/") && !strings.Contains(string(raw), `"error":"forbidden"`) ||
				strings.Contains(string(raw), private.ThreadID+`"`) {
				t.Errorf("GET %s as the proxy's %q: %d %.300s; want 403 forbidden saying to rename the user at the proxy", path, name, resp.StatusCode, raw)
			}
		}
	}
	if n := srv.Logged("proxy user refused"); n != 12 {
		t.Errorf("%d \"proxy user refused\" log lines for 12 refused requests, want 12", n)
	}
	// A user of another name sees nothing of the no-auth user's.
	if got := srv.threadList(who{proxy: [2]string{"X-Test-User", "carol"}}); len(got) != 0 {
		t.Errorf("carol lists %v, want nothing", got)
	}
	srv.Stop()
	// What docs/accounts.md documents stays: the operator gives the local user a
	// password and signs in as local in -auth password.
	if code, _, errOut := runCLIWith(t, nil, "correct horse battery\n", "user", "passwd", "local", "-db", db); code != 0 {
		t.Fatalf("user passwd local: exit %d, %s", code, errOut)
	}
	srv = startServerWith(t, db, "5ms", "-auth", "password")
	if got := srv.threadList(who{cookie: srv.signIn("local", "correct horse battery")}); len(got) != 1 || got[0] != private.ThreadID {
		t.Errorf("signed in as local with the password its operator gave it: lists %v, want [%s]", got, private.ThreadID)
	}
	srv.Stop()
	checkDB(t, db)
}

// user sessions, user signout and user passwd --revoke-tokens, while the
// server runs: a signed-out session and a revoked token are refused at
// once.
func TestUserSessionsSignoutAndRevokeTokens(t *testing.T) {
	const pw, pw2 = "correct horse battery", "staple stapler staple"
	db := dbWithUser(t, "alice", pw)
	addUser(t, db, "bob", "bobs password here")
	token, _ := createToken(t, db, "alice")
	srv := startServerWith(t, db, "5ms", "-auth", "password")
	c1, c2 := srv.signIn("alice", pw), srv.signIn("alice", pw)
	bob := who{cookie: srv.signIn("bob", "bobs password here")}

	row := regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`)
	sessions := func(name string) []string {
		t.Helper()
		code, out, errOut := runCLI(t, nil, "user", "sessions", name, "-db", db)
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if code != 0 || !regexp.MustCompile(`^CREATED\s+EXPIRES$`).MatchString(lines[0]) {
			t.Fatalf("user sessions %s: exit %d, stdout %q, stderr %q; want a CREATED EXPIRES table", name, code, out, errOut)
		}
		for _, l := range lines[1:] {
			if !row.MatchString(l) {
				t.Fatalf("user sessions %s: row %q, want two times", name, l)
			}
		}
		for _, secret := range []string{c1, c2} {
			if strings.Contains(out+errOut, secret) {
				t.Fatalf("user sessions shows a session cookie")
			}
		}
		return lines[1:]
	}
	if got := sessions("alice"); len(got) != 2 {
		t.Fatalf("alice has %d sessions listed, want 2: %q", len(got), got)
	}
	if code, _, errOut := runCLI(t, nil, "user", "sessions", "nobody", "-db", db); code == 0 || !strings.Contains(errOut, `no user "nobody"`) {
		t.Errorf("user sessions nobody: exit %d, stderr %q", code, errOut)
	}

	// signout ends both of alice's sessions at once; her token and bob's
	// session stay.
	code, out, errOut := runCLI(t, nil, "user", "signout", "alice", "-db", db)
	if code != 0 || !strings.Contains(out, "ended 2 sessions of alice") {
		t.Fatalf("user signout alice while serving: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	for _, c := range []string{c1, c2} {
		srv.wantUnauthorized(who{cookie: c}, "GET", "/api/threads", "a session after user signout")
		srv.wantWSRefused(who{cookie: c}, "a session after user signout")
		srv.wantLoginRedirect(who{cookie: c}, "/", "a session after user signout")
	}
	srv.threadList(who{bearer: token})
	srv.threadList(bob)
	if got := sessions("alice"); len(got) != 0 {
		t.Fatalf("alice's sessions after signout: %q", got)
	}

	// passwd --revoke-tokens: sessions and tokens end at once.
	c3 := srv.signIn("alice", pw)
	code, out, errOut = runCLIWith(t, nil, pw2+"\n", "user", "passwd", "--revoke-tokens", "alice", "-db", db)
	if code != 0 || !strings.Contains(out, "revoked their API tokens (1)") {
		t.Fatalf("user passwd --revoke-tokens alice while serving: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	srv.wantUnauthorized(who{bearer: token}, "GET", "/api/threads", "a token after user passwd --revoke-tokens")
	srv.wantWSRefused(who{bearer: token}, "a token after user passwd --revoke-tokens")
	srv.wantUnauthorized(who{cookie: c3}, "GET", "/api/threads", "a session after user passwd --revoke-tokens")
	srv.signIn("alice", pw2)
	srv.threadList(bob)
	if code, out, _ := runCLI(t, nil, "token", "list", "-user", "alice", "-db", db); code != 0 || regexp.MustCompile(`(?m)\s-\s*$`).MatchString(strings.SplitN(out, "\n", 2)[1]) {
		t.Errorf("token list after --revoke-tokens: exit %d, stdout %q; want every token revoked", code, out)
	}
	// The flag belongs to passwd only.
	if code, _, errOut := runCLIWith(t, nil, "long enough pw\n", "user", "add", "--revoke-tokens", "carol", "-db", db); code != 2 || !strings.Contains(errOut, "revoke-tokens") {
		t.Errorf("user add --revoke-tokens: exit %d, stderr %q; want 2 and the unknown flag named", code, errOut)
	}
	srv.Stop()
	checkDB(t, db)
}
