package auth

import (
	"strings"
	"sync"
	"time"
)

// LimiterConfig slows down password guessing without letting a stranger
// keep an account's owner out (OWASP ASVS 2.2.1). Every attempt is
// charged before its password is checked, as a failure until it proves
// otherwise, so attempts in flight count as much as attempts that already
// failed. It is charged to:
//
//   - its client for that account: the device, when the browser shows a
//     device cookie the account issued (see devices.go), else the client
//     address. The Free+1st failure in a row of a pair locks it for Base,
//     each further one for twice as long up to Max. A stranger's failures
//     lock the stranger, not the owner on another device or address.
//   - its client address over all names, unless the client is a known
//     device: the 3×Free+1st failure locks it the same way. This stops one
//     address trying many names.
//   - the account over all the clients it does not know (neither a device
//     of its own nor an address it signed in from before): AccountFree
//     attempts, then one per AccountEvery. This slows guessing from
//     rotating addresses to at most AccountFree + 1 h/AccountEvery an
//     hour; it never locks (the next attempt is at most AccountEvery
//     away), and a known client is not charged to it.
//
// While one of its keys refuses, an attempt is answered unchecked and
// charged nothing. A success clears its pair, gives the address and the
// account their charges back (one good account does not reset its
// address's brake, nor one success the account's slowdown) and makes the
// address known to the account for KnownFor. Forget of quiet time clears a
// pair or an address. Each of the three tables (pairs and addresses,
// accounts, known addresses) holds at most Entries keys. Hashing bounds the
// password checks (bcrypt) running at once over all names and addresses:
// an attempt beyond it is refused, never queued.
type LimiterConfig struct {
	Free         int           // failures of a pair allowed before locking (default 3)
	Base         time.Duration // first lock (default 1s)
	Max          time.Duration // longest lock (default 1m)
	AccountFree  int           // attempts from clients an account does not know before slowing (default 10)
	AccountEvery time.Duration // then one such attempt per this (default 1m)
	KnownFor     time.Duration // an address stays known this long after its last success (default 30 days)
	Forget       time.Duration // quiet time after which a pair or address is forgotten (default 15m)
	Entries      int           // keys remembered at most, per table (default 10000)
	Hashing      int           // password checks at once, at most (default 4)
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
	if c.AccountFree <= 0 {
		c.AccountFree = 10
	}
	if c.AccountEvery <= 0 {
		c.AccountEvery = time.Minute
	}
	if c.KnownFor <= 0 {
		c.KnownFor = 30 * 24 * time.Hour
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
// takes mu, and none blocks while holding it. It lives in memory: a
// restart forgets every lock, slowdown and known address (devices are
// known by their cookie, which survives).
type limiter struct {
	cfg LimiterConfig
	mu  sync.Mutex
	// m holds the strikes of pairs ("pair:<account>|ip:<addr>" or
	// "pair:<account>|dev:<id>") and addresses ("ip:<addr>").
	m map[string]*strikes
	// accounts holds the slowdown of each account's unknown clients.
	accounts map[string]*slowdown
	// known holds "<account>|<addr>" → the last success from there.
	known map[string]time.Time
}

type strikes struct {
	fails int       // attempts charged: failed or still being checked
	until time.Time // locked before this
	last  time.Time // last charge
}

// slowdown is an account's budget for clients it does not know, as a
// generic cell rate: full is when the budget would be whole again; each
// attempt moves it on by AccountEvery, and one that would move it past
// now + AccountFree×AccountEvery waits.
type slowdown struct{ full time.Time }

// signInAttempt is who makes an attempt, as the brake sees it.
type signInAttempt struct {
	account string // the normalized name; "" when the name is none
	addr    string // the client address
	device  string // the id of a device proof the account issued; "" when none
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
type ticket struct {
	charges []charge
	account string    // the account whose slowdown was charged, if any
	slow    *slowdown // that slowdown (compared by identity)
	known   string    // the known-address key a success sets ("" none)
}

// The reasons admit refuses an attempt.
const (
	refusedLocked = "locked" // its pair or address is locked
	refusedSlowed = "slowed" // the account's unknown clients wait
)

func newLimiter(cfg LimiterConfig) *limiter {
	return &limiter{cfg: cfg.withDefaults(), m: map[string]*strikes{}, accounts: map[string]*slowdown{},
		known: map[string]time.Time{}}
}

// admit charges an attempt to each of its keys, or, when one of them
// refuses, charges nothing and says why (refusedLocked or refusedSlowed)
// and how long to wait.
func (l *limiter) admit(at signInAttempt, now time.Time) (*ticket, time.Duration, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var keys []string
	t := &ticket{}
	if at.account != "" {
		client := "ip:" + at.addr
		if at.device != "" {
			client = "dev:" + at.device
		}
		keys = append(keys, "pair:"+at.account+"|"+client)
		t.known = at.account + "|" + at.addr
	}
	if at.device == "" {
		keys = append(keys, "ip:"+at.addr)
	}
	slowed := at.account != "" && at.device == "" && !l.isKnown(t.known, now)

	var wait time.Duration
	for _, k := range keys {
		if s := l.m[k]; s != nil && now.Before(s.until) {
			wait = max(wait, s.until.Sub(now))
		}
	}
	if wait > 0 {
		return nil, wait, refusedLocked
	}
	if slowed {
		if w := l.slowWait(at.account, now); w > 0 {
			return nil, w, refusedSlowed
		}
	}
	t.charges = make([]charge, 0, len(keys))
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
	if slowed {
		s := l.accounts[at.account]
		if s == nil {
			l.makeRoomForAccount(now)
			s = &slowdown{}
			l.accounts[at.account] = s
		}
		s.full = later(s.full, now).Add(l.cfg.AccountEvery)
		t.account, t.slow = at.account, s
	}
	return t, 0, ""
}

// slowWait is how long an attempt from a client the account does not know
// must wait: 0 while the account's budget has room.
func (l *limiter) slowWait(account string, now time.Time) time.Duration {
	s := l.accounts[account]
	if s == nil {
		return 0
	}
	next := later(s.full, now).Add(l.cfg.AccountEvery)
	return max(0, next.Sub(now)-time.Duration(l.cfg.AccountFree)*l.cfg.AccountEvery)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (l *limiter) isKnown(key string, now time.Time) bool {
	at, ok := l.known[key]
	return ok && now.Sub(at) < l.cfg.KnownFor
}

// refund gives an attempt's charges back: it was not checked after all (no
// room to hash, or the store failed). A lock the attempt set is lifted
// unless a later attempt has set another since.
func (l *limiter) refund(t *ticket) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range t.charges {
		l.giveBack(c)
	}
	l.giveBackSlow(t)
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

func (l *limiter) giveBackSlow(t *ticket) {
	if t.slow != nil && l.accounts[t.account] == t.slow {
		t.slow.full = t.slow.full.Add(-l.cfg.AccountEvery)
	}
}

// succeed ends an attempt with the right password: its pair is cleared,
// the address and the account get their charges back, and the address is
// known to the account from now on. Only the pair is cleared: one good
// account must not reset the brake on guessing from the same address, nor
// the owner's success the slowdown of a stranger guessing elsewhere.
func (l *limiter) succeed(t *ticket, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range t.charges {
		if strings.HasPrefix(c.key, "pair:") {
			delete(l.m, c.key)
			continue
		}
		l.giveBack(c)
	}
	l.giveBackSlow(t)
	if t.known != "" {
		if _, ok := l.known[t.known]; !ok {
			l.makeRoomForKnown(now)
		}
		l.known[t.known] = now
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

// makeRoomForAccount forgets the accounts whose budget is whole again when
// the table is full, then, if still full, the one nearest to whole: a
// flood of names makes us forget the slowdowns that matter least first.
func (l *limiter) makeRoomForAccount(now time.Time) {
	if len(l.accounts) < l.cfg.Entries {
		return
	}
	for k, s := range l.accounts {
		if !s.full.After(now) {
			delete(l.accounts, k)
		}
	}
	for len(l.accounts) >= l.cfg.Entries {
		var least string
		var at time.Time
		for k, s := range l.accounts {
			if least == "" || s.full.Before(at) {
				least, at = k, s.full
			}
		}
		delete(l.accounts, least)
	}
}

// makeRoomForKnown forgets expired known addresses when the table is full,
// then, if still full, the one whose last success is oldest.
func (l *limiter) makeRoomForKnown(now time.Time) {
	if len(l.known) < l.cfg.Entries {
		return
	}
	for k, at := range l.known {
		if now.Sub(at) >= l.cfg.KnownFor {
			delete(l.known, k)
		}
	}
	for len(l.known) >= l.cfg.Entries {
		var oldest string
		var at time.Time
		for k, t := range l.known {
			if oldest == "" || t.Before(at) {
				oldest, at = k, t
			}
		}
		delete(l.known, oldest)
	}
}
