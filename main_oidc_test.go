package main

// Sign-in through an OpenID Connect provider (issue 35) against the real
// binary (built with -race), with a real provider in the test's process
// on 127.0.0.1 (mockoidc through internal/oidctest): the authorization
// code flow with PKCE driven as a browser does it (a cookie jar, every
// redirect looked at), the user keyed by issuer and subject, sign-out,
// every refusal with what the page says, and the flags that refuse a
// start. The page's side in a real browser: e2e/oidc.test.mjs.

import (
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/internal/oidctest"
)

const (
	oidcClientID = "gateway-test"
	oidcSecret   = "s3cret-of-the-test-client"
	oidcName     = "Test IdP"
)

// startProvider runs a provider for the test's client until the test ends.
func startProvider(t *testing.T) *oidctest.Provider {
	t.Helper()
	p, err := oidctest.Start(oidcClientID, oidcSecret, false)
	if err != nil {
		t.Fatalf("start the provider: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// freeAddr is a loopback address no one listens on (the redirect URL
// names the server's port before it starts).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startOIDCServer runs the binary signing in through p under -auth mode,
// with extra flags; the secret comes from the environment.
func startOIDCServer(t *testing.T, p *oidctest.Provider, mode string, extra ...string) *server {
	t.Helper()
	addr := freeAddr(t)
	flags := append([]string{"-addr", addr, "-auth", mode, "-oidc-issuer", p.Issuer(), "-oidc-client-id", oidcClientID,
		"-oidc-redirect-url", "http://" + addr + "/auth/oidc/callback", "-oidc-provider-name", oidcName}, extra...)
	return startServerEnv(t, []string{"GATEWAY_OIDC_CLIENT_SECRET=" + oidcSecret}, filepath.Join(t.TempDir(), "gw.db"), "5ms", flags...)
}

// oidcBrowser is a client that keeps cookies and shows every redirect, as the
// test follows them one by one.
type oidcBrowser struct {
	t      *testing.T
	jar    *cookiejar.Jar
	client *http.Client
}

func newOIDCBrowser(t *testing.T) *oidcBrowser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &oidcBrowser{t: t, jar: jar, client: &http.Client{Jar: jar, Timeout: 15 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// get fetches u with the jar's cookies and extra headers.
func (b *oidcBrowser) get(u string, header ...string) (*http.Response, string) {
	b.t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp, string(body)
}

// cookie is the value of the jar's cookie name for s ("" when none).
func (b *oidcBrowser) cookie(s *server, name string) string {
	u, _ := url.Parse(s.base)
	for _, c := range b.jar.Cookies(u) {
		if c.Name == name {
			return c.Value
		}
	}
	return ""
}

// toProvider presses "Sign in with …" (next: where to come back) and
// follows the provider, which signs in at once as its next user: it
// returns the callback address the provider sends the browser to.
func (b *oidcBrowser) toProvider(s *server, next string) string {
	b.t.Helper()
	resp, body := b.get(s.base + "/auth/oidc/start?next=" + url.QueryEscape(next))
	to := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(to, "/oidc/authorize?") {
		b.t.Fatalf("GET /auth/oidc/start: %d to %q (%.300s), want 303 to the provider", resp.StatusCode, to, body)
	}
	q := mustURL(b.t, to).Query()
	if q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || q.Get("nonce") == "" ||
		q.Get("state") == "" || q.Get("client_id") != oidcClientID || q.Get("redirect_uri") != s.base+"/auth/oidc/callback" {
		b.t.Fatalf("the authorization request %s: want PKCE (S256), a nonce, a state, the client id and the redirect URL", to)
	}
	if b.cookie(s, "gateway_oidc") == "" {
		b.t.Fatal("no cookie binds the sign-in to this browser")
	}
	resp, body = b.get(to)
	back := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusFound || !strings.HasPrefix(back, s.base+"/auth/oidc/callback?") {
		b.t.Fatalf("the provider answered %d to %q (%.300s), want a redirect to the callback", resp.StatusCode, back, body)
	}
	return back
}

// signIn runs a whole sign-in and requires it to succeed: back on next,
// with a session cookie.
func (b *oidcBrowser) signIn(s *server, next string) string {
	b.t.Helper()
	resp, body := b.get(b.toProvider(s, next))
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != next {
		b.t.Fatalf("the callback answered %d to %q, want 303 to %s; body %.600s", resp.StatusCode, resp.Header.Get("Location"), next, body)
	}
	session := b.cookie(s, "gateway_session")
	if session == "" || b.cookie(s, "gateway_oidc") != "" {
		b.t.Fatalf("after the sign-in: session %q, sign-in cookie %q; want a session and the sign-in's cookie gone", session, b.cookie(s, "gateway_oidc"))
	}
	return session
}

// wantRefused requires the callback's answer to be the sign-in page with
// status, saying says, without a session, and the audit line of reason.
func wantRefused(t *testing.T, s *server, b *oidcBrowser, resp *http.Response, body string, status int, says, reason string) {
	t.Helper()
	if resp.StatusCode != status || !strings.Contains(body, `data-testid="login-error"`) || !strings.Contains(body, says) {
		t.Fatalf("answered %d with %.1500s; want %d, the sign-in page saying %q", resp.StatusCode, body, status, says)
	}
	if !strings.Contains(body, "Sign in with "+oidcName) {
		t.Errorf("the refusal has no button to start again: %.1500s", body)
	}
	if c := b.cookie(s, "gateway_session"); c != "" {
		t.Errorf("a refused sign-in left a session cookie")
	}
	waitLogged(t, s, "reason=oidc_"+reason)
}

// waitLogged waits (bounded) until the server's log holds text.
func waitLogged(t *testing.T, s *server, text string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(s.Stderr(), text) {
		if time.Now().After(deadline) {
			t.Fatalf("the log has no %q:\n%s", text, s.Stderr())
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline (the log arrives through a pipe)
	}
}

func mustURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// The whole flow under -auth oidc: the sign-in page offers the provider
// only; the first sign-in creates the user, named from preferred_username
// and keyed by issuer and subject; a later one, whose e-mail and name
// changed at the provider, is the same user; the session works on the API;
// sign-out ends it on the server.
func TestOIDCSignInFlow(t *testing.T) {
	p := startProvider(t)
	s := startOIDCServer(t, p, "oidc", "-oidc-scopes", "openid email profile groups",
		"-oidc-allowed-domains", "example.com", "-oidc-allowed-groups", "chat,staff")

	b := newOIDCBrowser(t)
	resp, _ := b.get(s.base + "/t/thr_x")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login?next=%2Ft%2Fthr_x" {
		t.Fatalf("a page signed out: %d to %q, want 303 to /login", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp, body := b.get(s.base + "/login?next=/t/thr_x")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Sign in with "+oidcName) ||
		!strings.Contains(body, `href="/auth/oidc/start?next=%2Ft%2Fthr_x"`) || strings.Contains(body, `data-testid="login-form"`) {
		t.Fatalf("the sign-in page under -auth oidc: %d %.1500s; want the provider's button only", resp.StatusCode, body)
	}

	p.Next(oidctest.User{Subject: "sub-jane", Email: "jane@example.com", EmailVerified: true, PreferredUsername: "Jane", Groups: []string{"chat"}})
	session := b.signIn(s, "/")
	resp, body = b.get(s.base + "/")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `data-testid="account-name">jane<`) {
		t.Fatalf("the home page after signing in: %d %.600s; want it, as jane", resp.StatusCode, body)
	}
	db := auditDB(t, s.db)
	defer db.Close()
	userID := queryValue[string](t, db, `SELECT user_id FROM identities WHERE issuer = ? AND subject = ?`, p.Issuer(), "sub-jane")
	if name := queryValue[string](t, db, `SELECT name FROM users WHERE user_id = ?`, userID); name != "jane" {
		t.Fatalf("the identity's user is %q, want jane", name)
	}
	waitLogged(t, s, `msg="sign-in succeeded" user=jane user_id=`+userID)

	// Later, in another browser, the provider says another address and
	// name: still jane, the same user.
	p.Next(oidctest.User{Subject: "sub-jane", Email: "jane.doe@example.com", EmailVerified: true, PreferredUsername: "jdoe", Groups: []string{"staff"}})
	other := newOIDCBrowser(t)
	other.signIn(s, "/t/thr_x")
	_, body = other.get(s.base + "/")
	if !strings.Contains(body, `data-testid="account-name">jane<`) {
		t.Fatalf("the second sign-in is not jane: %.600s", body)
	}
	if n := queryValue[int](t, db, `SELECT COUNT(*) FROM users WHERE name NOT IN ('local')`); n != 1 {
		t.Fatalf("%d users after two sign-ins of one person, want 1", n)
	}
	if email := queryValue[string](t, db, `SELECT email FROM identities WHERE subject = 'sub-jane'`); email != "jane.doe@example.com" {
		t.Errorf("the identity records %q, want the address last seen", email)
	}

	// The session is the API's credential too; sign-out ends it there.
	if resp, _ := s.send(who{cookie: session}, "GET", "/api/threads", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/threads with the session: %d", resp.StatusCode)
	}
	if resp, _ := s.send(who{cookie: session}, "POST", "/logout", nil); resp.StatusCode != http.StatusSeeOther ||
		resp.Header.Get("Location") != "/login" {
		t.Fatalf("POST /logout: %d to %q, want 303 to /login", resp.StatusCode, resp.Header.Get("Location"))
	}
	s.wantUnauthorized(who{cookie: session}, "GET", "/api/threads", "the session after signing out")
	if _, body := other.get(s.base + "/"); !strings.Contains(body, `data-testid="account-name">jane<`) {
		t.Error("signing out one browser signed out the other")
	}

	// No password is taken.
	resp, body2, cookie := s.login("jane", "whatever-password", "/", nil)
	if resp.StatusCode != http.StatusBadRequest || cookie != "" || !strings.Contains(body2, "takes no passwords") {
		t.Errorf("POST /login under -auth oidc: %d cookie %q %.400s; want 400 saying it takes no passwords", resp.StatusCode, cookie, body2)
	}
	// The log holds no token and no code.
	if logs := s.Stderr(); strings.Contains(logs, "eyJ") || strings.Contains(logs, oidcSecret) {
		t.Errorf("the log holds a token or the secret:\n%s", logs)
	}

	// Started under another name of the server (localhost), a sign-in is
	// first sent to the redirect URL's host, where its cookie must live.
	resp, _ = newOIDCBrowser(t).get(s.base+"/auth/oidc/start?next=%2Ft%2Fthr_x", "Host", "localhost:"+mustURL(t, s.base).Port())
	if want := s.base + "/auth/oidc/start?moved=1&next=%2Ft%2Fthr_x"; resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
		t.Errorf("a start on localhost: %d to %q, want 303 to %s", resp.StatusCode, resp.Header.Get("Location"), want)
	}

	// Sign-ins started and never finished are bounded per address.
	flood := newOIDCBrowser(t)
	for i := 0; ; i++ {
		resp, body := flood.get(s.base + "/auth/oidc/start")
		if resp.StatusCode == http.StatusSeeOther {
			if i > 40 {
				t.Fatal("40 sign-ins in flight from one address, none refused")
			}
			continue
		}
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(body, "too many sign-ins were started and not finished") {
			t.Fatalf("sign-in %d from one address: %d %.600s; want 429 with Retry-After, saying why", i+1, resp.StatusCode, body)
		}
		break
	}
	waitLogged(t, s, "reason=oidc_too_many_started")
}

// Every refusal is the sign-in page saying what happened and what to do,
// with its reason in the log, and no session: a token altered after it was
// signed, issued for another client, expired, or for another sign-in (the
// nonce); an unverified e-mail, another domain, no allowed group; a
// callback replayed, from a browser that did not start it, or for an
// older sign-in of the same browser; the provider's own refusal.
func TestOIDCRefusals(t *testing.T) {
	p := startProvider(t)
	s := startOIDCServer(t, p, "oidc", "-oidc-scopes", "openid email profile groups",
		"-oidc-allowed-domains", "example.com", "-oidc-allowed-groups", "chat")
	good := oidctest.User{Subject: "sub-ok", Email: "ok@example.com", EmailVerified: true, PreferredUsername: "ok", Groups: []string{"chat"}}
	with := func(change func(u *oidctest.User)) oidctest.User {
		u := good
		change(&u)
		return u
	}
	for _, tc := range []struct {
		name   string
		user   oidctest.User
		status int
		says   string
		reason string
	}{
		{"tampered token", with(func(u *oidctest.User) { u.Tampered = true }), 401,
			"The ID token failed its signature check: it was altered on the way or not signed by " + oidcName, "bad_signature"},
		{"wrong audience", with(func(u *oidctest.User) { u.Audience = "another-app" }), 401,
			"was issued for another application", "wrong_audience"},
		{"expired token", with(func(u *oidctest.User) { u.Expired = true }), 401,
			"had expired when it arrived", "token_expired"},
		{"wrong nonce", with(func(u *oidctest.User) { u.Nonce = "not-this-sign-in" }), 401,
			"was not issued for this sign-in (its nonce differs): start again", "nonce_mismatch"},
		{"unverified e-mail", with(func(u *oidctest.User) { u.EmailVerified = false }), 403,
			"Your e-mail address is not verified at " + oidcName + ": verify it there and sign in again", "email_unverified"},
		{"another domain", with(func(u *oidctest.User) { u.Email = "ok@example.org" }), 403,
			"Accounts of the e-mail domain example.org may not sign in here", "domain_refused"},
		{"no allowed group", with(func(u *oidctest.User) { u.Groups = []string{"guests"} }), 403,
			"is in none of the groups allowed to sign in here", "group_refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p.Next(tc.user)
			b := newOIDCBrowser(t)
			resp, body := b.get(b.toProvider(s, "/"))
			wantRefused(t, s, b, resp, body, tc.status, tc.says, tc.reason)
		})
	}
	db := auditDB(t, s.db)
	defer db.Close()
	if n := queryValue[int](t, db, `SELECT COUNT(*) FROM identities`); n != 0 {
		t.Fatalf("refused sign-ins made %d identities", n)
	}

	t.Run("replayed state", func(t *testing.T) {
		p.Next(good)
		b := newOIDCBrowser(t)
		callback := b.toProvider(s, "/")
		pending := b.cookie(s, "gateway_oidc")
		b.get(callback) // signed in
		replay := newOIDCBrowser(t)
		resp, body := replay.get(callback, "Cookie", "gateway_oidc="+pending)
		wantRefused(t, s, replay, resp, body, 400, "This sign-in link was already used or has expired: start again", "state_used")
	})
	t.Run("not started in this browser", func(t *testing.T) {
		p.Next(good)
		callback := newOIDCBrowser(t).toProvider(s, "/")
		b := newOIDCBrowser(t) // (the victim of a login CSRF: a link to someone else's callback)
		resp, body := b.get(callback)
		wantRefused(t, s, b, resp, body, 400, "This sign-in was not started in this browser", "no_cookie")
	})
	t.Run("an older sign-in of the same browser", func(t *testing.T) {
		p.Next(good)
		b := newOIDCBrowser(t)
		first := b.toProvider(s, "/")
		p.Next(good)
		b.toProvider(s, "/") // started again, in another tab
		resp, body := b.get(first)
		wantRefused(t, s, b, resp, body, 400, "This sign-in answer is not for the sign-in this browser started last", "state_mismatch")
	})
	t.Run("the provider refused", func(t *testing.T) {
		b := newOIDCBrowser(t)
		resp, body := b.get(s.base + "/auth/oidc/callback?error=access_denied&error_description=user+said+no&state=x")
		wantRefused(t, s, b, resp, body, 403, oidcName+" did not let you sign in", "provider_error")
	})
	if logs := s.Stderr(); strings.Contains(logs, "eyJ") {
		t.Errorf("the log holds a token:\n%s", logs)
	}
}

// Beside passwords (-auth password): the sign-in page offers both; a
// person whose preferred_username is an existing account's name gets an
// account of their own (never the other one); the password account still
// signs in with its password.
func TestOIDCBesidePasswords(t *testing.T) {
	p := startProvider(t)
	addr := freeAddr(t)
	db := dbWithUser(t, "alice", "alice's password 1")
	s := startServerEnv(t, []string{"GATEWAY_OIDC_CLIENT_SECRET=" + oidcSecret}, db, "5ms", "-addr", addr, "-auth", "password",
		"-oidc-issuer", p.Issuer(), "-oidc-client-id", oidcClientID, "-oidc-redirect-url", "http://"+addr+"/auth/oidc/callback")
	b := newOIDCBrowser(t)
	_, body := b.get(s.base + "/login")
	host := mustURL(t, p.Issuer()).Hostname()
	if !strings.Contains(body, `data-testid="login-form"`) || !strings.Contains(body, "Sign in with "+host) {
		t.Fatalf("the sign-in page with a password and a provider: %.1500s; want both (the button named by the issuer's host)", body)
	}
	p.Next(oidctest.User{Subject: "sub-mallory", PreferredUsername: "alice", Email: "alice@example.com"})
	b.signIn(s, "/")
	if _, body := b.get(s.base + "/"); !strings.Contains(body, `data-testid="account-name">alice-2<`) {
		t.Fatalf("a provider's alice became: %.600s; want a new account alice-2", body)
	}
	s.signIn("alice", "alice's password 1")
}

// The flags refuse a start that could not work: a provider without
// accounts (-auth none, header), -auth oidc without a provider, a missing
// client id, secret or redirect URL, a secret given twice, a redirect URL
// on a host the server does not answer to, an issuer that is not https
// (but on loopback), and an issuer that cannot be read (the server does
// not start half-configured).
func TestOIDCFlags(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte(oidcSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secret := []string{"GATEWAY_OIDC_CLIENT_SECRET=" + oidcSecret}
	base := func(mode string) []string {
		return []string{"-db", filepath.Join(dir, "gw.db"), "-auth", mode, "-oidc-issuer", "http://127.0.0.1:1/realms/x",
			"-oidc-client-id", "c", "-oidc-redirect-url", "http://127.0.0.1:8080/auth/oidc/callback"}
	}
	for _, tc := range []struct {
		env  []string
		args []string
		code int
		says string
	}{
		{secret, base("none"), 2, "-oidc-issuer needs accounts, which -auth none does not have: use -auth oidc"},
		{secret, append(base("header"), "-trusted-proxies", "127.0.0.1"), 2, "-oidc-issuer does not work with -auth header"},
		{nil, []string{"-db", filepath.Join(dir, "gw.db"), "-auth", "oidc"}, 2, "-auth oidc needs a provider: set -oidc-issuer"},
		{nil, base("oidc"), 2, "needs the client's secret: set GATEWAY_OIDC_CLIENT_SECRET or -oidc-client-secret-file"},
		{secret, append(base("oidc"), "-oidc-client-secret-file", secretFile), 2, "the OIDC client secret is set twice"},
		{secret, append(base("oidc"), "-oidc-client-id", ""), 2, "-oidc-issuer needs -oidc-client-id"},
		{secret, append(base("oidc"), "-oidc-redirect-url", ""), 2, "-oidc-issuer needs -oidc-redirect-url"},
		{secret, append(base("oidc"), "-oidc-redirect-url", "http://127.0.0.1:8080/callback"), 2, "ending in /auth/oidc/callback"},
		{secret, append(base("oidc"), "-oidc-redirect-url", "https://chat.example.com/auth/oidc/callback"), 2,
			"names the host chat.example.com, which this server does not answer to"},
		{secret, append(base("oidc"), "-oidc-issuer", "http://idp.example.com/realms/x"), 2, "use the provider's https:// issuer URL"},
		{secret, append(base("oidc"), "-oidc-scopes", "email profile"), 2, "must hold openid"},
		{secret, []string{"-db", filepath.Join(dir, "gw.db"), "-oidc-client-id", "c"}, 2, "-oidc-issuer is not"},
		{nil, append(base("oidc"), "-oidc-client-secret-file", secretFile, "-addr", freeAddr(t)), 1,
			"-oidc-issuer http://127.0.0.1:1/realms/x: cannot read the provider's discovery document"},
	} {
		code, stderr, served := startOrRefuse(t, tc.env, tc.args...)
		if served || code != tc.code || !strings.Contains(stderr, tc.says) {
			t.Errorf("%v gateway %s: exit %d (served %v), stderr:\n%s\nwant exit %d saying %q", tc.env, strings.Join(tc.args, " "), code, served, stderr, tc.code, tc.says)
		}
		if strings.Contains(stderr, oidcSecret) {
			t.Errorf("gateway %s: the secret is in the output", strings.Join(tc.args, " "))
		}
	}
}
