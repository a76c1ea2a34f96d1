package auth

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
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
// and sets its cookie on w. Repeated failures for one name or from one
// client address are slowed down: while locked the answer is rate_limited
// with retry_after_seconds, and the password is not even checked.
func (a *Authenticator) SignIn(w http.ResponseWriter, r *http.Request, name, password string) (chat.User, error) {
	if a.cfg.Mode != ModePassword {
		return chat.User{}, chat.Errorf(chat.CodeInvalidRequest, "this server signs users in through %s, not with a password", a.cfg.Mode)
	}
	now := a.cfg.Now()
	norm, nameErr := NormalizeName(name)
	keys := []string{"ip:" + a.ClientIP(r)}
	if nameErr == nil {
		keys = append(keys, "user:"+norm)
	}
	if wait := a.limiter.wait(keys, now); wait > 0 {
		secs := max(1, int(math.Ceil(wait.Seconds()))) // never sooner than the lock ends
		return chat.User{}, chat.Errorf(chat.CodeRateLimited, "too many failed sign-ins: wait %d s and try again", secs).With("retry_after_seconds", secs)
	}
	var u chat.User
	hash := a.dummyHash
	if nameErr == nil {
		var stored string
		var err error
		u, stored, err = a.cfg.Store.UserByName(r.Context(), norm)
		if err != nil && chat.ErrorCode(err) != chat.CodeNotFound {
			return chat.User{}, err
		}
		if err == nil && stored != "" {
			hash = stored
		}
	}
	if bcrypt.CompareHashAndPassword([]byte(hash), []byte(password)) != nil || hash == a.dummyHash {
		a.limiter.fail(keys, now)
		return chat.User{}, a.unauthorized("wrong user name or password")
	}
	// Only the name's record is cleared: one good account must not reset
	// the brake on guessing from the same address.
	a.limiter.succeed(keys[1:])
	value := rand.Text() + rand.Text()
	expires := now.Add(a.cfg.SessionTTL)
	if err := a.cfg.Store.CreateSession(r.Context(), hashSecret(value), u.UserID, expires); err != nil {
		return chat.User{}, err
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: value, Path: "/", Expires: expires,
		MaxAge: int(a.cfg.SessionTTL / time.Second), HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: a.secure(r)})
	return u, nil
}

// SignOut ends the request's session (if any) and clears the cookie.
func (a *Authenticator) SignOut(w http.ResponseWriter, r *http.Request) error {
	if c, err := r.Cookie(SessionCookie); err == nil && c.Value != "" && a.cfg.Store != nil {
		if err := a.cfg.Store.DeleteSession(r.Context(), hashSecret(c.Value)); err != nil {
			return err
		}
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: a.secure(r)})
	return nil
}

// NewToken makes an API token: its id (stored), its secret hash (stored)
// and the whole token to show once ("<id>.<secret>").
func NewToken() (id, secretHash, token string) {
	id = chat.NewID(chat.PrefixToken)
	secret := rand.Text() + rand.Text()
	return id, hashSecret(secret), id + "." + secret
}

// TokenStore creates tokens (package store).
type TokenStore interface {
	CreateToken(ctx context.Context, userName string, tok chat.APIToken, secretHash string) (chat.APIToken, error)
}

// CreateToken makes and stores a token for the account userName, valid for
// ttl (0: until revoked), and returns it with the secret token string that
// is shown once.
func CreateToken(ctx context.Context, st TokenStore, userName, label string, ttl time.Duration, now time.Time) (chat.APIToken, string, error) {
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
