package auth_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// countingStore is the real store, counting the reads that check a
// session or token (SessionUntil, TokenUntil). With fail set they fail as
// an unreachable store would; afterRead, when set, runs after each real
// read, before its answer is returned.
type countingStore struct {
	store.Accounts
	reads     atomic.Int64
	fail      atomic.Bool
	afterRead func()
}

var errUnreachable = errors.New("the store is unreachable")

func (s *countingStore) SessionUntil(ctx context.Context, hash string, now time.Time) (chat.User, time.Time, error) {
	s.reads.Add(1)
	if s.fail.Load() {
		return chat.User{}, time.Time{}, errUnreachable
	}
	u, until, err := s.Accounts.SessionUntil(ctx, hash, now)
	if s.afterRead != nil {
		s.afterRead()
	}
	return u, until, err
}

func (s *countingStore) TokenUntil(ctx context.Context, id string, now time.Time) (chat.User, string, time.Time, error) {
	s.reads.Add(1)
	if s.fail.Load() {
		return chat.User{}, "", time.Time{}, errUnreachable
	}
	u, hash, until, err := s.Accounts.TokenUntil(ctx, id, now)
	if s.afterRead != nil {
		s.afterRead()
	}
	return u, hash, until, err
}

const cacheTime = time.Second

// cachedAuth is a password-mode authenticator on a counting store, with a
// cache of cacheTime and sessions of an hour.
func cachedAuth(t *testing.T, cfg auth.Config) (*auth.Authenticator, *clock, *countingStore) {
	t.Helper()
	cs := &countingStore{Accounts: openStore(t).Accounts()}
	cfg.Mode, cfg.Store, cfg.SessionTTL = auth.ModePassword, cs, time.Hour
	if cfg.CredentialCache == 0 {
		cfg.CredentialCache = cacheTime
	}
	a, clk := newAuth(t, cfg)
	return a, clk, cs
}

// sessionOf signs name in (creating the account) and returns its cookie
// and principal.
func sessionOf(t *testing.T, a *auth.Authenticator, st *countingStore, name string) (*http.Cookie, chat.Principal) {
	t.Helper()
	addUser(t, st.Accounts, name, "correct horse")
	c, err := signIn(t, a, name, "correct horse")
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.Authenticate(withCookie(c))
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

// tokenOf creates a token of name (an existing account) valid for ttl (0:
// until revoked) and returns its id and principal.
func tokenOf(t *testing.T, a *auth.Authenticator, st *countingStore, clk *clock, name string, ttl time.Duration) (string, chat.Principal) {
	t.Helper()
	tok, secret, err := auth.CreateToken(context.Background(), st.Accounts, name, "test", ttl, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/api/threads", nil)
	r.Header.Set("Authorization", "Bearer "+secret)
	p, err := a.Authenticate(r)
	if err != nil {
		t.Fatal(err)
	}
	return tok.TokenID, p
}

// TestRevalidateCachedReadsOncePerCacheTime: within the cache time a
// credential is read from the store once however often it is checked;
// Revalidate (the keep-alive) reads every time; a sign-out through the
// Authenticator is seen by the very next check; after the cache time the
// store is read again; an ended credential is never cached.
func TestRevalidateCachedReadsOncePerCacheTime(t *testing.T) {
	ctx := context.Background()
	a, clk, st := cachedAuth(t, auth.Config{})
	c, p := sessionOf(t, a, st, "alice")
	reads := func(want int64, what string) {
		t.Helper()
		if got := st.reads.Swap(0); got != want {
			t.Errorf("%s: %d store reads, want %d", what, got, want)
		}
	}
	reads(1, "sign-in's Authenticate") // never cached: each request reads
	for range 3 {
		if err := a.RevalidateCached(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	reads(1, "three checks within the cache time")
	clk.Add(cacheTime - time.Millisecond)
	if err := a.RevalidateCached(ctx, p); err != nil {
		t.Fatal(err)
	}
	reads(0, "a check just before the cache time ends")
	clk.Add(time.Millisecond)
	if err := a.RevalidateCached(ctx, p); err != nil {
		t.Fatal(err)
	}
	reads(1, "a check at the end of the cache time")
	for range 2 {
		if err := a.Revalidate(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	reads(2, "two keep-alive re-checks")
	if err := a.RevalidateCached(ctx, p); err != nil {
		t.Fatal(err)
	}
	reads(0, "a check after a keep-alive re-check")
	if _, err := a.Authenticate(withCookie(c)); err != nil {
		t.Fatal(err)
	}
	reads(1, "a request's Authenticate with the session cached")

	// Signed out through this process: the next check reads and refuses,
	// and so does every one after it (nothing negative is cached).
	if err := a.SignOut(httptest.NewRecorder(), withCookie(c)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := a.RevalidateCached(ctx, p); code(err) != chat.CodeUnauthorized {
			t.Fatalf("check %d after sign-out within the cache time: %v, want unauthorized", i+1, err)
		}
	}
	reads(2, "two checks after the sign-out")
	if n := auth.CachedCredentials(a); n != 0 {
		t.Errorf("%d credentials cached after the only one ended", n)
	}
}

// TestRevalidateCachedSeesOtherWritersAfterTheCacheTime: a token revoked
// in the store behind the Authenticator's back (the account commands,
// another instance) is still believed for at most the cache time after
// its last read — by RevalidateCached only: Revalidate sees it at once,
// and after the cache time RevalidateCached does too.
func TestRevalidateCachedSeesOtherWritersAfterTheCacheTime(t *testing.T) {
	ctx := context.Background()
	a, clk, st := cachedAuth(t, auth.Config{})
	addUser(t, st.Accounts, "alice", "correct horse")
	for _, keepAlive := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep-alive=%v", keepAlive), func(t *testing.T) {
			id, p := tokenOf(t, a, st, clk, "alice", 0)
			if err := a.RevalidateCached(ctx, p); err != nil {
				t.Fatal(err)
			}
			if err := st.Accounts.RevokeToken(ctx, id); err != nil {
				t.Fatal(err)
			}
			st.reads.Store(0)
			if err := a.RevalidateCached(ctx, p); err != nil {
				t.Fatalf("a check within the cache time: %v, want the cached answer", err)
			}
			if n := st.reads.Load(); n != 0 {
				t.Fatalf("a check within the cache time read the store %d times", n)
			}
			if keepAlive {
				if err := a.Revalidate(ctx, p); code(err) != chat.CodeUnauthorized {
					t.Fatalf("keep-alive re-check of a revoked token: %v, want unauthorized", err)
				}
			} else {
				clk.Add(cacheTime)
			}
			if err := a.RevalidateCached(ctx, p); code(err) != chat.CodeUnauthorized {
				t.Fatalf("a check after the revocation was read: %v, want unauthorized", err)
			}
		})
	}
}

// TestRevalidateCachedNeverOutlivesTheCredential: a session or token that
// expires within the cache time is refused from its expiry on, though it
// was cached a moment before.
func TestRevalidateCachedNeverOutlivesTheCredential(t *testing.T) {
	ctx := context.Background()
	a, clk, st := cachedAuth(t, auth.Config{})
	_, session := sessionOf(t, a, st, "alice")
	_, token := tokenOf(t, a, st, clk, "alice", time.Hour)
	clk.Add(time.Hour - cacheTime/2) // both end in half the cache time
	for name, p := range map[string]chat.Principal{"session": session, "token": token} {
		if err := a.RevalidateCached(ctx, p); err != nil {
			t.Fatalf("%s before its expiry: %v", name, err)
		}
	}
	st.reads.Store(0)
	clk.Add(cacheTime/2 - time.Millisecond)
	for name, p := range map[string]chat.Principal{"session": session, "token": token} {
		if err := a.RevalidateCached(ctx, p); err != nil {
			t.Fatalf("%s a millisecond before its expiry: %v", name, err)
		}
	}
	if n := st.reads.Load(); n != 0 {
		t.Fatalf("checks before the expiry read the store %d times, want 0 (cached)", n)
	}
	clk.Add(time.Millisecond)
	for name, p := range map[string]chat.Principal{"session": session, "token": token} {
		if err := a.RevalidateCached(ctx, p); code(err) != chat.CodeUnauthorized {
			t.Errorf("%s at its expiry, checked half a cache time before: %v, want unauthorized", name, err)
		}
	}
}

// TestRevalidateCachedDoesNotCacheErrors: a store that cannot be read
// answers its error (not unauthorized: the connection stays) and nothing
// is cached, so the next check reads again; a keep-alive that fails drops
// what was cached.
func TestRevalidateCachedDoesNotCacheErrors(t *testing.T) {
	ctx := context.Background()
	a, _, st := cachedAuth(t, auth.Config{})
	_, p := sessionOf(t, a, st, "alice")
	st.fail.Store(true)
	st.reads.Store(0)
	for range 2 {
		if err := a.RevalidateCached(ctx, p); !errors.Is(err, errUnreachable) {
			t.Fatalf("check with the store unreachable: %v, want its error", err)
		}
	}
	if n := st.reads.Load(); n != 2 {
		t.Fatalf("two checks with the store unreachable read it %d times, want 2", n)
	}
	st.fail.Store(false)
	if err := a.RevalidateCached(ctx, p); err != nil {
		t.Fatal(err)
	}
	st.fail.Store(true)
	if err := a.Revalidate(ctx, p); !errors.Is(err, errUnreachable) {
		t.Fatalf("keep-alive with the store unreachable: %v, want its error", err)
	}
	st.reads.Store(0)
	if err := a.RevalidateCached(ctx, p); !errors.Is(err, errUnreachable) {
		t.Fatalf("check after a failed keep-alive: %v, want the store's error (nothing cached)", err)
	}
	if n := st.reads.Load(); n != 1 {
		t.Fatalf("the check after a failed keep-alive read the store %d times, want 1", n)
	}
}

// TestRevalidateCachedSignOutDuringACheck: a check that read the store
// just before a sign-out wrote its end answers as it read (the two were
// concurrent), but does not cache it: the check after the sign-out reads
// again and refuses.
func TestRevalidateCachedSignOutDuringACheck(t *testing.T) {
	ctx := context.Background()
	a, _, st := cachedAuth(t, auth.Config{})
	c, p := sessionOf(t, a, st, "alice")
	read, signedOut := make(chan struct{}), make(chan struct{})
	st.afterRead = func() {
		close(read)
		<-signedOut
	}
	checked := make(chan error)
	go func() { checked <- a.RevalidateCached(ctx, p) }()
	<-read
	st.afterRead = nil // the checking goroutine called it already
	if err := a.SignOut(httptest.NewRecorder(), withCookie(c)); err != nil {
		t.Fatal(err)
	}
	close(signedOut)
	if err := <-checked; err != nil {
		t.Fatalf("the check that read before the sign-out: %v", err)
	}
	if err := a.RevalidateCached(ctx, p); code(err) != chat.CodeUnauthorized {
		t.Fatalf("the check after the sign-out: %v, want unauthorized (its concurrent check must not have cached)", err)
	}
}

// TestRevalidateCachedIsBounded: with room for two credentials, a third
// evicts the one checked longest ago; expired entries make room first.
func TestRevalidateCachedIsBounded(t *testing.T) {
	ctx := context.Background()
	a, clk, st := cachedAuth(t, auth.Config{CredentialCacheEntries: 2})
	addUser(t, st.Accounts, "alice", "correct horse")
	var ps []chat.Principal
	for range 3 {
		_, p := tokenOf(t, a, st, clk, "alice", 0)
		ps = append(ps, p)
	}
	check := func(p chat.Principal, wantReads int64, what string) {
		t.Helper()
		st.reads.Store(0)
		if err := a.RevalidateCached(ctx, p); err != nil {
			t.Fatal(err)
		}
		if n := st.reads.Load(); n != wantReads {
			t.Errorf("%s: %d store reads, want %d", what, n, wantReads)
		}
		if n := auth.CachedCredentials(a); n > 2 {
			t.Errorf("%s: %d credentials cached, at most 2", what, n)
		}
	}
	check(ps[0], 1, "first")
	clk.Add(time.Millisecond)
	check(ps[1], 1, "second")
	clk.Add(time.Millisecond)
	check(ps[2], 1, "third, evicting the first")
	check(ps[1], 0, "second again")
	check(ps[2], 0, "third again")
	check(ps[0], 1, "first again, evicting the second")
	check(ps[1], 1, "second again, evicting the third")
	clk.Add(cacheTime)
	check(ps[2], 1, "third after the cache time")
	if n := auth.CachedCredentials(a); n != 1 {
		t.Errorf("after the cache time %d credentials cached, want 1 (the expired ones dropped)", n)
	}
}

// TestRevalidateCachedOff: CredentialCache 0 (the zero value) reads the
// store at every check, as before the cache.
func TestRevalidateCachedOff(t *testing.T) {
	ctx := context.Background()
	st := &countingStore{Accounts: openStore(t).Accounts()}
	a, _ := newAuth(t, auth.Config{Mode: auth.ModePassword, Store: st})
	_, p := sessionOf(t, a, st, "alice")
	st.reads.Store(0)
	for range 3 {
		if err := a.RevalidateCached(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if n := st.reads.Load(); n != 3 {
		t.Errorf("three checks without a cache read the store %d times, want 3", n)
	}
}

// TestRevalidateCachedConcurrent: checks, keep-alives, expiries and
// sign-outs from many goroutines (run with -race); a signed-out session is
// refused by every check that starts after its sign-out returned.
func TestRevalidateCachedConcurrent(t *testing.T) {
	ctx := context.Background()
	a, clk, st := cachedAuth(t, auth.Config{CredentialCacheEntries: 4})
	type user struct {
		c *http.Cookie
		p chat.Principal
	}
	var users []user
	for i := range 8 {
		c, p := sessionOf(t, a, st, fmt.Sprintf("user%d", i))
		users = append(users, user{c, p})
	}
	var wg sync.WaitGroup
	for i, u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				if err := a.RevalidateCached(ctx, u.p); err != nil {
					t.Errorf("user%d check %d: %v", i, j, err)
					return
				}
				if j%10 == 0 {
					if err := a.Revalidate(ctx, u.p); err != nil {
						t.Errorf("user%d keep-alive %d: %v", i, j, err)
						return
					}
					clk.Add(cacheTime / 4)
				}
			}
			if i%2 == 0 {
				if err := a.SignOut(httptest.NewRecorder(), withCookie(u.c)); err != nil {
					t.Error(err)
					return
				}
				if err := a.RevalidateCached(ctx, u.p); code(err) != chat.CodeUnauthorized {
					t.Errorf("user%d after sign-out: %v", i, err)
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkRevalidate: the check before a WebSocket command, answered from
// the cache, against reading the store (SQLite in a file) every time.
func BenchmarkRevalidate(b *testing.B) {
	ctx := context.Background()
	for _, bc := range []struct {
		name  string
		cache time.Duration
	}{{"cached", auth.DefaultCredentialCache}, {"uncached", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			st, err := store.Open(ctx, b.TempDir()+"/bench.db", store.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			a, err := auth.New(auth.Config{Mode: auth.ModePassword, Store: st.Accounts(), BcryptCost: 4, CredentialCache: bc.cache})
			if err != nil {
				b.Fatal(err)
			}
			hash, _ := auth.HashPassword("correct horse", 4)
			if _, err := st.Accounts().CreateUser(ctx, "alice", hash); err != nil {
				b.Fatal(err)
			}
			w := httptest.NewRecorder()
			if _, err := a.SignIn(w, httptest.NewRequest("POST", "/login", nil), "alice", "correct horse"); err != nil {
				b.Fatal(err)
			}
			p, err := a.Authenticate(withCookie(w.Result().Cookies()[0]))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := a.RevalidateCached(ctx, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
