package gateway

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// Per-user limits.
//
// Every WebSocket connection has its own limits (WSConfig.CommandRate,
// MaxSubscriptions); the limits here are per user, shared by all of one
// user's connections, event streams and HTTP requests, so that opening more
// tabs or connections does not multiply what one account may do:
//
//   - commands: one token bucket (UserCommandRate, UserCommandBurst) per
//     user, charged by every WebSocket frame except run.cancel, by every
//     state-changing HTTP request (POST /api/...) except the cancel, and by
//     the page forms that change something (ChargeCommand);
//   - cancels: a separate bucket (CancelRate, CancelBurst) charged only by
//     run.cancel and POST /api/runs/{id}/cancel (see WSConfig for why);
//   - connections: open WebSocket connections plus event streams
//     (MaxConnsPerUser), counted while they are open;
//   - subscriptions: threads watched, summed over the user's WebSocket
//     connections (MaxSubscriptionsPerUser).
//
// Over any of them the answer is rate_limited (429); the bucket ones say in
// retry_after_seconds (over HTTP also in Retry-After) when a token is due.

// userLimits holds the per-user state of those limits. Safe for concurrent
// use. It is owned by the Server; its one lock, mu, is a leaf: nothing is
// called with it held, and it may be taken while holding a wsConn.mu (never
// the other way round).
//
// The table holds a user only while the user has something to remember: an
// open connection or stream, a watched thread, or a bucket that is not full.
// A user whose buckets are full and who holds nothing is the same as a user
// without an entry, so forgetting one loses nothing. Entries are forgotten
// when the user's last connection ends (if its buckets are full by then) and
// by sweeps, which forget every idle user; a sweep runs when an insert finds
// the table at twice its size after the previous sweep (at least minSweep),
// and on any call sweepEvery after the previous one. The table therefore
// never holds more than max(minSweep, twice the users that were not idle at
// the last sweep) entries: users holding a connection, stream or watched
// thread, or active within a bucket's refill time (UserCommandBurst /
// UserCommandRate, 2 s by default; CancelBurst / CancelRate, 3.2 s).
type userLimits struct {
	cfg WSConfig // read-only after newUserLimits

	mu        sync.Mutex            // guards the fields below
	users     map[string]*userState // by user id
	sweepAt   int                   // sweep when an insert finds this many entries
	lastSweep time.Time
}

// userState is one user's share; guarded by userLimits.mu.
type userState struct {
	commands tokenBucket // every command but the cancel
	cancels  tokenBucket // run.cancel and POST /api/runs/{id}/cancel only
	conns    int         // open WebSocket connections and event streams
	subs     int         // threads watched, over all its WebSocket connections
}

const (
	// minSweep is the table size below which no insert sweeps.
	minSweep = 64
	// sweepEvery bounds how long idle entries may linger while the table
	// does not grow.
	sweepEvery = time.Minute
)

func newUserLimits(cfg WSConfig) *userLimits {
	return &userLimits{cfg: cfg, users: map[string]*userState{}, sweepAt: minSweep, lastSweep: cfg.Now()}
}

// entryLocked returns the user's entry, creating it (with full buckets)
// when there is none; it sweeps when due.
func (l *userLimits) entryLocked(user string, now time.Time) *userState {
	l.sweepIfDueLocked(now)
	if st := l.users[user]; st != nil {
		return st
	}
	if len(l.users) >= l.sweepAt {
		l.sweepLocked(now)
	}
	st := &userState{
		commands: newTokenBucket(l.cfg.UserCommandRate, l.cfg.UserCommandBurst, now),
		cancels:  newTokenBucket(l.cfg.CancelRate, l.cfg.CancelBurst, now),
	}
	l.users[user] = st
	return st
}

func (st *userState) idle(now time.Time) bool {
	return st.conns == 0 && st.subs == 0 && st.commands.full(now) && st.cancels.full(now)
}

func (l *userLimits) sweepIfDueLocked(now time.Time) {
	if now.Sub(l.lastSweep) >= sweepEvery {
		l.sweepLocked(now)
	}
}

// sweepLocked forgets every idle user.
func (l *userLimits) sweepLocked(now time.Time) {
	for user, st := range l.users {
		if st.idle(now) {
			delete(l.users, user)
		}
	}
	l.lastSweep = now
	l.sweepAt = max(minSweep, 2*len(l.users))
}

// forgetIfIdleLocked drops the user's entry when it holds nothing.
func (l *userLimits) forgetIfIdleLocked(user string, st *userState, now time.Time) {
	if st.idle(now) {
		delete(l.users, user)
	}
}

// take charges one command to the user: a cancel to the cancel reserve,
// anything else to the command bucket. Over the bucket it returns
// rate_limited with retry_after_seconds.
func (l *userLimits) take(user string, cancel bool) error {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.entryLocked(user, now)
	if cancel {
		if st.cancels.allow(now) {
			return nil
		}
		secs := retrySeconds(st.cancels.retryAfter())
		return chat.Errorf(chat.CodeRateLimited, "too many cancel requests from your account (bursts of %d, then %s per second, over all your tabs and programs): wait %d s and retry this cancel",
			l.cfg.CancelBurst, formatRate(l.cfg.CancelRate), secs).With("retry_after_seconds", secs)
	}
	if st.commands.allow(now) {
		return nil
	}
	secs := retrySeconds(st.commands.retryAfter())
	return chat.Errorf(chat.CodeRateLimited, "too many commands from your account (bursts of %d, then %s per second, over all your tabs and programs together): wait %d s and retry this one",
		l.cfg.UserCommandBurst, formatRate(l.cfg.UserCommandRate), secs).With("retry_after_seconds", secs)
}

// join counts one more open connection or event stream for the user, or
// refuses it past MaxConnsPerUser. Every successful join is paired with
// one leave.
func (l *userLimits) join(user string) error {
	return l.count(user, func(st *userState) *int { return &st.conns }, l.cfg.MaxConnsPerUser,
		"your account already has %d open connections (WebSocket connections and event streams together, the most allowed): close a tab or stream you no longer need, then reconnect")
}

// count counts one more of what of points at in the user's entry, or
// refuses with rate_limited (refusal, given the count) when most are
// counted already.
func (l *userLimits) count(user string, of func(*userState) *int, most int, refusal string) error {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := of(l.entryLocked(user, now))
	if *n >= most {
		return chat.Errorf(chat.CodeRateLimited, refusal, *n)
	}
	*n++
	return nil
}

// leave ends what join counted.
func (l *userLimits) leave(user string) {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweepIfDueLocked(now)
	st := l.users[user]
	if st == nil {
		return
	}
	st.conns = max(0, st.conns-1)
	l.forgetIfIdleLocked(user, st, now)
}

// watch counts one more watched thread for the user, or refuses it past
// MaxSubscriptionsPerUser. Every successful watch is paired with one
// unwatch (counted in n).
func (l *userLimits) watch(user string) error {
	return l.count(user, func(st *userState) *int { return &st.subs }, l.cfg.MaxSubscriptionsPerUser,
		"your account already watches %d threads over all its connections (the most allowed): unsubscribe from one first")
}

// unwatch ends n watches.
func (l *userLimits) unwatch(user string, n int) {
	if n <= 0 {
		return
	}
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.users[user]
	if st == nil {
		return
	}
	st.subs = max(0, st.subs-n)
	l.forgetIfIdleLocked(user, st, now)
}

// tracked is how many users have an entry.
func (l *userLimits) tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.users)
}

// TrackedUsers reports how many users the per-user limits hold state for:
// those with an open connection, event stream or watched thread, or whose
// command buckets have not refilled yet (idle users are forgotten, see
// userLimits). For monitoring and tests.
func (s *Server) TrackedUsers() int { return s.limits.tracked() }

// limited charges a state-changing HTTP request to its user's budget (the
// cancel reserve when cancel) before anything of the request is read; over
// it the answer is 429 rate_limited with Retry-After.
func (s *Server) limited(cancel bool, h http.HandlerFunc) http.HandlerFunc {
	return s.limitedAs(writeError, cancel, h)
}

// limitedAs is limited answering its refusal with write.
func (s *Server) limitedAs(write errorWriter, cancel bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := s.charge(userID(r), cancel); err != nil {
			write(w, s.log, err)
			return
		}
		h(w, r)
	}
}

// charge takes one command from user's budget (the cancel reserve when
// cancel), counting a refusal.
func (s *Server) charge(user string, cancel bool) error {
	if err := s.limits.take(user, cancel); err != nil {
		s.metrics.RateLimited(takeKind(cancel))
		return err
	}
	return nil
}

// ChargeCommand charges one command to the user's budget, the one every
// WebSocket command and state-changing API request draws from (not the
// cancel reserve): the page forms that change something (package web) are
// charged through it, so that a browser's form posts do not add to what
// one account may do. It returns nil, or rate_limited with
// retry_after_seconds. Safe for concurrent use.
func (s *Server) ChargeCommand(userID string) error { return s.charge(userID, false) }

// takeKind names the limit behind a refused take, for Metrics.RateLimited.
func takeKind(cancel bool) string {
	if cancel {
		return limitCancels
	}
	return limitUserCommands
}

// tokenBucket is a token bucket on an explicit clock. Not safe for
// concurrent use: the per-connection one is guarded by wsConn.mu, the
// per-user ones by userLimits.mu.
type tokenBucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func newTokenBucket(rate float64, burst int, now time.Time) tokenBucket {
	return tokenBucket{rate: rate, burst: float64(burst), tokens: float64(burst), last: now}
}

func (b *tokenBucket) refill(now time.Time) {
	if now.After(b.last) {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
		b.last = now
	}
}

// allow takes one token if there is one.
func (b *tokenBucket) allow(now time.Time) bool {
	b.refill(now)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// refund gives back a token taken by allow.
func (b *tokenBucket) refund() { b.tokens = min(b.burst, b.tokens+1) }

// retryAfter is how long until the next token, as of the last allow.
func (b *tokenBucket) retryAfter() time.Duration {
	if b.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
}

// full reports whether the bucket holds its whole burst at now.
func (b *tokenBucket) full(now time.Time) bool {
	b.refill(now)
	return b.tokens >= b.burst
}

// retrySeconds rounds a wait up to whole seconds, at least 1 (Retry-After
// has no finer unit).
func retrySeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

func formatRate(r float64) string { return strconv.FormatFloat(r, 'g', -1, 64) }
