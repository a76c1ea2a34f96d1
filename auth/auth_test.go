package auth_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a settable time source for session expiry and the limiter.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "auth.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newAuth(t *testing.T, cfg auth.Config) (*auth.Authenticator, *clock) {
	t.Helper()
	clk := &clock{now: time.Now()}
	cfg.Now = clk.Now
	cfg.BcryptCost = 4 // bcrypt.MinCost: the rules are tested, not the hash's strength
	a, err := auth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a, clk
}

func addUser(t *testing.T, acc store.Accounts, name, password string) chat.User {
	t.Helper()
	hash, err := auth.HashPassword(password, 4)
	if err != nil {
		t.Fatal(err)
	}
	u, err := acc.CreateUser(context.Background(), name, hash)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func code(err error) string {
	if err == nil {
		return ""
	}
	return chat.ErrorCode(err)
}

// signIn posts credentials and returns the session cookie (nil on failure).
func signIn(t *testing.T, a *auth.Authenticator, name, password string) (*http.Cookie, error) {
	t.Helper()
	r := httptest.NewRequest("POST", "/login", nil)
	r.RemoteAddr = "192.0.2.10:5555"
	w := httptest.NewRecorder()
	if _, err := a.SignIn(w, r, name, password); err != nil {
		return nil, err
	}
	for _, c := range w.Result().Cookies() {
		if c.Name == auth.SessionCookie {
			return c, nil
		}
	}
	t.Fatal("signed in without a session cookie")
	return nil, nil
}

func withCookie(c *http.Cookie) *http.Request {
	r := httptest.NewRequest("GET", "/api/threads", nil)
	if c != nil {
		r.AddCookie(c)
	}
	return r
}

func TestModeNoneIsTheLocalUser(t *testing.T) {
	a, _ := newAuth(t, auth.Config{Mode: auth.ModeNone})
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer nonsense") // ignored: there are no accounts
	p, err := a.Authenticate(r)
	if err != nil || p.UserID != chat.LocalUserID || p.Method != chat.AuthLocal {
		t.Fatalf("none: %+v %v", p, err)
	}
}

func TestPasswordSessionLifecycle(t *testing.T) {
	st := openStore(t)
	a, clk := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts(), SessionTTL: time.Hour})
	alice := addUser(t, st.Accounts(), "alice", "correct horse")

	if _, err := a.Authenticate(withCookie(nil)); code(err) != chat.CodeUnauthorized {
		t.Fatalf("no cookie: %v", err)
	}
	if _, err := a.Authenticate(withCookie(&http.Cookie{Name: auth.SessionCookie, Value: "forged"})); code(err) != chat.CodeUnauthorized {
		t.Fatalf("forged cookie: %v", err)
	}
	c, err := signIn(t, a, "  Alice ", "correct horse") // names are case- and space-insensitive
	if err != nil {
		t.Fatal(err)
	}
	if !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Secure || c.MaxAge != 3600 {
		t.Fatalf("cookie attributes: %+v", c)
	}
	p, err := a.Authenticate(withCookie(c))
	if err != nil || p.UserID != alice.UserID || p.Method != chat.AuthSession {
		t.Fatalf("session: %+v %v", p, err)
	}
	if strings.Contains(p.Credential, c.Value) {
		t.Fatal("the principal carries the cookie secret")
	}
	if err := a.Revalidate(context.Background(), p); err != nil {
		t.Fatal(err)
	}

	// Expiry: the session ends at its TTL, for requests and connections.
	clk.Add(time.Hour + time.Second)
	if _, err := a.Authenticate(withCookie(c)); code(err) != chat.CodeUnauthorized {
		t.Fatalf("expired session: %v", err)
	}
	if err := a.Revalidate(context.Background(), p); code(err) != chat.CodeUnauthorized {
		t.Fatalf("expired session revalidated: %v", err)
	}

	// Sign out ends the session on the server, not just in the browser.
	c2, err := signIn(t, a, "alice", "correct horse")
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	if err := a.SignOut(w, withCookie(c2)); err != nil {
		t.Fatal(err)
	}
	if cl := w.Result().Cookies(); len(cl) != 1 || cl[0].MaxAge >= 0 {
		t.Fatalf("sign out did not clear the cookie: %+v", cl)
	}
	if _, err := a.Authenticate(withCookie(c2)); code(err) != chat.CodeUnauthorized {
		t.Fatalf("session after sign out: %v", err)
	}

	// A new password ends every session; a deleted user's too.
	c3, _ := signIn(t, a, "alice", "correct horse")
	hash, _ := auth.HashPassword("battery staple", 4)
	if err := st.Accounts().SetPassword(context.Background(), "alice", hash); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(withCookie(c3)); code(err) != chat.CodeUnauthorized {
		t.Fatalf("session after password change: %v", err)
	}
	if _, err := signIn(t, a, "alice", "correct horse"); code(err) != chat.CodeUnauthorized {
		t.Fatalf("old password after change: %v", err)
	}
	c4, err := signIn(t, a, "alice", "battery staple")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Accounts().DeleteUser(context.Background(), "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(withCookie(c4)); code(err) != chat.CodeUnauthorized {
		t.Fatalf("session of a deleted user: %v", err)
	}
	if _, err := signIn(t, a, "alice", "battery staple"); code(err) != chat.CodeUnauthorized {
		t.Fatalf("deleted user signed in: %v", err)
	}
	// The name is free again, for a new account that is not the old one.
	if _, err := st.Accounts().CreateUser(context.Background(), "bob", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Accounts().CreateUser(context.Background(), "bob", ""); code(err) != chat.CodeInvalidRequest {
		t.Fatalf("duplicate name: %v", err)
	}
	again := addUser(t, st.Accounts(), "alice", "new person pw")
	if again.UserID == alice.UserID {
		t.Fatal("a re-created name got the deleted account back")
	}
}

func TestSecureCookieBehindTLSProxy(t *testing.T) {
	st := openStore(t)
	a, _ := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts(),
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	addUser(t, st.Accounts(), "alice", "correct horse")
	for _, tc := range []struct {
		remote, proto string
		secure        bool
	}{
		{"10.1.2.3:1000", "https", true},   // trusted proxy terminated TLS
		{"192.0.2.1:1000", "https", false}, // anyone else's claim is ignored
		{"10.1.2.3:1000", "", false},
	} {
		r := httptest.NewRequest("POST", "/login", nil)
		r.RemoteAddr = tc.remote
		if tc.proto != "" {
			r.Header.Set("X-Forwarded-Proto", tc.proto)
		}
		w := httptest.NewRecorder()
		if _, err := a.SignIn(w, r, "alice", "correct horse"); err != nil {
			t.Fatal(err)
		}
		c := w.Result().Cookies()[0]
		if c.Secure != tc.secure {
			t.Errorf("%s proto %q: Secure = %v, want %v", tc.remote, tc.proto, c.Secure, tc.secure)
		}
		// A Secure cookie has the __Host- prefix; a plain one cannot.
		if want := map[bool]string{true: auth.SecureSessionCookie, false: auth.SessionCookie}[tc.secure]; c.Name != want {
			t.Errorf("%s proto %q: cookie %s, want %s", tc.remote, tc.proto, c.Name, want)
		}
	}
}

// Over https the session is read from the __Host- cookie only: the same
// value under the plain name (which a sibling host or a plain-http page
// can plant) is not a session. Sign-out clears the __Host- cookie.
func TestHostPrefixedCookieOverHTTPS(t *testing.T) {
	st := openStore(t)
	a, _ := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts(), SecureCookies: true})
	alice := addUser(t, st.Accounts(), "alice", "correct horse")
	w := httptest.NewRecorder()
	if _, err := a.SignIn(w, httptest.NewRequest("POST", "/login", nil), "alice", "correct horse"); err != nil {
		t.Fatal(err)
	}
	cl := w.Result().Cookies()
	if len(cl) != 2 || cl[0].Name != auth.SecureSessionCookie || !cl[0].Secure || cl[0].Path != "/" || cl[0].Domain != "" {
		t.Fatalf("cookies %+v, want __Host-gateway_session, Secure, Path=/, no Domain (then the device cookie)", cl)
	}
	if d := cl[1]; d.Name != auth.SecureDeviceCookie || !d.Secure || !d.HttpOnly || d.Path != "/" || d.Domain != "" {
		t.Fatalf("device cookie %+v, want __Host-gateway_device, Secure, HttpOnly, Path=/, no Domain", d)
	}
	c := cl[0]
	p, err := a.Authenticate(withCookie(c))
	if err != nil || p.UserID != alice.UserID {
		t.Fatalf("the __Host- cookie: %+v %v", p, err)
	}
	if _, err := a.Authenticate(withCookie(&http.Cookie{Name: auth.SessionCookie, Value: c.Value})); code(err) != chat.CodeUnauthorized {
		t.Fatalf("the session under the plain name over https: %v, want unauthorized", err)
	}
	w = httptest.NewRecorder()
	if err := a.SignOut(w, withCookie(c)); err != nil {
		t.Fatal(err)
	}
	if cl := w.Result().Cookies(); len(cl) != 1 || cl[0].Name != auth.SecureSessionCookie || cl[0].MaxAge >= 0 || !cl[0].Secure {
		t.Fatalf("sign out set %+v, want the __Host- cookie cleared (Secure, as the prefix requires)", cl)
	}
	if _, err := a.Authenticate(withCookie(c)); code(err) != chat.CodeUnauthorized {
		t.Fatalf("after sign out: %v", err)
	}
}

func TestBruteForceIsSlowedDown(t *testing.T) {
	st := openStore(t)
	a, clk := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts(),
		Limiter: auth.LimiterConfig{Free: 3, Base: time.Second, Max: 8 * time.Second}})
	addUser(t, st.Accounts(), "alice", "correct horse")
	addUser(t, st.Accounts(), "bob", "bobs password")

	for i := range 3 {
		if _, err := signIn(t, a, "alice", "guess"+string(rune('a'+i))); code(err) != chat.CodeUnauthorized {
			t.Fatalf("free failure %d: %v", i, err)
		}
	}
	// The 4th failure locks the name for 1 s; then 2 s, 4 s, capped at 8 s.
	for i, lock := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second} {
		if _, err := signIn(t, a, "alice", "wrong"); code(err) != chat.CodeUnauthorized {
			t.Fatalf("failure %d: %v", 4+i, err)
		}
		// While locked even the right password is refused, unchecked.
		_, err := signIn(t, a, "alice", "correct horse")
		var e *chat.Error
		if code(err) != chat.CodeRateLimited || !asError(err, &e) || e.Fields["retry_after_seconds"] != int(lock/time.Second) {
			t.Fatalf("locked %v: %v %+v", lock, err, e)
		}
		clk.Add(lock - time.Millisecond)
		if _, err := signIn(t, a, "alice", "correct horse"); code(err) != chat.CodeRateLimited {
			t.Fatalf("before the lock ends: %v", err)
		}
		clk.Add(time.Millisecond)
	}
	// Another user on another address is not affected by alice's lock.
	r := httptest.NewRequest("POST", "/login", nil)
	r.RemoteAddr = "198.51.100.7:1"
	if _, err := a.SignIn(httptest.NewRecorder(), r, "bob", "bobs password"); err != nil {
		t.Fatalf("bob: %v", err)
	}
	// After the lock, the right password works and clears the record.
	if _, err := signIn(t, a, "alice", "correct horse"); err != nil {
		t.Fatalf("after the lock: %v", err)
	}
	if _, err := signIn(t, a, "alice", "wrong"); code(err) != chat.CodeUnauthorized {
		t.Fatalf("record not cleared by success: %v", err)
	}
}

func TestUnknownUserCostsTheSameAndIsLimitedToo(t *testing.T) {
	st := openStore(t)
	a, _ := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts(), Limiter: auth.LimiterConfig{Free: 2}})
	for range 2 {
		if _, err := signIn(t, a, "nobody", "whatever1"); code(err) != chat.CodeUnauthorized {
			t.Fatal(err)
		}
	}
	if _, err := signIn(t, a, "nobody", "whatever1"); code(err) != chat.CodeUnauthorized {
		t.Fatal(err)
	}
	// Guessing names is limited like guessing passwords.
	if _, err := signIn(t, a, "nobody", "whatever1"); code(err) != chat.CodeRateLimited {
		t.Fatalf("unknown name not limited: %v", err)
	}
	// A user without a password (created by header mode) cannot sign in.
	if _, err := st.Accounts().CreateUser(context.Background(), "proxyuser", ""); err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/login", nil)
	r.RemoteAddr = "203.0.113.9:1"
	if _, err := a.SignIn(httptest.NewRecorder(), r, "proxyuser", ""); code(err) != chat.CodeUnauthorized {
		t.Fatalf("passwordless sign-in: %v", err)
	}
}

func TestLimiterMemoryIsBounded(t *testing.T) {
	st := openStore(t)
	a, _ := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts(), Limiter: auth.LimiterConfig{Entries: 20, Free: 1}})
	// 100 failures from 100 addresses for many names never grow past the
	// bound; the test would see no error either way, so it checks the one
	// observable consequence: the table forgot the first name (it is not
	// locked any more after being evicted).
	first := httptest.NewRequest("POST", "/login", nil)
	first.RemoteAddr = "203.0.113.1:1"
	for range 2 {
		a.SignIn(httptest.NewRecorder(), first, "victim", "wrong")
	}
	if _, err := a.SignIn(httptest.NewRecorder(), first, "victim", "wrong"); code(err) != chat.CodeRateLimited {
		t.Fatalf("victim not locked: %v", err)
	}
	for i := range 100 {
		r := httptest.NewRequest("POST", "/login", nil)
		r.RemoteAddr = netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}).String() + ":1"
		a.SignIn(httptest.NewRecorder(), r, "name"+string(rune('a'+i%26))+strings.Repeat("x", i%7), "wrong")
	}
	if _, err := a.SignIn(httptest.NewRecorder(), first, "victim", "wrong"); code(err) == chat.CodeRateLimited {
		t.Fatal("a table bounded at 20 keys still remembers the first of 200")
	}
}

func TestTokens(t *testing.T) {
	st := openStore(t)
	a, clk := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts()})
	alice := addUser(t, st.Accounts(), "alice", "correct horse")
	ctx := context.Background()
	tok, secret, err := auth.CreateToken(ctx, st.Accounts(), "alice", "ci", time.Hour, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	bearer := func(v string) *http.Request {
		r := httptest.NewRequest("GET", "/api/threads", nil)
		r.Header.Set("Authorization", v)
		return r
	}
	p, err := a.Authenticate(bearer("Bearer " + secret))
	if err != nil || p.UserID != alice.UserID || p.Method != chat.AuthToken || p.Credential != "token:"+tok.TokenID {
		t.Fatalf("token: %+v %v", p, err)
	}
	id, _, _ := strings.Cut(secret, ".")
	for name, h := range map[string]string{
		"wrong secret": "Bearer " + id + ".AAAA",
		"no secret":    "Bearer " + id,
		"basic auth":   "Basic YWxpY2U6cHc=",
		"empty bearer": "Bearer ",
		"garbage":      "Bearer x.y",
	} {
		if _, err := a.Authenticate(bearer(h)); code(err) != chat.CodeUnauthorized {
			t.Errorf("%s: %v", name, err)
		}
	}
	toks, err := st.Accounts().Tokens(ctx, "alice")
	if err != nil || len(toks) != 1 || toks[0].TokenID != tok.TokenID || toks[0].Name != "ci" {
		t.Fatalf("list: %+v %v", toks, err)
	}
	clk.Add(time.Hour)
	if _, err := a.Authenticate(bearer("Bearer " + secret)); code(err) != chat.CodeUnauthorized {
		t.Fatalf("expired token: %v", err)
	}
	_, secret2, err := auth.CreateToken(ctx, st.Accounts(), "alice", "", 0, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	p2, err := a.Authenticate(bearer("bearer " + secret2))
	if err != nil {
		t.Fatal(err)
	}
	id2, _, _ := strings.Cut(secret2, ".")
	if err := st.Accounts().RevokeToken(ctx, id2); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(bearer("Bearer " + secret2)); code(err) != chat.CodeUnauthorized {
		t.Fatalf("revoked token: %v", err)
	}
	if err := a.Revalidate(ctx, p2); code(err) != chat.CodeUnauthorized {
		t.Fatalf("revoked token revalidated: %v", err)
	}
	if err := st.Accounts().RevokeToken(ctx, "tok_nonexistent"); code(err) != chat.CodeNotFound {
		t.Fatalf("revoke unknown: %v", err)
	}
	if _, _, err := auth.CreateToken(ctx, st.Accounts(), "nobody", "", 0, clk.Now()); code(err) != chat.CodeNotFound {
		t.Fatalf("token for unknown user: %v", err)
	}
}

func TestHeaderModeTrustsOnlyTheProxy(t *testing.T) {
	st := openStore(t)
	if _, err := auth.New(auth.Config{Mode: auth.ModeHeader, Store: st.Accounts()}); err == nil {
		t.Fatal("header mode without trusted proxies accepted")
	}
	a, _ := newAuth(t, auth.Config{Mode: auth.ModeHeader, Store: st.Accounts(), ProxyHeader: "X-Remote-User",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}})
	req := func(remote, user string) *http.Request {
		r := httptest.NewRequest("GET", "/api/threads", nil)
		r.RemoteAddr = remote
		if user != "" {
			r.Header.Set("X-Remote-User", user)
		}
		return r
	}
	p1, err := a.Authenticate(req("127.0.0.1:4000", "Carol"))
	if err != nil || p1.Name != "carol" || p1.Method != chat.AuthHeader {
		t.Fatalf("proxy user: %+v %v", p1, err)
	}
	p2, err := a.Authenticate(req("[::1]:4000", "carol"))
	if err != nil || p2.UserID != p1.UserID {
		t.Fatalf("same user again is the same account: %+v %v", p2, err)
	}
	if _, err := a.Authenticate(req("192.0.2.5:4000", "carol")); code(err) != chat.CodeUnauthorized {
		t.Fatalf("header from outside the proxy: %v", err)
	}
	if _, err := a.Authenticate(req("127.0.0.1:4000", "")); code(err) != chat.CodeUnauthorized {
		t.Fatalf("no header: %v", err)
	}
	if _, err := a.Authenticate(req("127.0.0.1:4000", "bad name!")); code(err) != chat.CodeForbidden {
		t.Fatalf("bad name: %v", err)
	}
	if a.PasswordSignIn() {
		t.Fatal("header mode offers password sign-in")
	}
	// Concurrent first requests of a new user make one account.
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		wg.Go(func() {
			p, err := a.Authenticate(req("127.0.0.1:4000", "dave"))
			if err != nil {
				t.Error(err)
			}
			ids[i] = p.UserID
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("one user, several accounts: %v", ids)
		}
	}
}

func TestClientIPFromTrustedProxyOnly(t *testing.T) {
	a, _ := newAuth(t, auth.Config{Mode: auth.ModeNone, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	for _, tc := range []struct{ remote, xff, want string }{
		{"192.0.2.1:1", "203.0.113.5", "192.0.2.1"},                          // untrusted peer: its claim is ignored
		{"10.0.0.2:1", "203.0.113.5", "203.0.113.5"},                         // proxy: the client it saw
		{"10.0.0.2:1", "198.51.100.1, 203.0.113.5, 10.0.0.9", "203.0.113.5"}, // nearest untrusted hop
		{"10.0.0.2:1", "", "10.0.0.2"},
		{"10.0.0.2:1", "garbage", "10.0.0.2"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.remote
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		if got := a.ClientIP(r); got != tc.want {
			t.Errorf("%s via %q: %s, want %s", tc.remote, tc.xff, got, tc.want)
		}
	}
}

func TestNamesAndPasswords(t *testing.T) {
	for in, want := range map[string]string{"Alice": "alice", " bob@example.com ": "bob@example.com", "a.b-c_d": "a.b-c_d"} {
		if got, err := auth.NormalizeName(in); err != nil || got != want {
			t.Errorf("NormalizeName(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "   ", "with space", "semi;colon", "ünï", strings.Repeat("a", 65)} {
		if _, err := auth.NormalizeName(bad); err == nil {
			t.Errorf("NormalizeName(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"", "short", strings.Repeat("x", 73)} {
		if err := auth.CheckPassword(bad); err == nil {
			t.Errorf("CheckPassword(%q) accepted", bad)
		}
	}
	if _, err := auth.ParsePrefixes("10.0.0.0/8, 127.0.0.1 ,::1"); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.ParsePrefixes("10.0.0.0/8,nonsense"); err == nil {
		t.Fatal("bad prefix accepted")
	}
	if _, err := auth.ParseMode("basic"); err == nil {
		t.Fatal("unknown mode accepted")
	}
}

func asError(err error, target **chat.Error) bool {
	e, ok := err.(*chat.Error)
	if ok {
		*target = e
	}
	return ok
}
