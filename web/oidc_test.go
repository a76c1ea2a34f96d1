package web

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/chat"
)

// signedOut is an Auth whose every caller is signed out; password says
// whether it takes passwords (auth mode password) or not (mode oidc).
type signedOut struct{ password bool }

func (signedOut) Authenticate(*http.Request) (chat.Principal, error) {
	return chat.Principal{}, chat.Errorf(chat.CodeUnauthorized, "sign in")
}
func (a signedOut) PasswordSignIn() bool { return a.password }
func (signedOut) SignIn(http.ResponseWriter, *http.Request, string, string) (chat.User, error) {
	return chat.User{}, chat.Errorf(chat.CodeUnauthorized, "wrong user name or password")
}
func (signedOut) SignOut(http.ResponseWriter, *http.Request) error { return nil }

// fakeProvider answers Start with its address and Finish with next or err.
type fakeProvider struct {
	next    string
	err     error
	started string // the next Start was given
}

func (*fakeProvider) ProviderName() string { return "Keycloak" }
func (f *fakeProvider) Start(_ http.ResponseWriter, _ *http.Request, next string) (string, error) {
	f.started = next
	return "https://idp.example.com/auth?state=s", nil
}
func (f *fakeProvider) Finish(http.ResponseWriter, *http.Request) (string, error) {
	return f.next, f.err
}

func oidcServer(password bool, f *fakeProvider) http.Handler {
	mux := http.NewServeMux()
	New(newFakeStore(), signedOut{password: password}, nil, nil).With(Options{OIDC: f}).Routes(mux)
	return mux
}

// The sign-in page offers the provider's button (with where to come back),
// beside the password form or alone; a page asked for signed out goes
// there; without a provider its routes answer 404.
func TestLoginWithProvider(t *testing.T) {
	f := &fakeProvider{}
	w := do(t, oidcServer(false, f), req{method: "GET", path: "/t/thr_1"})
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/login?next=%2Ft%2Fthr_1" {
		t.Fatalf("a page signed out, provider only: %d to %q, want 303 to /login", w.Code, w.Header().Get("Location"))
	}
	for _, password := range []bool{false, true} {
		w := do(t, oidcServer(password, f), req{method: "GET", path: "/login?next=/t/thr_1"})
		checkPageHeaders(t, w)
		doc := parse(t, w.Body.String())
		button := one(t, doc, byTestID("login-oidc"))
		if button.Text() != "Sign in with Keycloak" || attr(t, button, "href") != "/auth/oidc/start?next=%2Ft%2Fthr_1" ||
			button.HasClass("primary") == password {
			t.Errorf("password %v: the button %q to %q (primary %v); want the provider's, primary when alone", password,
				button.Text(), attr(t, button, "href"), button.HasClass("primary"))
		}
		if n := doc.Find(byTestID("login-form")).Length(); (n == 1) != password {
			t.Errorf("password %v: %d password forms", password, n)
		}
	}
	w = do(t, oidcServer(false, f), req{method: "POST", path: "/login",
		form: url.Values{"name": {"a"}, "password": {"b"}, "next": {"/"}}, header: sameOrigin})
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "This server takes no passwords: sign in with Keycloak.") {
		t.Errorf("a password posted to a provider-only server: %d %s", w.Code, w.Body)
	}
	mux := http.NewServeMux()
	New(newFakeStore(), signedOut{password: true}, nil, nil).Routes(mux)
	for _, path := range []string{"/auth/oidc/start", "/auth/oidc/callback?code=c&state=s"} {
		if w := do(t, mux, req{method: "GET", path: path}); w.Code != http.StatusNotFound {
			t.Errorf("GET %s without a provider: %d, want 404", path, w.Code)
		}
	}
}

// Start sends the browser to the provider (next kept on this site);
// the callback goes on to next, or shows the refusal on the sign-in page.
func TestProviderStartAndCallback(t *testing.T) {
	f := &fakeProvider{next: "/t/thr_1"}
	h := oidcServer(true, f)
	w := do(t, h, req{method: "GET", path: "/auth/oidc/start?next=" + url.QueryEscape("//evil.example/x")})
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "https://idp.example.com/auth?state=s" || f.started != "/" {
		t.Fatalf("start: %d to %q, next %q; want 303 to the provider, next / (not another site)", w.Code, w.Header().Get("Location"), f.started)
	}
	w = do(t, h, req{method: "GET", path: "/auth/oidc/callback?code=c&state=s"})
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/t/thr_1" {
		t.Fatalf("callback: %d to %q, want 303 to /t/thr_1", w.Code, w.Header().Get("Location"))
	}
	f.next = "https://evil.example/"
	if w = do(t, h, req{method: "GET", path: "/auth/oidc/callback?code=c&state=s"}); w.Header().Get("Location") != "/" {
		t.Fatalf("callback to another site: to %q, want /", w.Header().Get("Location"))
	}
	f.err = chat.Errorf(chat.CodeForbidden, "Your e-mail address is not verified at Keycloak: verify it there and sign in again")
	w = do(t, h, req{method: "GET", path: "/auth/oidc/callback?code=c&state=s"})
	checkPageHeaders(t, w)
	doc := parse(t, w.Body.String())
	if w.Code != http.StatusForbidden || one(t, doc, byTestID("login-error")).Text() != f.err.(*chat.Error).Message ||
		attr(t, one(t, doc, byTestID("login-error")), "role") != "alert" {
		t.Fatalf("a refused callback: %d %s; want 403 and the sign-in page saying why", w.Code, w.Body)
	}
	// The focus is on the provider's button (to try again), not in the
	// password form beside it; a password's refusal keeps it in the form.
	if focused := doc.Find("[autofocus]"); focused.Length() != 1 || attr(t, focused, "data-testid") != "login-oidc" {
		t.Errorf("a refused callback: %d elements have autofocus (%v), want the provider's button alone", focused.Length(), focused.Nodes)
	}
	w = do(t, h, req{method: "POST", path: "/login", form: url.Values{"name": {"a"}, "password": {"wrong"}, "next": {"/"}}, header: sameOrigin})
	if focused := parse(t, w.Body.String()).Find("[autofocus]"); focused.Length() != 1 || attr(t, focused, "id") != "login-password" {
		t.Errorf("a refused password (%d): autofocus on %d elements (%v), want the password field alone", w.Code, focused.Length(), focused.Nodes)
	}
}
