package auth

// Sign-in through an OpenID Connect provider: the authorization code flow
// with PKCE, state and nonce (OpenID Connect Core 1.0, 3.1; RFC 7636).
//
// Start records the sign-in under the SHA-256 of a random state (in the
// store, so that any instance can finish it and it can be finished once
// only) and gives the browser a cookie holding the state and a second
// random secret; the PKCE verifier and the nonce are derived from that
// secret, so neither the database nor the URLs the provider sees hold
// what the token request needs. Finish takes the callback: the state must
// be the cookie's and still recorded (it is then removed: a replayed
// callback is refused), the code is exchanged with the verifier, the ID
// token is verified by go-oidc (signature by the provider's keys, issuer,
// audience = the client id, expiry) and must carry the nonce, the
// configured rules on e-mail domain and groups are applied, and the user
// is found, or created, by issuer and subject — never by e-mail or name.
// The session then starts as a password sign-in's does.

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/honestcancel/gateway/chat"
)

// OIDCConfig configures sign-in through an OpenID Connect provider.
type OIDCConfig struct {
	// Issuer is the provider's issuer URL, exactly as its discovery
	// document names it (https://keycloak.example.com/realms/NAME).
	Issuer string
	// ClientID and ClientSecret are the client registered at the provider.
	ClientID, ClientSecret string
	// RedirectURL is this server's callback as registered at the
	// provider: https://HOST/auth/oidc/callback.
	RedirectURL string
	// Scopes asked for (default openid, email, profile).
	Scopes []string
	// AllowedDomains, when set, admit only users whose e-mail address,
	// verified by the provider, is in one of these domains (lower case).
	AllowedDomains []string
	// GroupsClaim names the ID token claim listing the user's groups
	// (default "groups"; a dotted path reaches into objects:
	// realm_access.roles). AllowedGroups, when set, admit only users in one
	// of them.
	GroupsClaim   string
	AllowedGroups []string
	// ProviderName is what the sign-in button says: "Sign in with
	// <ProviderName>" (default: the issuer's host).
	ProviderName string
	// HTTPClient talks to the provider (default: 15 s per request).
	HTTPClient *http.Client
	// Now is the clock for token expiry (default: the Authenticator's).
	Now func() time.Time
}

// IdentityStore is what sign-in through a provider keeps (store.Accounts).
type IdentityStore interface {
	// BeginOIDCLogin records a sign-in in flight under the hash of its
	// state; rate_limited when addr has perAddr in flight or everyone
	// total.
	BeginOIDCLogin(ctx context.Context, stateHash, next, addr string, expires time.Time, perAddr, total int) error
	// TakeOIDCLogin removes the sign-in and returns its next; not_found
	// when unknown, taken before or expired.
	TakeOIDCLogin(ctx context.Context, stateHash string, now time.Time) (string, error)
	// SignInIdentity returns the user of (issuer, subject), creating it
	// under the first free one of names.
	SignInIdentity(ctx context.Context, issuer, subject, email string, names []string) (
		u chat.User, passwordHash string, created bool, err error)
}

// How long a sign-in may take at the provider, and how many may be in
// flight from one client address and over all.
const (
	OIDCLoginTTL     = 10 * time.Minute
	oidcLoginPerAddr = 30
	oidcLoginTotal   = 10000
)

// The names of the cookie of a sign-in in flight (the __Host- one when
// Secure, as for the session cookie).
const (
	OIDCCookie       = "gateway_oidc"
	SecureOIDCCookie = "__Host-" + OIDCCookie
)

// OIDC signs users in through one OpenID Connect provider. Create it with
// NewOIDC; safe for concurrent use (it keeps no per-request state: a
// sign-in in flight lives in the store and the browser's cookie).
type OIDC struct {
	cfg      OIDCConfig
	authn    *Authenticator
	store    IdentityStore
	oauth    oauth2.Config
	verifier *oidc.IDTokenVerifier
	log      *slog.Logger
	// redirect is RedirectURL parsed: a sign-in starts on its host, where
	// the callback will look for the sign-in's cookie.
	redirect *url.URL
}

// NewOIDC reads the provider's discovery document at cfg.Issuer (once:
// the server does not start without it) and returns the sign-in through
// it, whose sessions authn keeps.
func NewOIDC(ctx context.Context, cfg OIDCConfig, authn *Authenticator, st IdentityStore) (*OIDC, error) {
	redirect, err := url.Parse(cfg.RedirectURL)
	if cfg.Issuer == "" || cfg.ClientID == "" || err != nil || redirect.Host == "" {
		return nil, errors.New("sign-in through a provider needs its issuer, a client id and this server's redirect URL")
	}
	if authn.cfg.Mode != ModePassword && authn.cfg.Mode != ModeOIDC {
		return nil, fmt.Errorf("sign-in through a provider works with -auth oidc or password, not %s", authn.cfg.Mode)
	}
	if len(cfg.Scopes) == 0 {
		cfg.Scopes = []string{oidc.ScopeOpenID, "email", "profile"}
	}
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = "groups"
	}
	if cfg.ProviderName == "" {
		cfg.ProviderName = cfg.Issuer
		if u, err := url.Parse(cfg.Issuer); err == nil && u.Host != "" {
			cfg.ProviderName = u.Hostname()
		}
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 15 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = authn.cfg.Now
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, cfg.HTTPClient), 20*time.Second)
	defer cancel()
	provider, err := oidc.NewProvider(ctx, cfg.Issuer)
	if err != nil {
		var mismatch *oidc.IssuerMismatchError
		if errors.As(err, &mismatch) {
			return nil, fmt.Errorf("-oidc-issuer %s: the provider's discovery document names its issuer %q: "+
				"set -oidc-issuer to exactly that (the issuer in every ID token must match it)", cfg.Issuer, mismatch.Discovered)
		}
		return nil, fmt.Errorf("-oidc-issuer %s: cannot read the provider's discovery document (%s/.well-known/openid-configuration): %s. "+
			"Check the URL (the issuer exactly as the provider names it) and that this machine reaches it; "+
			"the server does not start without it", cfg.Issuer, strings.TrimSuffix(cfg.Issuer, "/"), short(err.Error()))
	}
	o := &OIDC{cfg: cfg, authn: authn, store: st, log: authn.log, redirect: redirect}
	o.oauth = oauth2.Config{ClientID: cfg.ClientID, ClientSecret: cfg.ClientSecret, Endpoint: provider.Endpoint(),
		RedirectURL: cfg.RedirectURL, Scopes: cfg.Scopes}
	o.verifier = provider.VerifierContext(oidc.ClientContext(context.Background(), cfg.HTTPClient),
		&oidc.Config{ClientID: cfg.ClientID, Now: cfg.Now})
	return o, nil
}

// ProviderName is the provider's name for people ("Keycloak").
func (o *OIDC) ProviderName() string { return o.cfg.ProviderName }

// Start begins a sign-in that comes back to next (a path of this site):
// it records it, sets the cookie that binds it to this browser on w, and
// returns the provider's address to send the browser to. Reached under
// another host name than the redirect URL's (localhost for 127.0.0.1, an
// old name), it returns the same start on that host instead, once: the
// callback comes back there, and a cookie set here would not.
func (o *OIDC) Start(w http.ResponseWriter, r *http.Request, next string) (string, error) {
	if !strings.EqualFold(r.Host, o.redirect.Host) {
		if !r.URL.Query().Has("moved") {
			return (&url.URL{Scheme: o.redirect.Scheme, Host: o.redirect.Host, Path: "/auth/oidc/start",
				RawQuery: url.Values{"next": {next}, "moved": {"1"}}.Encode()}).String(), nil
		}
		o.log.Warn("a sign-in started under another host name than -oidc-redirect-url's, which the browser was sent to: "+
			"does a proxy change the Host header? Its callback will find no cookie",
			"host", r.Host, "redirect_host", o.redirect.Host)
	}
	now := o.authn.cfg.Now()
	state, secret := rand.Text(), rand.Text()+rand.Text()
	addr := o.authn.ClientIP(r)
	if err := o.store.BeginOIDCLogin(r.Context(), hashSecret(state), next, addr, now.Add(OIDCLoginTTL),
		oidcLoginPerAddr, oidcLoginTotal); err != nil {
		if chat.ErrorCode(err) == chat.CodeRateLimited {
			o.refusedLog(r, "too_many_started", "")
		}
		return "", err
	}
	secure := o.authn.secure(r)
	http.SetCookie(w, &http.Cookie{Name: o.cookieName(secure), Value: state + "." + secret, Path: "/",
		MaxAge: int(OIDCLoginTTL / time.Second), HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: secure})
	return o.oauth.AuthCodeURL(state, oidc.Nonce(derive(secret, "nonce")),
		oauth2.S256ChallengeOption(derive(secret, "pkce"))), nil
}

func (o *OIDC) cookieName(secure bool) string {
	if secure {
		return SecureOIDCCookie
	}
	return OIDCCookie
}

// derive is a value of the sign-in derived from its browser secret: the
// PKCE verifier (43 characters of base64url, as RFC 7636 asks) or the
// nonce.
func derive(secret, what string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("gateway oidc v1\x00" + what))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// pending reads the browser's cookie of a sign-in in flight: its state
// and secret.
func (o *OIDC) pending(r *http.Request) (state, secret string, ok bool) {
	c, err := r.Cookie(SecureOIDCCookie)
	if (err != nil || c.Value == "") && !o.authn.secure(r) {
		c, err = r.Cookie(OIDCCookie)
	}
	if err != nil || len(c.Value) > 256 {
		return "", "", false
	}
	state, secret, ok = strings.Cut(c.Value, ".")
	return state, secret, ok && state != "" && secret != ""
}

// Finish completes the sign-in the provider sent the browser back from
// (the callback's query): on success it starts a session, sets its
// cookie on w and returns where to go. Every refusal is a
// *chat.Error whose message says what happened and what to do, and is
// logged (never a token or a code). The sign-in's cookie is cleared
// whatever the outcome: a sign-in is tried once.
func (o *OIDC) Finish(w http.ResponseWriter, r *http.Request) (string, error) {
	secure := o.authn.secure(r)
	state, secret, hasCookie := o.pending(r)
	for _, name := range []string{OIDCCookie, SecureOIDCCookie} {
		if _, err := r.Cookie(name); err == nil {
			clearCookie(w, name, secure || name == SecureOIDCCookie)
		}
	}
	q := r.URL.Query()
	name := o.cfg.ProviderName
	if code := q.Get("error"); code != "" {
		o.refusedLog(r, "provider_error", "", slog.String("error", short(code)),
			slog.String("error_description", short(q.Get("error_description"))))
		if code == "access_denied" {
			return o.refused(chat.CodeForbidden, "%s did not let you sign in (you declined, or it refused this application): "+
				"start again, or ask your administrator", name)
		}
		return o.refused(chat.CodeInvalidRequest, "%s answered the sign-in with the error %q: start again; "+
			"if it persists, tell your administrator (the server log has the details)", name, short(code))
	}
	if q.Get("state") == "" || q.Get("code") == "" {
		o.refusedLog(r, "no_code", "")
		return o.refused(chat.CodeInvalidRequest, "This address finishes a sign-in at %s and needs what %s adds to it: "+
			"start the sign-in again", name, name)
	}
	if !hasCookie {
		o.refusedLog(r, "no_cookie", "")
		return o.refused(chat.CodeInvalidRequest, "This sign-in was not started in this browser, or took longer than %d minutes "+
			"(or the browser blocks cookies): start again", int(OIDCLoginTTL/time.Minute))
	}
	if subtle.ConstantTimeCompare([]byte(state), []byte(q.Get("state"))) != 1 {
		o.refusedLog(r, "state_mismatch", "")
		return o.refused(chat.CodeInvalidRequest, "This sign-in answer is not for the sign-in this browser started last "+
			"(another tab may have started a newer one): start again")
	}
	next, err := o.store.TakeOIDCLogin(r.Context(), hashSecret(state), o.authn.cfg.Now())
	if chat.ErrorCode(err) == chat.CodeNotFound {
		o.refusedLog(r, "state_used", "")
		return o.refused(chat.CodeInvalidRequest, "This sign-in link was already used or has expired: start again")
	}
	if err != nil {
		return "", err
	}
	ctx := oidc.ClientContext(r.Context(), o.cfg.HTTPClient)
	code := q.Get("code")
	tok, err := o.oauth.Exchange(ctx, code, oauth2.VerifierOption(derive(secret, "pkce")))
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) {
			status := 0
			if re.Response != nil {
				status = re.Response.StatusCode
			}
			// (Some providers repeat the code in their description.)
			o.refusedLog(r, "code_refused", "", slog.String("error", short(re.ErrorCode)), slog.Int("status", status),
				slog.String("error_description", short(strings.ReplaceAll(re.ErrorDescription, code, "[code]"))))
			return o.refused(chat.CodeUnauthorized, "%s did not accept this sign-in's code (it may be used already or expired): "+
				"start again; if it persists, check the client id and secret registered for this server", name)
		}
		o.refusedLog(r, "provider_unreachable", "", slog.String("err", short(err.Error())))
		return o.refused(chat.CodeInternal, "%s could not be reached to finish the sign-in: try again in a moment", name)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		o.refusedLog(r, "no_id_token", "")
		return o.refused(chat.CodeUnauthorized, "%s sent no ID token: the client must ask for the openid scope "+
			"(-oidc-scopes); tell your administrator", name)
	}
	idt, err := o.verifier.Verify(ctx, raw)
	if err != nil {
		reason, msg := o.verifyRefusal(err)
		o.refusedLog(r, reason, "", slog.String("err", short(err.Error())))
		return o.refused(chat.CodeUnauthorized, "%s", msg)
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(derive(secret, "nonce"))) != 1 {
		o.refusedLog(r, "nonce_mismatch", idt.Subject)
		return o.refused(chat.CodeUnauthorized, "The ID token from %s was not issued for this sign-in (its nonce differs): "+
			"start again", name)
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return "", fmt.Errorf("read ID token claims: %w", err)
	}
	person := personOf(idt.Subject, claims)
	if reason, err := o.admit(person, claims); err != nil {
		o.refusedLog(r, reason, idt.Subject, slog.String("email_domain", person.domain()))
		return "", err
	}
	email := ""
	if person.emailVerified {
		email = person.email
	}
	u, hash, created, err := o.store.SignInIdentity(r.Context(), idt.Issuer, idt.Subject, email, person.names())
	if err != nil {
		o.refusedLog(r, "error", idt.Subject, slog.String("err", err.Error()))
		return "", err
	}
	now := o.authn.cfg.Now()
	if err := o.authn.startSession(w, r, u.UserID, now); err != nil {
		return "", err
	}
	if hash != "" {
		// An account that also has a password: this browser is now one it
		// knows, as after a password sign-in (devices.go).
		proofs := o.authn.deviceProofs(r)
		o.authn.rememberDevice(w, r, proofs, u.UserID, hash, knownDevice(proofs, u.UserID, hash, now), now)
	}
	o.log.LogAttrs(r.Context(), slog.LevelInfo, AuditSignInSucceeded, slog.String("user", u.Name),
		slog.String("user_id", u.UserID), slog.String("addr", o.authn.ClientIP(r)), slog.String("method", "oidc"),
		slog.String("subject", idt.Subject), slog.Bool("created", created))
	return next, nil
}

// verifyRefusal names why go-oidc refused an ID token: the audit log's
// reason and what the person is told.
func (o *OIDC) verifyRefusal(err error) (reason, message string) {
	name := o.cfg.ProviderName
	var expired *oidc.TokenExpiredError
	text := err.Error()
	switch {
	case errors.As(err, &expired):
		return "token_expired", fmt.Sprintf("The ID token from %s had expired when it arrived (at %s): start again; "+
			"if it persists, the clocks of %s and of this server disagree", name, expired.Expiry.UTC().Format(time.RFC3339), name)
	case strings.Contains(text, "expected audience"):
		return "wrong_audience", fmt.Sprintf("The ID token from %s was issued for another application (its audience is not "+
			"this server's client id): the administrator must check -oidc-client-id", name)
	case strings.Contains(text, "issued by a different provider"):
		return "wrong_issuer", fmt.Sprintf("The ID token was issued by another provider than %s: start again; "+
			"if it persists, the administrator must check -oidc-issuer", name)
	case strings.Contains(text, "fetching keys") || strings.Contains(text, "get keys failed"):
		return "keys_unreachable", fmt.Sprintf("%s's signing keys could not be read to check the sign-in: "+
			"try again in a moment", name)
	case strings.Contains(text, "signature") || strings.Contains(text, "malformed jwt") || strings.Contains(text, "not signed"):
		return "bad_signature", fmt.Sprintf("The ID token failed its signature check: it was altered on the way or not "+
			"signed by %s. Start again; if it persists, tell your administrator", name)
	}
	return "token_invalid", fmt.Sprintf("The ID token from %s could not be verified: start again; if it persists, "+
		"tell your administrator (the server log says why)", name)
}

// refused is a refusal of the sign-in, told as the page shows it.
func (o *OIDC) refused(code, format string, args ...any) (string, error) {
	return "", chat.Errorf(code, format, args...)
}

// refusedLog writes the audit line of a refused sign-in (reason prefixed
// "oidc_"), with the provider's subject when known.
func (o *OIDC) refusedLog(r *http.Request, reason, subject string, more ...slog.Attr) {
	attrs := append([]slog.Attr{slog.String("user", ""), slog.String("addr", o.authn.ClientIP(r)),
		slog.String("reason", "oidc_"+reason), slog.String("method", "oidc")}, more...)
	if subject != "" {
		attrs = append(attrs, slog.String("subject", subject))
	}
	o.log.LogAttrs(r.Context(), slog.LevelWarn, AuditSignInFailed, attrs...)
}

// short cuts text another party chose (an error, a description) to a
// length fit for a log line or a page, without control characters.
func short(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if r := []rune(s); len(r) > 200 {
		return string(r[:200]) + "…"
	}
	return s
}
