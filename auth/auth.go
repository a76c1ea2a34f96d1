// Package auth decides who is calling. It knows four modes — none (one
// local user), password (accounts, bcrypt, session cookies), oidc (session
// cookies, signed in only through an OpenID Connect provider: oidc.go) and
// header (a trusted reverse proxy names the user) — plus API tokens for
// programs in the last three. Password mode can offer a provider's
// sign-in beside the password. It turns a request into a chat.Principal or an
// unauthorized error; what to do with either (a JSON 401, a redirect to the
// sign-in page) is the caller's business.
//
// An Authenticator is safe for concurrent use. It keeps no per-request
// state; the sign-in limiter and the credential cache (each with its own
// lock) and the bound on password checks running at once are its only
// shared mutable state.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/honestcancel/gateway/chat"
)

// Mode is how users prove who they are.
type Mode string

// The modes.
const (
	ModeNone     Mode = "none"
	ModePassword Mode = "password"
	ModeHeader   Mode = "header"
	// ModeOIDC signs users in only through an OpenID Connect provider
	// (OIDC); sessions and tokens then work as in ModePassword.
	ModeOIDC Mode = "oidc"
)

// ParseMode accepts none, password, oidc or header.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeNone, ModePassword, ModeHeader, ModeOIDC:
		return m, nil
	}
	return "", fmt.Errorf("-auth %q: use none, password, oidc or header", s)
}

// Store is the account storage the Authenticator needs (store.Accounts).
type Store interface {
	UserByName(ctx context.Context, name string) (chat.User, string, error)
	EnsureUser(ctx context.Context, name string) (chat.User, error)
	CreateSession(ctx context.Context, sessionHash, userID string, expires time.Time) error
	// SessionUntil returns the account of an unexpired session and when
	// the session expires, or not_found.
	SessionUntil(ctx context.Context, sessionHash string, now time.Time) (chat.User, time.Time, error)
	DeleteSession(ctx context.Context, sessionHash string) error
	// TokenUntil returns the account of a live token, its secret hash and
	// when it expires (zero: never), or not_found.
	TokenUntil(ctx context.Context, tokenID string, now time.Time) (chat.User, string, time.Time, error)
}

// Config configures an Authenticator.
type Config struct {
	Mode  Mode
	Store Store
	// ProxyHeader names the user in header mode (default X-Forwarded-User).
	ProxyHeader string
	// TrustedProxies are the addresses whose ProxyHeader, X-Forwarded-For
	// and X-Forwarded-Proto are believed. Required in header mode.
	TrustedProxies []netip.Prefix
	// SessionTTL is how long a sign-in lasts (default 7 days). Sessions
	// do not slide: after it the user signs in again.
	SessionTTL time.Duration
	// SecureCookies forces the Secure cookie attribute; it is set anyway
	// when the request came over TLS or a trusted proxy says https.
	SecureCookies bool
	// BcryptCost for new password hashes (default bcrypt.DefaultCost).
	BcryptCost int
	// Limits of the sign-in limiter (defaults in limiter.go).
	Limiter LimiterConfig
	// CredentialCache is how long RevalidateCached trusts a positive
	// answer of the store (never past the credential's own expiry). A
	// credential ended by another process (the account commands, another
	// instance) is seen by RevalidateCached at most this long after the
	// last read; one ended through this Authenticator (SignOut, Forget) at
	// once. 0 (the zero value) turns the cache off: every RevalidateCached
	// reads the store. The server uses DefaultCredentialCache (1 s).
	CredentialCache time.Duration
	// CredentialCacheEntries bounds the credentials cached at once
	// (default DefaultCredentialCacheEntries, 10 000); the oldest check is
	// evicted first.
	CredentialCacheEntries int
	// Now is the clock (default time.Now); tests move it.
	Now func() time.Time
	// Log receives the audit lines of sign-ins (AuditSignInSucceeded,
	// AuditSignInFailed); default: discarded.
	Log *slog.Logger
}

// Authenticator authenticates requests. Create it with New.
type Authenticator struct {
	cfg     Config
	limiter *limiter
	// dummyHash is compared against when the account does not exist or
	// has no password, so a wrong name costs as much time as a wrong
	// password.
	dummyHash string
	// hashing holds one token per password check running (capacity
	// Limiter.Hashing); a sign-in that finds it full is refused.
	hashing chan struct{}
	// compare is bcrypt.CompareHashAndPassword (tests count its calls).
	compare func(hash, password []byte) error
	log     *slog.Logger
	// checked remembers the credentials Revalidate found to hold.
	checked *credCache
}

// The names of the session cookie. A cookie set with Secure is named with
// the __Host- prefix, which browsers accept only from a secure origin,
// with Path=/ and no Domain: no other site, subdomain or plain-http page
// can set or overwrite it. Over plain http (which cannot have it) the
// cookie is SessionCookie.
const (
	SessionCookie       = "gateway_session"
	SecureSessionCookie = "__Host-" + SessionCookie
)

// New checks cfg and returns an Authenticator.
func New(cfg Config) (*Authenticator, error) {
	if cfg.ProxyHeader == "" {
		cfg.ProxyHeader = "X-Forwarded-User"
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 7 * 24 * time.Hour
	}
	if cfg.BcryptCost == 0 {
		cfg.BcryptCost = defaultCost
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	switch cfg.Mode {
	case ModeNone, ModePassword, ModeOIDC:
	case ModeHeader:
		if len(cfg.TrustedProxies) == 0 {
			return nil, fmt.Errorf(
				"-auth header needs -trusted-proxies: the addresses of the proxy that sets %s "+
					"(anyone else could set it too)",
				cfg.ProxyHeader,
			)
		}
	default:
		return nil, fmt.Errorf("unknown auth mode %q", cfg.Mode)
	}
	if cfg.Mode != ModeNone && cfg.Store == nil {
		return nil, fmt.Errorf("auth mode %s needs a store", cfg.Mode)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	a := &Authenticator{
		cfg:     cfg,
		limiter: newLimiter(cfg.Limiter),
		compare: bcrypt.CompareHashAndPassword,
		log:     cfg.Log,
		checked: newCredCache(cfg.CredentialCache, cfg.CredentialCacheEntries),
	}
	a.hashing = make(chan struct{}, a.limiter.cfg.Hashing)
	if cfg.Mode == ModePassword { // only SignIn compares against it
		dummy, err := bcrypt.GenerateFromPassword([]byte(rand.Text()), cfg.BcryptCost)
		if err != nil {
			return nil, fmt.Errorf("bcrypt cost %d: %w", cfg.BcryptCost, err)
		}
		a.dummyHash = string(dummy)
	}
	return a, nil
}

// unauthorized says what to do instead.
func (a *Authenticator) unauthorized(format string, args ...any) error {
	return chat.Errorf(chat.CodeUnauthorized, format, args...)
}

// Authenticate returns the caller of r, or an unauthorized (401) or
// forbidden (403) *chat.Error that says how to get in. A bearer token is
// accepted in password and header modes; mode none ignores credentials.
func (a *Authenticator) Authenticate(r *http.Request) (chat.Principal, error) {
	if a.cfg.Mode == ModeNone {
		return chat.LocalPrincipal(), nil
	}
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, token, _ := strings.Cut(h, " ")
		if !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
			return chat.Principal{}, a.unauthorized(
				"the Authorization header must be \"Bearer <token>\": " +
					"create a token with `gateway token create -user NAME`",
			)
		}
		return a.token(r.Context(), strings.TrimSpace(token))
	}
	switch a.cfg.Mode {
	case ModeHeader:
		return a.header(r)
	default:
		return a.session(r)
	}
}

// Revalidate reports whether p's credential still holds (a session not
// ended or expired, a token not revoked or expired), reading the store
// every time; long-lived connections call it at each keep-alive to end
// themselves when it no longer does. It answers nil, an unauthorized
// *chat.Error, or the store's error. A positive answer refreshes the
// credential cache (see RevalidateCached); any other answer removes the
// credential from it.
func (a *Authenticator) Revalidate(ctx context.Context, p chat.Principal) error {
	return a.revalidate(ctx, p, false)
}

// RevalidateCached is Revalidate for the hot path (every WebSocket
// command): when the store found p's credential to hold less than
// Config.CredentialCache ago, and the credential has not expired since
// nor been ended through this Authenticator (SignOut, Forget), it answers
// nil without reading the store. Only positive answers are cached.
func (a *Authenticator) RevalidateCached(ctx context.Context, p chat.Principal) error {
	return a.revalidate(ctx, p, true)
}

func (a *Authenticator) revalidate(ctx context.Context, p chat.Principal, cached bool) error {
	kind, id, _ := strings.Cut(p.Credential, ":")
	if kind != chat.AuthSession && kind != chat.AuthToken {
		return nil
	}
	now := a.cfg.Now()
	if cached && a.checked.holds(p.Credential, now) {
		return nil
	}
	// Read before the store: an answer read before a Forget must not be
	// put in after it.
	gen := a.checked.generation()
	var expires time.Time
	var err error
	if kind == chat.AuthSession {
		_, expires, err = a.cfg.Store.SessionUntil(ctx, id, now)
	} else {
		_, _, expires, err = a.cfg.Store.TokenUntil(ctx, id, now)
	}
	if err != nil {
		a.checked.drop(p.Credential)
		if chat.ErrorCode(err) == chat.CodeNotFound {
			return a.unauthorized("your %s was ended (signed out, revoked or expired): sign in again", kind)
		}
		return err
	}
	a.checked.put(p.Credential, gen, now, expires)
	return nil
}

// Forget drops credential (a chat.Principal's Credential) from the cache
// of RevalidateCached, so that its next call reads the store. Whatever
// ends a session or token through this process calls it after the end is
// written (SignOut does): the credential's connections are then refused
// at their next command. A check already reading the store when Forget
// runs does not put its answer in.
func (a *Authenticator) Forget(credential string) { a.checked.forget(credential) }

// cookieName is the session cookie's name for r: SecureSessionCookie
// when the cookie is Secure.
func (a *Authenticator) cookieName(r *http.Request) string {
	if a.secure(r) {
		return SecureSessionCookie
	}
	return SessionCookie
}

// sessionCookie is the request's session cookie: the __Host- one, which
// only a secure page of this very host can have set; over plain http the
// plain one. A plain cookie on a secure request is not read: a sibling
// host or a plain-http page could have planted it.
func (a *Authenticator) sessionCookie(r *http.Request) (*http.Cookie, error) {
	c, err := r.Cookie(SecureSessionCookie)
	if err == nil && c.Value != "" || a.secure(r) {
		return c, err
	}
	return r.Cookie(SessionCookie)
}

func (a *Authenticator) session(r *http.Request) (chat.Principal, error) {
	c, err := a.sessionCookie(r)
	if err != nil || c.Value == "" {
		return chat.Principal{}, a.unauthorized(
			"sign in at /login, or send Authorization: Bearer <token> " +
				"(create one with `gateway token create -user NAME`)",
		)
	}
	hash := hashSecret(c.Value)
	u, _, err := a.cfg.Store.SessionUntil(r.Context(), hash, a.cfg.Now())
	if chat.ErrorCode(err) == chat.CodeNotFound {
		return chat.Principal{}, a.unauthorized(
			"your session ended (signed out, expired or password changed): sign in again at /login",
		)
	}
	if err != nil {
		return chat.Principal{}, err
	}
	return chat.Principal{
		UserID:     u.UserID,
		Name:       u.Name,
		Method:     chat.AuthSession,
		Credential: sessionCredential(hash),
	}, nil
}

// sessionCredential is a session's chat.Principal.Credential.
func sessionCredential(hash string) string { return chat.AuthSession + ":" + hash }

func (a *Authenticator) token(ctx context.Context, token string) (chat.Principal, error) {
	id, secret, ok := strings.Cut(token, ".")
	if !ok || !strings.HasPrefix(id, chat.PrefixToken) || secret == "" {
		return chat.Principal{}, a.unauthorized(
			"malformed bearer token: it looks like tok_….…; create one with `gateway token create -user NAME`",
		)
	}
	u, want, _, err := a.cfg.Store.TokenUntil(ctx, id, a.cfg.Now())
	if chat.ErrorCode(err) == chat.CodeNotFound {
		return chat.Principal{}, a.unauthorized(
			"the bearer token is unknown, revoked or expired: create a new one with `gateway token create -user NAME`",
		)
	}
	if err != nil {
		return chat.Principal{}, err
	}
	if subtle.ConstantTimeCompare([]byte(hashSecret(secret)), []byte(want)) != 1 {
		return chat.Principal{}, a.unauthorized(
			"the bearer token is unknown, revoked or expired: create a new one with `gateway token create -user NAME`",
		)
	}
	return chat.Principal{
		UserID:     u.UserID,
		Name:       u.Name,
		Method:     chat.AuthToken,
		Credential: chat.AuthToken + ":" + id,
	}, nil
}

func (a *Authenticator) header(r *http.Request) (chat.Principal, error) {
	if !a.fromTrustedProxy(r) {
		return chat.Principal{}, a.unauthorized(
			"this server takes identities only from its reverse proxy: go through it, or use a bearer token",
		)
	}
	// Two header lines (Go keeps each as a value), or values joined by a
	// comma (as HTTP lets a proxy merge them): which one the proxy meant
	// cannot be known, and taking the first would let a client that adds
	// its own line ahead of the proxy's choose who it is.
	switch values := r.Header.Values(a.cfg.ProxyHeader); {
	case len(values) > 1:
		return chat.Principal{}, chat.Errorf(
			chat.CodeInvalidRequest,
			"the request carries %d %s headers: the proxy must name exactly one user (and drop the client's own)",
			len(values), a.cfg.ProxyHeader,
		)
	case len(values) == 1 && strings.Contains(values[0], ","):
		return chat.Principal{}, chat.Errorf(
			chat.CodeInvalidRequest,
			"the %s header holds a comma-separated list: the proxy must name exactly one user "+
				"(and drop the client's own)",
			a.cfg.ProxyHeader,
		)
	}
	raw := r.Header.Get(a.cfg.ProxyHeader)
	if raw == "" {
		return chat.Principal{}, a.unauthorized(
			"the proxy sent no %s header: sign in through the proxy",
			a.cfg.ProxyHeader,
		)
	}
	name, err := NormalizeName(raw)
	if err != nil {
		return chat.Principal{}, chat.Errorf(
			chat.CodeForbidden,
			"the proxy's %s is not a usable user name: %v",
			a.cfg.ProxyHeader, err,
		)
	}
	if Reserved(name) {
		a.log.LogAttrs(
			r.Context(),
			slog.LevelWarn,
			AuditProxyNameRefused,
			slog.String("user", name),
			slog.String("header", a.cfg.ProxyHeader),
			slog.String("addr", a.ClientIP(r)),
			slog.String("reason", "reserved_name"),
		)
		return chat.Principal{}, chat.Errorf(chat.CodeForbidden, "the proxy names the user %q in %s, "+
			"a name reserved for the built-in user of -auth none: rename that user at the proxy "+
			"(or map it to another name there)", name, a.cfg.ProxyHeader)
	}
	u, err := a.cfg.Store.EnsureUser(r.Context(), name)
	if err != nil {
		return chat.Principal{}, err
	}
	return chat.Principal{UserID: u.UserID, Name: u.Name, Method: chat.AuthHeader}, nil
}

// AuditProxyNameRefused is logged (warn: user, header, addr, reason) when
// header mode refuses the name the proxy sent because no account may have
// it (see Reserved).
const AuditProxyNameRefused = "proxy user refused"

// hashSecret is the stored form of a high-entropy secret (session cookie,
// token secret): SHA-256, hex. Passwords use bcrypt instead.
func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// PasswordSignIn reports whether users sign in with a password on /login.
func (a *Authenticator) PasswordSignIn() bool { return a.cfg.Mode == ModePassword }
