package auth

import (
	"container/list"
	"sync"
	"time"
)

// The credential cache's defaults (Config.CredentialCache,
// Config.CredentialCacheEntries).
const (
	// DefaultCredentialCache is how long the server trusts a positive
	// answer of RevalidateCached: a credential ended by another process
	// (the account commands, another instance) is refused by a command at
	// most this long after it was last read.
	DefaultCredentialCache = time.Second
	// DefaultCredentialCacheEntries bounds the credentials remembered at
	// once; the oldest check is forgotten first.
	DefaultCredentialCacheEntries = 10_000
)

// credCache remembers credentials that were found to hold, each until
// min(checked + ttl, the credential's own expiry). It holds positive
// answers only: an ended credential or a failed read is never put in, and
// finding one removes what was there. It is bounded (limit entries, the
// oldest check evicted first), expires lazily (no goroutine) and is safe
// for concurrent use.
//
// A credential ended through this process is forgotten (forget) after its
// end is written. A check that read the store before that write could
// still be putting its (stale) positive answer in: gen, which every forget
// advances, lets put refuse any answer read before the latest forget.
type credCache struct {
	ttl   time.Duration // 0: the cache is off
	limit int

	mu      sync.Mutex
	gen     uint64 // advanced by every forget
	entries map[string]*list.Element
	order   list.List // of *credEntry, oldest check first
}

type credEntry struct {
	key   string
	until time.Time // trusted while now is before it
}

func newCredCache(ttl time.Duration, entries int) *credCache {
	if entries <= 0 {
		entries = DefaultCredentialCacheEntries
	}
	return &credCache{ttl: max(ttl, 0), limit: entries, entries: make(map[string]*list.Element)}
}

// holds reports whether key was found to hold less than ttl before now and
// has not expired since.
func (c *credCache) holds(key string, now time.Time) bool {
	if c.ttl == 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return false
	}
	if now.Before(e.Value.(*credEntry).until) {
		return true
	}
	c.removeLocked(e)
	return false
}

// generation is what a check reads before it asks the store; it hands it
// back to put.
func (c *credCache) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// put remembers that key held at checked (read from the store after
// generation returned gen) until min(checked+ttl, expires); a zero expires
// never expires. Nothing is remembered when a forget came in between.
func (c *credCache) put(key string, gen uint64, checked, expires time.Time) {
	if c.ttl == 0 {
		return
	}
	until := checked.Add(c.ttl)
	if !expires.IsZero() && expires.Before(until) {
		until = expires
	}
	if !checked.Before(until) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if e, ok := c.entries[key]; ok {
		e.Value.(*credEntry).until = until
		c.order.MoveToBack(e)
		return
	}
	// Make room: what expired at the front, then the oldest check.
	for f := c.order.Front(); f != nil &&
		(len(c.entries) >= c.limit || !checked.Before(f.Value.(*credEntry).until)); f = c.order.Front() {
		c.removeLocked(f)
	}
	c.entries[key] = c.order.PushBack(&credEntry{key: key, until: until})
}

// drop removes key (it was found not to hold, or could not be read).
func (c *credCache) drop(key string) {
	if c.ttl == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok {
		c.removeLocked(e)
	}
}

// forget removes key and refuses every answer read before now (see gen).
func (c *credCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	if e, ok := c.entries[key]; ok {
		c.removeLocked(e)
	}
}

func (c *credCache) removeLocked(e *list.Element) {
	delete(c.entries, e.Value.(*credEntry).key)
	c.order.Remove(e)
}

// len is how many credentials are remembered (tests).
func (c *credCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
