package app_test

// The sign-in brake under a burst, the audit lines and the __Host- cookie
// (-auth password: Config.AuthMode). The account commands that end
// sessions and tokens while the server runs, and header mode against an
// account of the CLI, are tested in the root package.

import (
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/internal/apptest"
)

// 200 wrong passwords for one name at once: each is charged before bcrypt
// runs, so only the allowance is checked (answered 401); the rest are
// refused 429 with Retry-After, unchecked.
func TestLoginBurstIsChargedBeforeChecking(t *testing.T) {
	const pw = "correct horse battery"
	db := dbWithFastUser(t, "alice", pw)
	srv := apptest.Start(t, authConfig(t, db, auth.ModePassword, ""))

	const n = 200
	statuses := make([]int, n)
	retries := make([]string, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			form := url.Values{"name": {"alice"}, "password": {fmt.Sprintf("guess %d", i)}, "next": {"/"}}
			resp, err := noRedirects.PostForm(srv.Base+"/login", form)
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
	// The right password waits for the lock. (The lock the burst left may
	// have run out already when the burst itself took longer than it, on a
	// loaded machine: one more wrong password makes sure the account is
	// locked — refused while the lock holds, or checked and locked anew.)
	if resp, _, cookie := login(srv, "alice", "one more guess", "/", nil); cookie != "" || (resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusUnauthorized) {
		t.Fatalf("a wrong password after the burst: %d (cookie %q), want 429 or 401", resp.StatusCode, cookie)
	}
	wantSignInRefused(srv, "alice", pw, http.StatusTooManyRequests, "the right password right after a wrong one")
	srv.Stop()
	// One audit line per attempt, each a failure.
	if got := srv.Logged("sign-in failed"); got != n+2 {
		t.Errorf("%d sign-in failed lines for %d refused sign-ins", got, n+2)
	}
	checkDB(t, db)
}

// Audit lines name the user and the client address (through a trusted
// proxy, the address it saw), one per sign-in, never the password.
func TestSignInAuditLog(t *testing.T) {
	const pw = "correct horse battery"
	db := dbWithUser(t, "alice", pw)
	srv := apptest.Start(t, authConfig(t, db, auth.ModePassword, "127.0.0.1"))
	viaProxy := http.Header{"X-Forwarded-For": {"203.0.113.7"}}
	if resp, _, cookie := login(srv, "alice", pw, "/", viaProxy); resp.StatusCode != http.StatusSeeOther || cookie == "" {
		t.Fatalf("sign in through the proxy: %d", resp.StatusCode)
	}
	if resp, _, _ := login(srv, "alice", "a wrong secret", "/", viaProxy); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong password: %d", resp.StatusCode)
	}
	if resp, _, _ := login(srv, "nobody", "another secret", "/", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unknown user: %d", resp.StatusCode)
	}
	srv.Stop()
	log := srv.Stderr()
	for _, want := range []string{
		`level=INFO msg="sign-in succeeded" user=alice user_id=usr_\S+ addr=203\.0\.113\.7$`,
		`level=WARN msg="sign-in failed" user=alice addr=203\.0\.113\.7 reason=wrong_password$`,
		`level=WARN msg="sign-in failed" user=nobody addr=127\.0\.0\.1 reason=unknown_user$`,
	} {
		if !regexp.MustCompile(`(?m)` + want).MatchString(log) {
			t.Errorf("no audit line matching %s in:\n%s", want, log)
		}
	}
	if srv.Logged("sign-in succeeded") != 1 || srv.Logged("sign-in failed") != 2 {
		t.Errorf("%d succeeded and %d failed lines, want 1 and 2", srv.Logged("sign-in succeeded"), srv.Logged("sign-in failed"))
	}
	for _, secret := range []string{pw, "a wrong secret", "another secret"} {
		if strings.Contains(log, secret) {
			t.Errorf("the log contains the password %q", secret)
		}
	}
}

// With Secure cookies the session cookie is __Host-gateway_session (only a
// secure page of this very host can set it), and the plain name is not
// read; without, it is gateway_session.
func TestSecureSessionCookieHasHostPrefix(t *testing.T) {
	const pw = "correct horse battery"
	db := dbWithUser(t, "alice", pw)
	cfg := authConfig(t, db, auth.ModePassword, "")
	cfg.SecureCookies = true
	srv := apptest.Start(t, cfg)
	resp, body, _ := login(srv, "alice", pw, "/", nil)
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
	threadList(srv, hostCookie)
	as(srv, hostCookie).Connect("the __Host- cookie").Close()
	wantUnauthorized(srv, who{cookie: session.Value}, "GET", "/api/threads", "the session under the plain name over a secure server")
	resp, _ = send(srv, hostCookie, "POST", "/logout", nil)
	if sc := resp.Header.Get("Set-Cookie"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(sc, "__Host-gateway_session=;") || !strings.Contains(sc, "Secure") {
		t.Errorf("sign out: %d Set-Cookie %q, want the __Host- cookie cleared", resp.StatusCode, sc)
	}
	wantUnauthorized(srv, hostCookie, "GET", "/api/threads", "the __Host- cookie after sign out")
	srv.Stop()
}
