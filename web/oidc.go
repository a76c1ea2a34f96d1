package web

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/a-h/templ"

	"github.com/honestcancel/gateway/chat"
)

// OIDC signs users in through an OpenID Connect provider (auth.OIDC).
type OIDC interface {
	// ProviderName names the provider on the sign-in button.
	ProviderName() string
	// Start begins a sign-in that comes back to next and returns the
	// provider's address to send the browser to.
	Start(w http.ResponseWriter, r *http.Request, next string) (string, error)
	// Finish completes the sign-in the provider sent the browser back
	// from: a session is started and where to go returned, or a
	// *chat.Error says why not and what to do.
	Finish(w http.ResponseWriter, r *http.Request) (string, error)
}

// oidcStartURL is the sign-in button's address.
func oidcStartURL(next string) templ.SafeURL {
	return templ.SafeURL("/auth/oidc/start?next=" + url.QueryEscape(next))
}

// signInPage reports whether the server has a sign-in page (/login): a
// password, a provider, or both.
func (p *Pages) signInPage() bool { return p.auth.PasswordSignIn() || p.opts.OIDC != nil }

// loginForm is the sign-in page's form with the ways this server offers.
func (p *Pages) loginForm(next string) LoginForm {
	f := LoginForm{Next: next, Password: p.auth.PasswordSignIn()}
	if p.opts.OIDC != nil {
		f.Provider = p.opts.OIDC.ProviderName()
	}
	return f
}

// noProvider answers the provider's routes on a server without one.
func (p *Pages) noProvider(w http.ResponseWriter, r *http.Request) {
	p.render(w, r, http.StatusNotFound, Refused("This server does not sign in through an identity provider."))
}

// oidcStart is GET /auth/oidc/start: the sign-in button. A browser
// already signed in goes on to next.
func (p *Pages) oidcStart(w http.ResponseWriter, r *http.Request) {
	if p.opts.OIDC == nil {
		p.noProvider(w, r)
		return
	}
	next := localNext(r.URL.Query().Get("next"))
	if _, err := p.auth.Authenticate(r); err == nil {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	to, err := p.opts.OIDC.Start(w, r, next)
	if err != nil {
		form := p.loginForm(next)
		form.ByProvider = true
		p.loginRefused(w, r, form, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// oidcCallback is GET /auth/oidc/callback, where the provider sends the
// browser back: signed in, it goes where the sign-in started from;
// refused, the sign-in page says why.
func (p *Pages) oidcCallback(w http.ResponseWriter, r *http.Request) {
	if p.opts.OIDC == nil {
		p.noProvider(w, r)
		return
	}
	next, err := p.opts.OIDC.Finish(w, r)
	if err != nil {
		form := p.loginForm("/")
		form.ByProvider = true
		p.loginRefused(w, r, form, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, localNext(next), http.StatusSeeOther)
}

// loginRefused shows the sign-in page with why the attempt was refused
// (a *chat.Error; any other error is the server's failure).
func (p *Pages) loginRefused(w http.ResponseWriter, r *http.Request, form LoginForm, err error) {
	var e *chat.Error
	if !errors.As(err, &e) {
		p.fail(w, err)
		return
	}
	form.Error = e.Message
	if secs, ok := chat.RetryAfter(err); ok {
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	p.render(w, r, chat.HTTPStatus(e.Code), Login(form))
}
