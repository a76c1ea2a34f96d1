package auth

import (
	"strings"
	"sync"
	"time"
)

// LimiterConfig slows down password guessing. Every attempt is charged to
// its user name and its client address before its password is checked, as
// a failure until it proves otherwise, so attempts in flight count as much
// as attempts that already failed. The Free+1st failure in a row of a name
// (the 3×Free+1st of an address) locks it for Base, each further one for
// twice as long up to Max; while locked an attempt is refused unchecked and
// not charged. A success clears the name and gives the address its charge
// back; Forget of quiet time clears a key. At most Entries keys are
// remembered. Hashing bounds the password checks (bcrypt) running at once
// over all names and addresses: an attempt beyond it is refused, never
// queued.
type LimiterConfig struct {
	Free    int           // failures allowed before locking (default 3)
	Base    time.Duration // first lock (default 1s)
	Max     time.Duration // longest lock (default 1m)
	Forget  time.Duration // quiet time after which a key is forgotten (default 15m)
	Entries int           // keys remembered at most (default 10000)
	Hashing int           // password checks at once, at most (default 4)
}

func (c LimiterConfig) withDefaults() LimiterConfig {
	if c.Free <= 0 {
		c.Free = 3
	}
	if c.Base <= 0 {
		c.Base = time.Second
	}
	if c.Max <= 0 {
		c.Max = time.Minute
	}
	if c.Forget <= 0 {
		c.Forget = 15 * time.Minute
	}
	if c.Entries <= 0 {
		c.Entries = 10000
	}
	if c.Hashing <= 0 {
		c.Hashing = 4
	}
	return c
}

// limiter is the sign-in brake. Safe for concurrent use: every method
// takes mu, and none blocks while holding it.
type limiter struct {
	cfg LimiterConfig
	mu  sync.Mutex
	m   map[string]*strikes
}

type strikes struct {
	fails int       // attempts charged: failed or still being checked
	until time.Time // locked before this
	last  time.Time // last charge
}

// charge is what one attempt did to one key, so that it can be given
// back: the record it charged (compared by identity: a record forgotten
// or evicted since is left alone) and the lock before and after.
type charge struct {
	key         string
	s           *strikes
	before, set time.Time
}

// ticket is an admitted attempt's charges.
type ticket struct{ charges []charge }

func newLimiter(cfg LimiterConfig) *limiter {
	return &limiter{cfg: cfg.withDefaults(), m: map[string]*strikes{}}
}

// admit charges one attempt to every key, or, when one of them is locked,
// charges nothing and says how long the longest lock lasts.
func (l *limiter) admit(keys []string, now time.Time) (*ticket, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var wait time.Duration
	for _, k := range keys {
		if s := l.m[k]; s != nil && now.Before(s.until) {
			wait = max(wait, s.until.Sub(now))
		}
	}
	if wait > 0 {
		return nil, wait
	}
	t := &ticket{charges: make([]charge, 0, len(keys))}
	for _, k := range keys {
		s := l.m[k]
		if s != nil && now.Sub(s.last) > l.cfg.Forget {
			s = nil
		}
		if s == nil {
			l.makeRoom(now)
			s = &strikes{}
			l.m[k] = s
		}
		c := charge{key: k, s: s, before: s.until}
		s.fails++
		s.last = now
		free := l.cfg.Free
		if strings.HasPrefix(k, "ip:") {
			free *= 3 // an office behind one address is several people
		}
		if over := s.fails - free; over > 0 {
			lock := l.cfg.Base << min(over-1, 20)
			s.until = now.Add(min(lock, l.cfg.Max))
		}
		c.set = s.until
		t.charges = append(t.charges, c)
	}
	return t, 0
}

// refund gives an attempt's charges back: it was not checked after all (no
// room to hash), or it succeeded. A lock the attempt set is lifted unless
// a later attempt has set another since.
func (l *limiter) refund(t *ticket) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range t.charges {
		l.giveBack(c)
	}
}

func (l *limiter) giveBack(c charge) {
	if l.m[c.key] != c.s {
		return // forgotten or evicted meanwhile: nothing left to give back
	}
	c.s.fails = max(0, c.s.fails-1)
	if c.s.until.Equal(c.set) {
		c.s.until = c.before
	}
}

// succeed ends an attempt with the right password: the name's record is
// cleared, the address gets its charge back. Only the name's: one good
// account must not reset the brake on guessing from the same address.
func (l *limiter) succeed(t *ticket) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range t.charges {
		if strings.HasPrefix(c.key, "user:") {
			delete(l.m, c.key)
			continue
		}
		l.giveBack(c)
	}
}

// makeRoom forgets quiet keys when the table is full, then, if still
// full, an arbitrary one (an attacker with many addresses can only make us
// forget, never grow).
func (l *limiter) makeRoom(now time.Time) {
	if len(l.m) < l.cfg.Entries {
		return
	}
	for k, s := range l.m {
		if now.Sub(s.last) > l.cfg.Forget && !now.Before(s.until) {
			delete(l.m, k)
		}
	}
	for k := range l.m {
		if len(l.m) < l.cfg.Entries {
			break
		}
		delete(l.m, k)
	}
}
