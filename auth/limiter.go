package auth

import (
	"strings"
	"sync"
	"time"
)

// LimiterConfig slows down password guessing. After Free failures for a
// user name (3×Free for a client address) every further failure locks it
// for Base, doubling each time up to Max; a success or Forget of quiet time
// clears it. Entries are bounded: at most Entries keys are remembered.
type LimiterConfig struct {
	Free    int           // failures allowed before locking (default 3)
	Base    time.Duration // first lock (default 1s)
	Max     time.Duration // longest lock (default 1m)
	Forget  time.Duration // quiet time after which a key is forgotten (default 15m)
	Entries int           // keys remembered at most (default 10000)
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
	return c
}

// limiter is the sign-in brake. Safe for concurrent use.
type limiter struct {
	cfg LimiterConfig
	mu  sync.Mutex
	m   map[string]*strikes
}

type strikes struct {
	fails int
	until time.Time // locked before this
	last  time.Time // last failure
}

func newLimiter(cfg LimiterConfig) *limiter {
	return &limiter{cfg: cfg.withDefaults(), m: map[string]*strikes{}}
}

// wait is how long the longest-locked of keys stays locked (0: go ahead).
func (l *limiter) wait(keys []string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var w time.Duration
	for _, k := range keys {
		if s := l.m[k]; s != nil && now.Before(s.until) {
			w = max(w, s.until.Sub(now))
		}
	}
	return w
}

func (l *limiter) fail(keys []string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
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
	}
}

func (l *limiter) succeed(keys []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		delete(l.m, k)
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
