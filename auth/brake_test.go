package auth_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
)

// attempt is one sign-in from addr; it returns the error (nil: signed in).
func attempt(a *auth.Authenticator, addr, name, password string) error {
	r := httptest.NewRequest("POST", "/login", nil)
	r.RemoteAddr = addr
	_, err := a.SignIn(httptest.NewRecorder(), r, name, password)
	return err
}

// heldChecks counts the password checks (bcrypt) that really run and holds
// each until release is called, so a test sees how every other attempt of
// a burst was answered while those are still running: nothing depends on
// how fast anything is.
type heldChecks struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func holdChecks(a *auth.Authenticator) *heldChecks {
	h := &heldChecks{entered: make(chan struct{}, 10000), release: make(chan struct{})}
	auth.SetCompare(a, func(hash, password []byte) error {
		h.entered <- struct{}{}
		<-h.release
		return bcrypt.CompareHashAndPassword(hash, password)
	})
	return h
}

func (h *heldChecks) open() { h.once.Do(func() { close(h.release) }) }

// burstOutcome is what a burst of n sign-ins left: how many password checks
// ran at once, the answers of the attempts answered without one (early),
// and the answers of the checked ones (late).
type burstOutcome struct {
	n, checked  int
	early, late []error
}

// wantChecked checks what a burst of sign-ins (what) left: exactly want of
// them checked by bcrypt, each answered unauthorized after the checks, and
// every other one refused at once as rate_limited with message.
func (o burstOutcome) wantChecked(t *testing.T, what string, want int, message string) {
	t.Helper()
	if o.checked != want {
		t.Fatalf("%d of %d %s were checked by bcrypt at once, want %d", o.checked, o.n, what, want)
	}
	wantRetryLater(t, "one of the "+what+" beyond the ones checked", o.early, message)
	if len(o.late) != want {
		t.Fatalf("%d %s answered after the checks, want %d", len(o.late), what, want)
	}
	for _, err := range o.late {
		if code(err) != chat.CodeUnauthorized {
			t.Fatalf("a checked one of the %s: %v, want unauthorized", what, err)
		}
	}
}

// burst runs n sign-ins at once (attempt(i) is the i-th) and returns how
// many password checks ran and the answers of the attempts that were
// answered without one, once every attempt has either been answered or
// is being checked; then it lets the checks finish and returns their
// answers too.
func burst(t *testing.T, h *heldChecks, n int, attempt func(i int) error) burstOutcome {
	t.Helper()
	var checked int
	var early, late []error
	defer h.open()
	answers := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers <- attempt(i) })
	}
	timeout := time.After(30 * time.Second)
	for checked+len(early) < n {
		select {
		case <-h.entered:
			checked++
		case err := <-answers:
			early = append(early, err)
		case <-timeout:
			t.Fatalf("after 30 s, of %d sign-ins %d are being checked and %d answered: the others wait (queued) instead of being refused", n, checked, len(early))
		}
	}
	h.open()
	wg.Wait()
	close(answers)
	for err := range answers {
		late = append(late, err)
	}
	return burstOutcome{n: n, checked: checked, early: early, late: late}
}

// wantRetryLater requires every error to be rate_limited with a
// retry_after_seconds of at least 1 (the page's Retry-After).
func wantRetryLater(t *testing.T, why string, errs []error, message string) {
	t.Helper()
	for _, err := range errs {
		secs, ok := chat.RetryAfter(err)
		if code(err) != chat.CodeRateLimited || !ok || secs < 1 || !strings.Contains(err.Error(), message) {
			t.Fatalf("%s: %v (retry after %d s), want rate_limited %q with retry_after_seconds ≥ 1", why, err, secs, message)
		}
	}
}

// 200 wrong passwords for one name at once: each is charged before its
// password is checked, so only the allowance (3 free failures and the 4th,
// which locks the name) is checked at all; the rest are refused at once.
func TestConcurrentGuessesForOneNameAreChargedBeforeChecking(t *testing.T) {
	st := openStore(t)
	a, clk := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts(),
		Limiter: auth.LimiterConfig{Free: 3, Base: time.Second, Hashing: 64}})
	addUser(t, st.Accounts(), "alice", "correct horse")
	h := holdChecks(a)
	burst(t, h, 200, func(i int) error {
		return attempt(a, "192.0.2.10:5555", "alice", fmt.Sprintf("guess %d", i))
	}).wantChecked(t, "concurrent wrong passwords for one name (3 free failures and the one that locks)", 4, "too many failed sign-ins")
	// The lock holds for the right password too, unchecked; it ends.
	if err := attempt(a, "192.0.2.10:5555", "alice", "correct horse"); code(err) != chat.CodeRateLimited {
		t.Fatalf("the right password right after the burst: %v, want rate_limited", err)
	}
	clk.Add(time.Second)
	if err := attempt(a, "192.0.2.10:5555", "alice", "correct horse"); err != nil {
		t.Fatalf("the right password after the lock: %v", err)
	}
	if got := len(h.entered); got != 1 {
		t.Fatalf("%d checks for the two sign-ins after the burst, want 1 (the locked one is not checked)", got)
	}
}

// 200 sign-ins for as many names from one address at once: the address's
// allowance (9 free failures and the 10th, which locks it) is checked, no
// more.
func TestConcurrentGuessesFromOneAddressAreChargedBeforeChecking(t *testing.T) {
	st := openStore(t)
	a, _ := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts(),
		Limiter: auth.LimiterConfig{Free: 3, Hashing: 64}})
	for i := range 20 {
		addUser(t, st.Accounts(), fmt.Sprintf("user%d", i), "correct horse")
	}
	h := holdChecks(a)
	burst(t, h, 200, func(i int) error {
		return attempt(a, "198.51.100.7:1", fmt.Sprintf("user%d", i), "a wrong guess") // existing and unknown names
	}).wantChecked(t, "concurrent sign-ins from one address (9 free failures and the one that locks)", 10, "too many failed sign-ins")
	// The address is locked for every name, even with the right password.
	if err := attempt(a, "198.51.100.7:1", "user19", "correct horse"); code(err) != chat.CodeRateLimited {
		t.Fatalf("the right password from the locked address: %v, want rate_limited", err)
	}
}

// A flood of sign-ins for unknown names from many addresses (each under
// its own allowance) costs a dummy bcrypt each: at most Hashing of them run
// at once, the others are refused at once (not queued) and not charged.
func TestPasswordChecksAtOnceAreBounded(t *testing.T) {
	st := openStore(t)
	a, _ := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts(), Limiter: auth.LimiterConfig{Hashing: 4}})
	addUser(t, st.Accounts(), "alice", "correct horse")
	h := holdChecks(a)
	addr := func(i int) string { return netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}).String() + ":1" }
	burst(t, h, 200, func(i int) error {
		return attempt(a, addr(i), fmt.Sprintf("nobody%d", i), "whatever pw")
	}).wantChecked(t, "concurrent sign-ins for unknown names (the hashing bound)", 4, "too many sign-ins at once")
	// The slots are free again.
	if err := attempt(a, addr(199), "alice", "correct horse"); err != nil {
		t.Fatalf("the right password after the flood: %v", err)
	}
}

// A right password at the allowance's edge (the attempt that would lock)
// gives its charge back: it leaves no lock on the address.
func TestSuccessGivesTheChargeBack(t *testing.T) {
	st := openStore(t)
	a, _ := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts(), Limiter: auth.LimiterConfig{Free: 1}})
	addUser(t, st.Accounts(), "alice", "correct horse")
	const from = "192.0.2.44:1"
	for _, name := range []string{"n1", "n2"} { // 2 of the address's 3 free failures
		if err := attempt(a, from, name, "wrong pw"); code(err) != chat.CodeUnauthorized {
			t.Fatal(err)
		}
	}
	if err := attempt(a, from, "n3", "wrong pw"); code(err) != chat.CodeUnauthorized { // the 3rd
		t.Fatal(err)
	}
	if err := attempt(a, from, "alice", "correct horse"); err != nil { // the 4th: would lock; succeeds
		t.Fatalf("right password: %v", err)
	}
	if err := attempt(a, from, "n4", "wrong pw"); code(err) != chat.CodeUnauthorized {
		t.Fatalf("after a success at the edge the address is locked: %v", err)
	}
	if err := attempt(a, from, "n5", "wrong pw"); code(err) != chat.CodeRateLimited {
		t.Fatalf("the 5th failure from the address: %v, want rate_limited", err)
	}
}

// lockedBuffer is a log sink for several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSpace(l.b.String()), "\n")
}

// Every sign-in writes one audit line: who, from where (through trusted
// proxies), the outcome and why — never the password.
func TestSignInAuditLines(t *testing.T) {
	st := openStore(t)
	var buf lockedBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a, _ := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts(), Log: log,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Limiter: auth.LimiterConfig{Free: 1}})
	alice := addUser(t, st.Accounts(), "alice", "correct horse")
	viaProxy := func(name, password string) error {
		r := httptest.NewRequest("POST", "/login", nil)
		r.RemoteAddr = "10.0.0.2:4000"
		r.Header.Set("X-Forwarded-For", "198.51.100.1, 203.0.113.5")
		_, err := a.SignIn(httptest.NewRecorder(), r, name, password)
		return err
	}
	steps := []struct {
		name, password string
		do             func(name, password string) error
		want           string // the line, in slog's text form, after time=…
	}{
		{"Alice", "correct horse", viaProxy, `level=INFO msg="sign-in succeeded" user=alice user_id=` + alice.UserID + ` addr=203.0.113.5`},
		{"alice", "secret guess 1", viaProxy, `level=WARN msg="sign-in failed" user=alice addr=203.0.113.5 reason=wrong_password`},
		{"alice", "secret guess 2", viaProxy, `level=WARN msg="sign-in failed" user=alice addr=203.0.113.5 reason=wrong_password`},
		{"alice", "correct horse", viaProxy, `level=WARN msg="sign-in failed" user=alice addr=203.0.113.5 reason=locked retry_after_seconds=1`},
		{"mallory", "secret guess 3", func(n, p string) error { return attempt(a, "192.0.2.9:1", n, p) },
			`level=WARN msg="sign-in failed" user=mallory addr=192.0.2.9 reason=unknown_user`},
		{"secret guess 4!", "secret guess 5", func(n, p string) error { return attempt(a, "192.0.2.9:1", n, p) },
			`level=WARN msg="sign-in failed" user="" addr=192.0.2.9 reason=invalid_name`},
	}
	for i, s := range steps {
		s.do(s.name, s.password)
		lines := buf.lines()
		if len(lines) != i+1 {
			t.Fatalf("after sign-in %d: %d audit lines, want %d:\n%s", i+1, len(lines), i+1, strings.Join(lines, "\n"))
		}
		if _, got, _ := strings.Cut(lines[i], " "); got != s.want {
			t.Errorf("audit line of sign-in %d:\n got %s\nwant %s", i+1, got, s.want)
		}
	}
	for _, line := range buf.lines() {
		if strings.Contains(line, "correct horse") || strings.Contains(line, "secret guess") {
			t.Errorf("an audit line contains a password: %s", line)
		}
	}
}

// Header mode: a request that names the user more than once is refused
// 400 whichever way it does so, and creates no account.
func TestHeaderModeRefusesTwoNames(t *testing.T) {
	st := openStore(t)
	a, _ := newAuth(t, auth.Config{Mode: auth.ModeHeader, Store: st.Accounts(), ProxyHeader: "X-Remote-User",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	for name, h := range map[string]http.Header{
		"two header lines":      {"X-Remote-User": {"mallory", "carol"}},
		"two lines, one empty":  {"X-Remote-User": {"", "carol"}},
		"a comma-joined list":   {"X-Remote-User": {"mallory, carol"}},
		"a comma without space": {"X-Remote-User": {"mallory,carol"}},
	} {
		r := httptest.NewRequest("GET", "/api/threads", nil)
		r.RemoteAddr = "127.0.0.1:4000"
		r.Header = h
		_, err := a.Authenticate(r)
		if code(err) != chat.CodeInvalidRequest || !strings.Contains(err.Error(), "X-Remote-User") || !strings.Contains(err.Error(), "exactly one user") {
			t.Errorf("%s: %v, want invalid_request saying the proxy must name exactly one user", name, err)
		}
	}
	for _, name := range []string{"mallory", "carol"} {
		if _, _, err := st.Accounts().UserByName(context.Background(), name); code(err) != chat.CodeNotFound {
			t.Errorf("account %s after the refused requests: %v, want none", name, err)
		}
	}
}

// Header mode: the proxy naming the user "local" (any case) would make
// the caller the one user of -auth none, and show them every conversation
// made without accounts on the same database. It is refused with 403, a
// message saying what to do and a log line, and nobody becomes that user.
func TestHeaderModeRefusesTheLocalUser(t *testing.T) {
	st := openStore(t)
	var buf lockedBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a, _ := newAuth(t, auth.Config{Mode: auth.ModeHeader, Store: st.Accounts(), ProxyHeader: "X-Remote-User", Log: log,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	for _, name := range []string{"local", "Local", "LOCAL", " lOcAl "} {
		r := httptest.NewRequest("GET", "/api/threads", nil)
		r.RemoteAddr = "127.0.0.1:4000"
		r.Header.Set("X-Remote-User", name)
		p, err := a.Authenticate(r)
		if code(err) != chat.CodeForbidden || !strings.Contains(err.Error(), "reserved") || !strings.Contains(err.Error(), "rename that user at the proxy") {
			t.Errorf("X-Remote-User %q: %+v, %v; want 403 forbidden saying the name is reserved and to rename the user at the proxy", name, p, err)
		}
		if p.UserID != "" {
			t.Errorf("X-Remote-User %q made the caller %s", name, p.UserID)
		}
	}
	lines := buf.lines()
	if len(lines) != 4 {
		t.Fatalf("%d log lines for 4 refusals, want 4:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		if _, got, _ := strings.Cut(l, " "); got != `level=WARN msg="proxy user refused" user=local header=X-Remote-User addr=127.0.0.1 reason=reserved_name` {
			t.Errorf("log line %q", got)
		}
	}
	// Another name still works.
	r := httptest.NewRequest("GET", "/api/threads", nil)
	r.RemoteAddr = "127.0.0.1:4000"
	r.Header.Set("X-Remote-User", "localhost")
	if p, err := a.Authenticate(r); err != nil || p.Name != "localhost" || p.UserID == chat.LocalUserID {
		t.Errorf("X-Remote-User localhost: %+v %v, want its own account", p, err)
	}
}

// browser keeps the cookies a server sets, as a browser does, and sends
// them back.
type browser map[string]*http.Cookie

func (b browser) keep(w *httptest.ResponseRecorder) {
	for _, c := range w.Result().Cookies() {
		if c.MaxAge < 0 {
			delete(b, c.Name)
		} else {
			b[c.Name] = c
		}
	}
}

// signInFrom signs in from addr with the browser's cookies (nil: none,
// a private window) and keeps what the server sets.
func signInFrom(a *auth.Authenticator, b browser, addr, name, password string) error {
	r := httptest.NewRequest("POST", "/login", nil)
	r.RemoteAddr = addr
	for _, c := range b {
		r.AddCookie(&http.Cookie{Name: c.Name, Value: c.Value})
	}
	w := httptest.NewRecorder()
	_, err := a.SignIn(w, r, name, password)
	if b != nil {
		b.keep(w)
	}
	return err
}

// The attack of issue 30: one wrong password a second for alice, each
// from a new address, for ten minutes (the clock is the test's). With the
// default brake, alice signs in every time she tries: from her laptop
// (which signed in before) at a new address, and from her home address
// in a private window. The attacker gets at most the account's allowance
// for strangers checked (10, then one a minute); a stranger's right
// password is slowed by at most a minute, never locked out.
func TestRotatingAddressesCannotKeepTheOwnerOut(t *testing.T) {
	st := openStore(t)
	a, clk := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts()})
	addUser(t, st.Accounts(), "alice", "correct horse")
	const home = "198.51.100.1:50000"
	laptop := browser{}
	if err := signInFrom(a, laptop, home, "alice", "correct horse"); err != nil {
		t.Fatal(err)
	}
	var checked, slowed, ownerIn, ownerTries int
	for sec := 1; sec <= 600; sec++ {
		clk.Add(time.Second)
		attacker := fmt.Sprintf("[2001:db8:%x::1]:443", sec)
		switch err := signInFrom(a, nil, attacker, "alice", fmt.Sprintf("guess %d", sec)); code(err) {
		case chat.CodeUnauthorized:
			checked++
		case chat.CodeRateLimited:
			if secs, _ := chat.RetryAfter(err); secs < 1 || secs > 60 {
				t.Fatalf("second %d: the attacker is told to wait %d s, want 1 to 60", sec, secs)
			}
			slowed++
		default:
			t.Fatalf("second %d: a wrong password from a new address: %v", sec, err)
		}
		if sec%30 != 15 {
			continue
		}
		cafe := netip.AddrFrom4([4]byte{192, 0, 2, byte(sec / 30)}).String() + ":1"
		for _, try := range []struct {
			what, addr string
			b          browser
		}{{"her laptop at a café", cafe, laptop}, {"a private window at home", home, nil}} {
			ownerTries++
			if err := signInFrom(a, try.b, try.addr, "alice", "correct horse"); err != nil {
				t.Errorf("second %d: alice from %s: %v", sec, try.what, err)
				continue
			}
			ownerIn++
		}
	}
	t.Logf("alice got in %d times of %d; of 600 wrong passwords %d were checked, %d slowed", ownerIn, ownerTries, checked, slowed)
	if ownerIn != ownerTries {
		t.Fatalf("alice got in %d times of %d under the attack", ownerIn, ownerTries)
	}
	if checked < 10 || checked > 10+10 || checked+slowed != 600 {
		t.Fatalf("of 600 wrong passwords in 10 min, %d checked and %d slowed; want 10 to 20 checked (10, then one a minute), the rest slowed", checked, slowed)
	}
	// A stranger's browser with the right password (alice at a friend's):
	// slowed, at most a minute, not locked.
	err := signInFrom(a, browser{}, "192.0.2.250:1", "alice", "correct horse")
	if secs, _ := chat.RetryAfter(err); code(err) != chat.CodeRateLimited || secs > 60 || !strings.Contains(err.Error(), "signed in to it before") {
		t.Fatalf("alice from an unknown browser and address: %v (retry after %d s), want slowed at most 60 s, saying how to pass", err, secs)
	}
	clk.Add(time.Minute)
	if err := signInFrom(a, browser{}, "192.0.2.250:1", "alice", "correct horse"); err != nil {
		t.Fatalf("alice from an unknown browser a minute later: %v", err)
	}
}

// drain spends alice's allowance for strangers: 10 wrong passwords from
// as many new addresses.
func drain(t *testing.T, a *auth.Authenticator, round int) {
	t.Helper()
	for i := range 10 {
		if err := signInFrom(a, nil, fmt.Sprintf("203.0.%d.%d:1", round, i+1), "alice", "wrong guess"); code(err) != chat.CodeUnauthorized {
			t.Fatalf("stranger %d: %v, want unauthorized", i+1, err)
		}
	}
}

// newAddress is an address no sign-in came from before.
var newAddress atomic.Int32

// wantSlowed requires alice's right password from browser b at a new
// address to be slowed (the browser is not a device alice knows).
func wantSlowed(t *testing.T, a *auth.Authenticator, b browser, why string) {
	t.Helper()
	addr := fmt.Sprintf("192.0.2.%d:1", newAddress.Add(1))
	if err := signInFrom(a, b, addr, "alice", "correct horse"); code(err) != chat.CodeRateLimited {
		t.Fatalf("%s: %v, want slowed (rate_limited)", why, err)
	}
}

// The device cookie makes a browser known to the accounts that signed in
// there, and to no other: not to an account another browser signed in
// to, not once altered, not after the account's password changed, not
// after DeviceTTL without a sign-in. It holds proofs for at most 4
// accounts, the latest.
func TestDeviceCookieProvesOnlyWhatItShould(t *testing.T) {
	st := openStore(t)
	a, clk := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st.Accounts()})
	for _, n := range []string{"alice", "bob", "carol", "dave", "erin"} {
		addUser(t, st.Accounts(), n, "correct horse")
	}
	laptop, bobs := browser{}, browser{}
	for _, s := range []struct {
		b    browser
		name string
	}{{laptop, "alice"}, {laptop, "bob"}, {bobs, "bob"}} {
		if err := signInFrom(a, s.b, "198.51.100.1:1", s.name, "correct horse"); err != nil {
			t.Fatal(err)
		}
	}
	cookie := laptop[auth.DeviceCookie]
	if cookie == nil || !cookie.HttpOnly || cookie.Path != "/" || cookie.MaxAge != int(auth.DeviceTTL/time.Second) || strings.Count(cookie.Value, "~") != 1 {
		t.Fatalf("the laptop's device cookie %+v, want HttpOnly, Path=/, Max-Age of DeviceTTL, two proofs", cookie)
	}
	drain(t, a, 1)
	wantSlowed(t, a, browser{}, "a browser without a device cookie")
	wantSlowed(t, a, bobs, "bob's browser, for alice")
	var altered []string // each proof issued a second earlier
	for _, proof := range strings.Split(cookie.Value, "~") {
		parts := strings.Split(proof, ".")
		issued, err := strconv.ParseInt(parts[1], 10, 64)
		if len(parts) != 3 || err != nil {
			t.Fatalf("a proof %q is not id.issued.mac", proof)
		}
		altered = append(altered, parts[0]+"."+strconv.FormatInt(issued-1, 10)+"."+parts[2])
	}
	tampered := browser{auth.DeviceCookie: &http.Cookie{Name: auth.DeviceCookie, Value: strings.Join(altered, "~")}}
	wantSlowed(t, a, tampered, "the laptop's cookie with its issue times changed")
	if err := signInFrom(a, laptop, "198.51.100.200:1", "alice", "correct horse"); err != nil {
		t.Fatalf("the laptop, for alice: %v", err)
	}

	// A new password forgets every device of the account.
	hash, err := auth.HashPassword("correct horse", 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Accounts().SetPassword(context.Background(), "alice", hash); err != nil {
		t.Fatal(err)
	}
	wantSlowed(t, a, laptop, "the laptop after alice's password changed")

	// A device stays known DeviceTTL after its last sign-in.
	clk.Add(time.Hour) // the slowdown has room again
	if err := signInFrom(a, laptop, "198.51.100.1:1", "alice", "correct horse"); err != nil {
		t.Fatal(err)
	}
	clk.Add(auth.DeviceTTL - time.Second)
	drain(t, a, 2)
	if err := signInFrom(a, laptop, "198.51.100.201:1", "alice", "correct horse"); err != nil {
		t.Fatalf("the laptop a second before its proof ends: %v", err)
	}
	clk.Add(auth.DeviceTTL)
	drain(t, a, 3)
	wantSlowed(t, a, laptop, "the laptop DeviceTTL after its last sign-in")

	// Five accounts on one browser: the latest four stay known.
	shared := browser{}
	for _, n := range []string{"alice", "bob", "carol", "dave", "erin"} {
		clk.Add(time.Hour)
		if err := signInFrom(a, shared, "198.51.100.1:1", n, "correct horse"); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(shared[auth.DeviceCookie].Value, "~") + 1; n != 4 {
		t.Fatalf("the shared browser's cookie holds %d proofs, want 4", n)
	}
	drain(t, a, 4)
	wantSlowed(t, a, shared, "the shared browser, for alice, its oldest of five")
}
