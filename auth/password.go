package auth

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/crypto/bcrypt"

	"github.com/honestcancel/gateway/chat"
)

const defaultCost = bcrypt.DefaultCost

// NormalizeName checks a user name and returns its canonical (lower-case)
// form: 1–64 characters of a–z, 0–9 and . _ @ -.
func NormalizeName(name string) (string, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if n == "" || len(n) > 64 {
		return "", errors.New("a user name has 1 to 64 characters")
	}
	for _, r := range n {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("._@-", r)) {
			return "", fmt.Errorf("a user name may hold only letters a-z, digits and . _ @ - (not %q)", r)
		}
	}
	return n, nil
}

// Reserved reports whether a normalized name is one that a reverse proxy
// may not give (header mode refuses it with 403): chat.LocalUserName, the
// one user of -auth none, whose conversations a proxy user of that name
// would see. (Password mode reaches it only once the operator gives it a
// password with `gateway user passwd local`, the documented way to keep
// what was made without accounts.)
func Reserved(norm string) bool { return norm == chat.LocalUserName }

// CheckPassword enforces the password rules: at least 8 characters, at
// most 72 bytes (bcrypt reads no further).
func CheckPassword(password string) error {
	if utf8.RuneCountInString(password) < 8 {
		return errors.New("a password needs at least 8 characters")
	}
	if len(password) > 72 {
		return errors.New("a password may have at most 72 bytes")
	}
	return nil
}

// HashPassword checks and bcrypt-hashes a password.
func HashPassword(password string, cost int) (string, error) {
	if err := CheckPassword(password); err != nil {
		return "", err
	}
	if cost == 0 {
		cost = defaultCost
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	if err != nil {
		return "", fmt.Errorf("hash password: %w", err)
	}
	return string(h), nil
}

// SignIn checks name and password and, when they match, starts a session
// and sets its cookie on w, and the device cookie that makes this browser
// a known client of the account (devices.go). Every attempt is charged to
// the brake before the password is checked (see LimiterConfig): while its
// client is locked, or the account slows clients it does not know, the
// answer is rate_limited with retry_after_seconds, and the password is not
// even checked; so it is when Hashing checks are already running. Every
// outcome is written to the audit log (never the password).
func (a *Authenticator) SignIn(w http.ResponseWriter, r *http.Request, name, password string) (chat.User, error) {
	if a.cfg.Mode == ModeOIDC {
		return chat.User{}, chat.Errorf(chat.CodeInvalidRequest,
			"this server signs users in through its identity provider, not with a password: use the sign-in button on /login")
	}
	if a.cfg.Mode != ModePassword {
		return chat.User{}, chat.Errorf(
			chat.CodeInvalidRequest,
			"this server signs users in through %s, not with a password",
			a.cfg.Mode,
		)
	}
	now := a.cfg.Now()
	addr := a.ClientIP(r)
	norm, nameErr := NormalizeName(name)
	refused := func(reason string, err error) (chat.User, error) {
		attrs := []slog.Attr{slog.String("user", norm), slog.String("addr", addr), slog.String("reason", reason)}
		if secs, ok := chat.RetryAfter(err); ok {
			attrs = append(attrs, slog.Int("retry_after_seconds", secs))
		}
		a.log.LogAttrs(r.Context(), slog.LevelWarn, AuditSignInFailed, attrs...)
		return chat.User{}, err
	}
	at := signInAttempt{addr: addr}
	var acct *storedAccount
	proofs := a.deviceProofs(r)
	if nameErr == nil {
		at.account = norm
		if len(proofs) > 0 { // only a device proof needs the account before the brake
			var err error
			if acct, err = a.lookUp(r.Context(), norm); err != nil {
				return refused("error", err)
			}
			at.device = knownDevice(proofs, acct.user.UserID, acct.hash, now)
		}
	}
	t, wait, why := a.limiter.admit(at, now)
	if t == nil {
		secs := max(1, int(math.Ceil(wait.Seconds()))) // never sooner than the refusal ends
		msg := "too many failed sign-ins: wait %d s and try again"
		if why == refusedSlowed {
			msg = "too many failed sign-ins to this account from browsers and addresses it does not know: " +
				"wait %d s and try again, or sign in from a browser or address that signed in to it before"
		}
		return refused(why, chat.Errorf(chat.CodeRateLimited, msg, secs).With("retry_after_seconds", secs))
	}
	select {
	case a.hashing <- struct{}{}:
	default:
		// Not checked, so not a failure: the charge is given back.
		a.limiter.refund(t)
		return refused(
			"busy",
			chat.Errorf(chat.CodeRateLimited, "too many sign-ins at once: wait 1 s and try again").
				With("retry_after_seconds", 1),
		)
	}
	acct, reason, err := func() (*storedAccount, string, error) {
		defer func() { <-a.hashing }()
		return a.checkPassword(r.Context(), norm, nameErr, password, acct)
	}()
	if err != nil {
		a.limiter.refund(t)
		return refused("error", err)
	}
	if reason != "" {
		return refused(reason, a.unauthorized("wrong user name or password"))
	}
	u := acct.user
	a.limiter.succeed(t, now)
	if err := a.startSession(w, r, u.UserID, now); err != nil {
		return refused("error", err)
	}
	a.rememberDevice(w, r, proofs, u.UserID, acct.hash, at.device, now)
	a.log.LogAttrs(r.Context(), slog.LevelInfo, AuditSignInSucceeded,
		slog.String("user", u.Name), slog.String("user_id", u.UserID), slog.String("addr", addr))
	return u, nil
}

// startSession starts a session of userID, valid for SessionTTL from now,
// and sets its cookie on w: what every successful sign-in (password or
// provider) ends with.
func (a *Authenticator) startSession(w http.ResponseWriter, r *http.Request, userID string, now time.Time) error {
	value := rand.Text() + rand.Text()
	expires := now.Add(a.cfg.SessionTTL)
	if err := a.cfg.Store.CreateSession(r.Context(), hashSecret(value), userID, expires); err != nil {
		return err
	}
	secure := a.secure(r)
	if c, err := r.Cookie(SessionCookie); secure && err == nil && c.Value != "" {
		clearCookie(w, SessionCookie, true) // left from before the __Host- name: never read over https
	}
	http.SetCookie(w, &http.Cookie{Name: a.cookieName(r), Value: value, Path: "/", Expires: expires,
		MaxAge: int(a.cfg.SessionTTL / time.Second), HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: secure})
	return nil
}

// The audit log's messages, one line per sign-in attempt. A sign-in
// through a provider (oidc.go) adds method=oidc and the provider's
// subject (and, on success, created: whether the account is new); its
// reasons start with "oidc_".
const (
	AuditSignInSucceeded = "sign-in succeeded" // info: user, user_id, addr
	AuditSignInFailed    = "sign-in failed"    // warn: user ("" for a name that is none), addr, reason
)

// storedAccount is an account as sign-in reads it: found is false when
// there is none of that name (user and hash are then empty); hash is ""
// when it has no password.
type storedAccount struct {
	user  chat.User
	hash  string
	found bool
}

func (a *Authenticator) lookUp(ctx context.Context, norm string) (*storedAccount, error) {
	u, hash, err := a.cfg.Store.UserByName(ctx, norm)
	switch {
	case chat.ErrorCode(err) == chat.CodeNotFound:
		return &storedAccount{}, nil
	case err != nil:
		return nil, err
	}
	return &storedAccount{user: u, hash: hash, found: true}, nil
}

// checkPassword runs the one bcrypt comparison of an attempt: against the
// account's hash, or against a dummy one when there is no such account
// (or it has no password), so that a wrong name costs what a wrong
// password costs. acct is the account when it was read already. reason
// says why the password does not sign in ("" when it does).
func (a *Authenticator) checkPassword(ctx context.Context, norm string, nameErr error, password string,
	acct *storedAccount) (*storedAccount, string, error) {
	hash, reason := a.dummyHash, "invalid_name"
	if nameErr == nil {
		if acct == nil {
			var err error
			if acct, err = a.lookUp(ctx, norm); err != nil {
				return nil, "", err
			}
		}
		switch {
		case !acct.found:
			reason = "unknown_user"
		case acct.hash == "":
			reason = "no_password"
		default:
			hash, reason = acct.hash, "wrong_password"
		}
	}
	if a.compare([]byte(hash), []byte(password)) != nil || hash == a.dummyHash {
		return nil, reason, nil
	}
	return acct, "", nil
}

// SignOut ends the request's session (if any) and clears the cookie. The
// session is forgotten by the credential cache once its end is written
// (and when the write fails, which may still have ended it), so an open
// WebSocket of it is refused at its next command.
func (a *Authenticator) SignOut(w http.ResponseWriter, r *http.Request) error {
	secure := a.secure(r)
	for _, name := range []string{SecureSessionCookie, SessionCookie} {
		c, err := r.Cookie(name)
		if err != nil || c.Value == "" {
			continue
		}
		if a.cfg.Store != nil {
			hash := hashSecret(c.Value)
			err := a.cfg.Store.DeleteSession(r.Context(), hash)
			a.Forget(sessionCredential(hash))
			if err != nil {
				return err
			}
		}
		if name != a.cookieName(r) {
			clearCookie(w, name, secure || name == SecureSessionCookie)
		}
	}
	clearCookie(w, a.cookieName(r), secure)
	return nil
}

func clearCookie(w http.ResponseWriter, name string, secure bool) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: secure})
}

// NewToken makes an API token: its id (stored), its secret hash (stored)
// and the whole token to show once ("<id>.<secret>").
func NewToken() (id, secretHash, token string) {
	id = chat.NewID(chat.PrefixToken)
	secret := rand.Text() + rand.Text()
	return id, hashSecret(secret), id + "." + secret
}

// TokenStore creates tokens (store.Accounts).
type TokenStore interface {
	CreateToken(ctx context.Context, userName string, tok chat.APIToken, secretHash string) (chat.APIToken, error)
}

// CreateToken makes and stores a token for the account userName, valid for
// ttl (0: until revoked), and returns it with the secret token string that
// is shown once.
func CreateToken(
	ctx context.Context,
	st TokenStore,
	userName, label string,
	ttl time.Duration,
	now time.Time,
) (chat.APIToken, string, error) {
	id, hash, token := NewToken()
	tok := chat.APIToken{TokenID: id, Name: label}
	if ttl > 0 {
		exp := now.Add(ttl)
		tok.ExpiresAt = &exp
	}
	tok, err := st.CreateToken(ctx, userName, tok, hash)
	if err != nil {
		return chat.APIToken{}, "", err
	}
	return tok, token, nil
}
