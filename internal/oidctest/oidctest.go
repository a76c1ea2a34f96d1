// Package oidctest runs a real OpenID Connect provider on 127.0.0.1 for
// tests: oauth2-proxy's mockoidc (discovery, authorization with PKCE,
// token, JWKS, RS256-signed ID tokens), whose authorization endpoint signs
// in, without a form, as the user queued next (Next). A queued user can
// also ask for a bad ID token — another audience, already expired, another
// nonce, or altered after signing — so that tests see how a client
// refuses it. Only tests and the helper command internal/oidcprovider
// import it: it is never in the gateway's binary.
package oidctest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/oauth2-proxy/mockoidc"
)

// User is who the provider signs in as at the next authorization, and
// what is wrong with the ID token it then issues (nothing by default).
type User struct {
	Subject           string   `json:"sub"`
	Email             string   `json:"email,omitempty"`
	EmailVerified     bool     `json:"email_verified,omitempty"`
	PreferredUsername string   `json:"preferred_username,omitempty"`
	Groups            []string `json:"groups,omitempty"`
	// Audience replaces the token's audience (the client id).
	Audience string `json:"audience,omitempty"`
	// Expired makes a token that expired an hour ago.
	Expired bool `json:"expired,omitempty"`
	// Nonce replaces the nonce the client asked for.
	Nonce string `json:"nonce,omitempty"`
	// Tampered changes the token's subject after it was signed, so that
	// its signature no longer matches.
	Tampered bool `json:"tampered,omitempty"`
}

// Provider is a running provider. Its handlers run one at a time
// (mockoidc's session store has no lock of its own); its methods are safe
// for concurrent use.
type Provider struct {
	m *mockoidc.MockOIDC
	// mu serializes the handlers and guards tamper.
	mu sync.Mutex
	// tamper is set while the token endpoint issues a token to alter.
	tamper bool
	// served is closed once the server stopped serving.
	served chan struct{}
}

// Start runs a provider on 127.0.0.1 (a free port) for the client
// clientID with clientSecret. With control, it also takes the next user as
// JSON on POST /control/next-user (for a test in another process).
func Start(clientID, clientSecret string, control bool) (*Provider, error) {
	m, err := mockoidc.NewServer(nil)
	if err != nil {
		return nil, err
	}
	m.ClientID, m.ClientSecret = clientID, clientSecret
	m.CodeChallengeMethodsSupported = []string{mockoidc.CodeChallengeMethodS256}
	p := &Provider{m: m, served: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc(mockoidc.AuthorizationEndpoint, m.Authorize)
	mux.HandleFunc(mockoidc.TokenEndpoint, p.token(m.Token))
	mux.HandleFunc(mockoidc.UserinfoEndpoint, m.Userinfo)
	mux.HandleFunc(mockoidc.JWKSEndpoint, m.JWKS)
	mux.HandleFunc(mockoidc.DiscoveryEndpoint, m.Discovery)
	if control {
		mux.HandleFunc("POST /control/next-user", p.nextUser)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	// (mockoidc's own Start would serve the same endpoints, but on a mux
	// of its own that nothing can be added to.)
	m.Server = &http.Server{Addr: ln.Addr().String(), Handler: p.serial(mux), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(p.served)
		_ = m.Server.Serve(ln)
	}()
	return p, nil
}

// Issuer is the provider's issuer URL.
func (p *Provider) Issuer() string { return p.m.Issuer() }

// Next queues the user the next authorization signs in as (without one,
// mockoidc's default user, jane.doe@example.com).
func (p *Provider) Next(u User) { p.m.QueueUser(&user{u: u, p: p}) }

// Close stops the provider and waits until it stopped.
func (p *Provider) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := p.m.Server.Shutdown(ctx)
	<-p.served
	return err
}

// serial runs one request at a time.
func (p *Provider) serial(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

// nextUser is POST /control/next-user: Next, from JSON.
func (p *Provider) nextUser(w http.ResponseWriter, r *http.Request) {
	var u User
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&u); err != nil || u.Subject == "" {
		http.Error(w, "a JSON user with a sub", http.StatusBadRequest)
		return
	}
	p.Next(u)
	w.WriteHeader(http.StatusNoContent)
}

// token is the token endpoint, whose ID token is altered when its user
// asked for it.
func (p *Provider) token(endpoint http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		p.tamper = false
		endpoint(rec, r)
		body := rec.Body.Bytes()
		if p.tamper {
			body = tampered(body)
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(body)
	}
}

// tampered is a token answer whose ID token says another subject under
// the original signature.
func tampered(answer []byte) []byte {
	var fields map[string]any
	if json.Unmarshal(answer, &fields) != nil {
		return answer
	}
	tok, _ := fields["id_token"].(string)
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return answer
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	var claims map[string]any
	if err != nil || json.Unmarshal(payload, &claims) != nil {
		return answer
	}
	claims["sub"] = "someone-else"
	payload, _ = json.Marshal(claims)
	parts[1] = base64.RawURLEncoding.EncodeToString(payload)
	fields["id_token"] = strings.Join(parts, ".")
	out, _ := json.Marshal(fields)
	return out
}

// user is a User as mockoidc asks for it.
type user struct {
	u User
	p *Provider
}

func (u *user) ID() string { return u.u.Subject }

func (u *user) Userinfo([]string) ([]byte, error) {
	return json.Marshal(map[string]any{"sub": u.u.Subject, "email": u.u.Email,
		"preferred_username": u.u.PreferredUsername})
}

// idClaims are the claims of an ID token: the registered ones and the
// nonce, then the person's (given whatever the scopes: tests ask for
// what they need).
type idClaims struct {
	*mockoidc.IDTokenClaims
	Email             string   `json:"email,omitempty"`
	EmailVerified     bool     `json:"email_verified"`
	PreferredUsername string   `json:"preferred_username,omitempty"`
	Groups            []string `json:"groups,omitempty"`
}

func (u *user) Claims(_ []string, base *mockoidc.IDTokenClaims) (jwt.Claims, error) {
	if base == nil || base.RegisteredClaims == nil {
		return nil, errors.New("no registered claims")
	}
	c := *base
	rc := *base.RegisteredClaims
	c.RegisteredClaims = &rc
	if u.u.Audience != "" {
		rc.Audience = jwt.ClaimStrings{u.u.Audience}
	}
	if u.u.Expired {
		rc.IssuedAt = jwt.NewNumericDate(time.Now().Add(-2 * time.Hour))
		rc.NotBefore = rc.IssuedAt
		rc.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Hour))
	}
	if u.u.Nonce != "" {
		c.Nonce = u.u.Nonce
	}
	// (Claims runs inside the token handler, under p.mu.)
	u.p.tamper = u.u.Tampered
	return &idClaims{IDTokenClaims: &c, Email: u.u.Email, EmailVerified: u.u.EmailVerified,
		PreferredUsername: u.u.PreferredUsername, Groups: u.u.Groups}, nil
}
