package main

// The sign-in brake under a burst, the audit lines, header mode's one-name
// rule, the account commands that end sessions and tokens while the server
// runs, and the __Host- cookie — against the real binary (helpers of
// main_auth_test.go and main_test.go).

import (
	"fmt"
	"math"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// 200 wrong passwords for one name at once: each is charged before bcrypt
// runs, so only the allowance is checked (answered 401); the rest are
// refused 429 with Retry-After, unchecked.
func TestLoginBurstIsChargedBeforeChecking(t *testing.T) {
	const pw = "correct horse battery"
	db := dbWithFastUser(t, "alice", pw)
	srv := startServerWith(t, db, "5ms", "-auth", "password")

	const n = 200
	statuses := make([]int, n)
	retries := make([]string, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			form := url.Values{"name": {"alice"}, "password": {fmt.Sprintf("guess %d", i)}, "next": {"/"}}
			resp, err := noRedirects.PostForm(srv.base+"/login", form)
			if err != nil {
				return // status 0: counted below
			}
			resp.Body.Close()
			statuses[i], retries[i] = resp.StatusCode, resp.Header.Get("Retry-After")
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	took := time.Since(began)
	checked, other := 0, map[int]int{}
	for i, st := range statuses {
		switch st {
		case http.StatusUnauthorized:
			checked++
		case http.StatusTooManyRequests:
			if secs, err := strconv.Atoi(retries[i]); err != nil || secs < 1 {
				t.Errorf("429 with Retry-After %q, want whole seconds ≥ 1", retries[i])
			}
		default:
			other[st]++
		}
	}
	if len(other) > 0 {
		t.Errorf("answers other than 401 and 429 (status: how many; 0 = no answer within the client's 15 s): %v", other)
	}
	// Every 401 is one bcrypt check. The allowance is 4 (3 free failures
	// and the 4th, which locks for 1 s); a burst that outlasts locks of
	// 1 s, 2 s, 4 s… may have one more checked at the end of each, so the
	// bound counts the locks the burst could have outlasted — on a fast
	// machine (under 1 s) it is exactly 4.
	bound := 4 + int(math.Log2(took.Seconds()+1))
	t.Logf("%d of %d concurrent wrong passwords checked, in %v (bound %d)", checked, n, took.Round(time.Millisecond), bound)
	if checked < 1 || checked > bound {
		t.Fatalf("%d of %d concurrent wrong passwords were checked by bcrypt (answered 401), want 1 to %d", checked, n, bound)
	}
	// The right password still waits for the lock.
	srv.wantSignInRefused("alice", pw, http.StatusTooManyRequests, "the right password right after the burst")
	srv.stop()
	// One audit line per attempt, each a failure.
	if got := srv.logged("sign-in failed"); got != n+1 {
		t.Errorf("%d sign-in failed lines for %d refused sign-ins", got, n+1)
	}
	checkDB(t, db)
}

// Audit lines name the user and the client address (through a trusted
// proxy, the address it saw), one per sign-in, never the password.
func TestSignInAuditLog(t *testing.T) {
	const pw = "correct horse battery"
	db := dbWithUser(t, "alice", pw)
	srv := startServerWith(t, db, "5ms", "-auth", "password", "-trusted-proxies", "127.0.0.1")
	viaProxy := http.Header{"X-Forwarded-For": {"203.0.113.7"}}
	if resp, _, cookie := srv.login("alice", pw, "/", viaProxy); resp.StatusCode != http.StatusSeeOther || cookie == "" {
		t.Fatalf("sign in through the proxy: %d", resp.StatusCode)
	}
	if resp, _, _ := srv.login("alice", "a wrong secret", "/", viaProxy); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong password: %d", resp.StatusCode)
	}
	if resp, _, _ := srv.login("nobody", "another secret", "/", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unknown user: %d", resp.StatusCode)
	}
	srv.stop()
	log := srv.stderr()
	for _, want := range []string{
		`level=INFO msg="sign-in succeeded" user=alice user_id=usr_\S+ addr=203\.0\.113\.7$`,
		`level=WARN msg="sign-in failed" user=alice addr=203\.0\.113\.7 reason=wrong_password$`,
		`level=WARN msg="sign-in failed" user=nobody addr=127\.0\.0\.1 reason=unknown_user$`,
	} {
		if !regexp.MustCompile(`(?m)` + want).MatchString(log) {
			t.Errorf("no audit line matching %s in:\n%s", want, log)
		}
	}
	if srv.logged("sign-in succeeded") != 1 || srv.logged("sign-in failed") != 2 {
		t.Errorf("%d succeeded and %d failed lines, want 1 and 2", srv.logged("sign-in succeeded"), srv.logged("sign-in failed"))
	}
	for _, secret := range []string{pw, "a wrong secret", "another secret"} {
		if strings.Contains(log, secret) {
			t.Errorf("the log contains the password %q", secret)
		}
	}
}

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
	srv.stop()
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
	private := srv.createThread()
	srv.stop()

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
	if n := srv.logged("proxy user refused"); n != 12 {
		t.Errorf("%d \"proxy user refused\" log lines for 12 refused requests, want 12", n)
	}
	// A user of another name sees nothing of the no-auth user's.
	if got := srv.threadList(who{proxy: [2]string{"X-Test-User", "carol"}}); len(got) != 0 {
		t.Errorf("carol lists %v, want nothing", got)
	}
	srv.stop()
	// What docs/accounts.md documents stays: the operator gives the local user a
	// password and signs in as local in -auth password.
	if code, _, errOut := runCLIWith(t, nil, "correct horse battery\n", "user", "passwd", "local", "-db", db); code != 0 {
		t.Fatalf("user passwd local: exit %d, %s", code, errOut)
	}
	srv = startServerWith(t, db, "5ms", "-auth", "password")
	if got := srv.threadList(who{cookie: srv.signIn("local", "correct horse battery")}); len(got) != 1 || got[0] != private.ThreadID {
		t.Errorf("signed in as local with the password its operator gave it: lists %v, want [%s]", got, private.ThreadID)
	}
	srv.stop()
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
	srv.stop()
	checkDB(t, db)
}

// With Secure cookies the session cookie is __Host-gateway_session (only a
// secure page of this very host can set it), and the plain name is not
// read; without, it is gateway_session.
func TestSecureSessionCookieHasHostPrefix(t *testing.T) {
	const pw = "correct horse battery"
	db := dbWithUser(t, "alice", pw)
	srv := startServerWith(t, db, "5ms", "-auth", "password", "-secure-cookies")
	resp, body, _ := srv.login("alice", pw, "/", nil)
	var session, device *http.Cookie
	for _, c := range resp.Cookies() {
		switch {
		case c.Value == "":
		case strings.HasSuffix(c.Name, "gateway_device"):
			device = c
		default:
			session = c
		}
	}
	if device == nil || device.Name != "__Host-gateway_device" || !device.Secure || !device.HttpOnly || device.Path != "/" || device.Domain != "" {
		t.Errorf("sign in with -secure-cookies: device cookie %+v, want __Host-gateway_device, Secure, HttpOnly, Path=/, no Domain", device)
	}
	if resp.StatusCode != http.StatusSeeOther || session == nil || session.Name != "__Host-gateway_session" || !session.Secure || session.Path != "/" || session.Domain != "" {
		t.Fatalf("sign in with -secure-cookies: %d Set-Cookie %q; want __Host-gateway_session, Secure, Path=/, no Domain; body %.300s", resp.StatusCode, resp.Header.Values("Set-Cookie"), body)
	}
	hostCookie := who{header: http.Header{"Cookie": {"__Host-gateway_session=" + session.Value}}}
	srv.threadList(hostCookie)
	srv.as(hostCookie).connect("the __Host- cookie").Close()
	srv.wantUnauthorized(who{cookie: session.Value}, "GET", "/api/threads", "the session under the plain name over a secure server")
	resp, _ = srv.send(hostCookie, "POST", "/logout", nil)
	if sc := resp.Header.Get("Set-Cookie"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(sc, "__Host-gateway_session=;") || !strings.Contains(sc, "Secure") {
		t.Errorf("sign out: %d Set-Cookie %q, want the __Host- cookie cleared", resp.StatusCode, sc)
	}
	srv.wantUnauthorized(hostCookie, "GET", "/api/threads", "the __Host- cookie after sign out")
	srv.stop()
}
