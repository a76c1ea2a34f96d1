package chat

import (
	"context"
	"time"
)

// User is an account. Everything a user creates (threads and all that hangs
// off them) is theirs alone; another user asking for it gets not_found.
type User struct {
	UserID    string    `json:"user_id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// HasPassword says whether the user can sign in with a password.
	HasPassword bool `json:"has_password"`
}

// APIToken is a bearer credential for programs. Its secret is shown once at
// creation and only a hash is stored.
type APIToken struct {
	TokenID   string     `json:"token_id"`
	UserID    string     `json:"user_id"`
	UserName  string     `json:"user_name"`
	Name      string     `json:"name"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// Session is one sign-in of a user, as an administrator sees it: when it
// began and when it ends. Its secret (the cookie) is never stored, only a
// hash, and a Session carries neither.
type Session struct {
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// How a Principal proved who it is.
const (
	AuthLocal   = "local"   // auth mode none: the one local user
	AuthSession = "session" // password sign-in, session cookie
	AuthToken   = "token"   // Authorization: Bearer
	AuthHeader  = "header"  // trusted reverse-proxy header
)

// Principal is the authenticated caller of one request or connection.
type Principal struct {
	UserID string
	Name   string
	// Method is one of AuthLocal, AuthSession, AuthToken, AuthHeader.
	Method string
	// Credential names the session or token the caller presented (its
	// hash or id, never the secret), so a long-lived connection can be
	// re-checked and ended when it is revoked. Empty for local and header.
	Credential string
}

// LocalPrincipal is the one local user of auth mode none.
func LocalPrincipal() Principal {
	return Principal{UserID: LocalUserID, Name: LocalUserName, Method: AuthLocal}
}

type principalKey struct{}

// NewContextWithPrincipal returns ctx carrying p.
func NewContextWithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFromContext returns the caller carried by ctx; ok is false when
// the request was never authenticated.
func PrincipalFromContext(ctx context.Context) (p Principal, ok bool) {
	p, ok = ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// UserIDFromContext returns the authenticated user's id, or "" when there is
// none. The store answers not_found for "", so a handler that forgot to
// authenticate can never read anybody's data.
func UserIDFromContext(ctx context.Context) string {
	p, _ := PrincipalFromContext(ctx)
	return p.UserID
}
