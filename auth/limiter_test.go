package auth

import (
	"fmt"
	"testing"
	"time"
)

// The brake's decisions, on the limiter itself with a clock the test
// moves: no bcrypt, no store, nothing that depends on how fast anything
// runs.

// brakeClock is a limiter and its time.
type brakeClock struct {
	t   *testing.T
	l   *limiter
	now time.Time
}

func newBrake(t *testing.T, cfg LimiterConfig) *brakeClock {
	return &brakeClock{t: t, l: newLimiter(cfg), now: time.Unix(1_800_000_000, 0)}
}

// fail is an attempt that is admitted and fails (its charges stay).
func (b *brakeClock) fail(at signInAttempt, why string) {
	b.t.Helper()
	if tk, wait, reason := b.l.admit(at, b.now); tk == nil {
		b.t.Fatalf("%s: refused (%s, wait %v), want admitted", why, reason, wait)
	}
}

// succeed is an attempt that is admitted and succeeds.
func (b *brakeClock) succeed(at signInAttempt, why string) {
	b.t.Helper()
	tk, wait, reason := b.l.admit(at, b.now)
	if tk == nil {
		b.t.Fatalf("%s: refused (%s, wait %v), want admitted", why, reason, wait)
	}
	b.l.succeed(tk, b.now)
}

// refused requires the attempt to be refused for reason, waiting want.
func (b *brakeClock) refused(at signInAttempt, reason string, want time.Duration, why string) {
	b.t.Helper()
	tk, wait, got := b.l.admit(at, b.now)
	if tk != nil || got != reason || wait != want {
		b.t.Fatalf("%s: admitted %v, %s, wait %v; want refused %s, wait %v", why, tk != nil, got, wait, reason, want)
	}
}

func stranger(i int) signInAttempt {
	return signInAttempt{account: "alice", addr: fmt.Sprintf("203.0.113.%d", i%250+1)}
}

// Failures from one address lock that address for that account only: the
// same account from another address, and another account from the same
// address (under the address's own allowance), are not locked.
func TestBrakeLocksThePairNotTheAccount(t *testing.T) {
	b := newBrake(t, LimiterConfig{Free: 3, Base: time.Second, Max: time.Minute})
	mallory := signInAttempt{account: "alice", addr: "203.0.113.9"}
	for i := range 4 {
		b.fail(mallory, fmt.Sprintf("failure %d from one address", i+1))
	}
	b.refused(mallory, refusedLocked, time.Second, "the 5th from that address")
	b.succeed(signInAttempt{account: "alice", addr: "198.51.100.1"}, "alice from her own address")
	b.fail(signInAttempt{account: "bob", addr: "203.0.113.9"}, "another name from the locked pair's address")
	b.now = b.now.Add(time.Second)
	b.fail(mallory, "the locked pair after its lock")
	b.refused(mallory, refusedLocked, 2*time.Second, "the next: the lock doubles")
}

// An account takes AccountFree attempts from clients it does not know,
// then one per AccountEvery: slowed, never locked for longer, however
// many addresses ask. A refused attempt is not charged, so asking more
// often does not push the next slot away. A success from an unknown
// client gives its own charge back and resets nothing.
func TestBrakeSlowsAnAccountsUnknownClients(t *testing.T) {
	b := newBrake(t, LimiterConfig{AccountFree: 10, AccountEvery: time.Minute})
	for i := range 10 {
		b.fail(stranger(i), fmt.Sprintf("unknown address %d", i+1))
	}
	b.refused(stranger(10), refusedSlowed, time.Minute, "the 11th unknown address")
	for s := 1; s < 60; s++ { // one a second from new addresses: refused, uncharged
		b.now = b.now.Add(time.Second)
		b.refused(stranger(10+s), refusedSlowed, time.Minute-time.Duration(s)*time.Second, "an unknown address asking every second")
	}
	b.now = b.now.Add(time.Second)
	b.fail(stranger(70), "the slot a minute later")
	b.refused(stranger(71), refusedSlowed, time.Minute, "right after it")
	b.now = b.now.Add(time.Minute)
	b.succeed(stranger(72), "the owner from a new address, taking the next slot")
	b.fail(stranger(73), "the slot the success gave back")
	b.refused(stranger(74), refusedSlowed, time.Minute, "then: the success reset nothing")
	if got := b.l.slowWait("bob", b.now); got != 0 {
		t.Fatalf("bob waits %v because of alice's slowdown", got)
	}
}

// A client the account knows passes its slowdown: an address it signed
// in from before, or a device it issued a proof to. A known address is
// still charged to its pair and its address; a known device only to its
// pair, so a locked address (someone else behind the same NAT trying many
// names) does not keep it out either.
func TestBrakeKnownClientsPassTheSlowdown(t *testing.T) {
	b := newBrake(t, LimiterConfig{Free: 3, AccountFree: 10, AccountEvery: time.Minute})
	home := signInAttempt{account: "alice", addr: "198.51.100.1"}
	b.succeed(home, "alice at home, once")
	for i := range 10 {
		b.fail(stranger(i), fmt.Sprintf("unknown address %d", i+1))
	}
	b.refused(stranger(10), refusedSlowed, time.Minute, "an unknown address")
	b.succeed(home, "alice from her known address")
	phone := signInAttempt{account: "alice", addr: "192.0.2.200", device: "DEVICE1"}
	b.succeed(phone, "alice from a known device at an unknown address")

	// The NAT: mallory behind alice's home address tries many names.
	for i := range 9 {
		b.fail(signInAttempt{account: fmt.Sprintf("n%d", i), addr: home.addr}, "a name from alice's address")
	}
	b.fail(signInAttempt{account: "n9", addr: home.addr}, "the 10th from that address: locks it")
	b.refused(home, refusedLocked, time.Second, "alice at home without her device")
	b.succeed(signInAttempt{account: "alice", addr: home.addr, device: "DEVICE1"}, "alice at home with her device")

	// A known device still has a brake of its own (a stolen cookie is
	// not a password).
	stolen := signInAttempt{account: "alice", addr: "203.0.113.77", device: "DEVICE1"}
	for i := range 4 {
		b.fail(stolen, fmt.Sprintf("wrong password %d with alice's device cookie", i+1))
	}
	b.refused(stolen, refusedLocked, time.Second, "the 5th with the device cookie")
	// Known addresses are forgotten after KnownFor.
	b.now = b.now.Add(b.l.cfg.KnownFor)
	for i := range 10 {
		b.fail(stranger(i), fmt.Sprintf("unknown address %d, a month later", i+1))
	}
	b.refused(signInAttempt{account: "alice", addr: "198.51.100.1"}, refusedSlowed, time.Minute,
		"alice's address 30 days after her last success there")
}

// In flight is charged: a burst of AccountFree+n attempts at once from
// unknown addresses is admitted AccountFree times; the ones not checked
// after all (no room to hash) give their slot back.
func TestBrakeSlowdownCountsAttemptsInFlight(t *testing.T) {
	b := newBrake(t, LimiterConfig{AccountFree: 10, AccountEvery: time.Minute})
	var admitted []*ticket
	for i := range 30 {
		if tk, _, _ := b.l.admit(stranger(i), b.now); tk != nil {
			admitted = append(admitted, tk)
		}
	}
	if len(admitted) != 10 {
		t.Fatalf("%d of 30 attempts at once admitted, want 10", len(admitted))
	}
	b.l.refund(admitted[0])
	b.fail(stranger(40), "after one was refunded")
	b.refused(stranger(41), refusedSlowed, time.Minute, "then")
}

// Each table stays within Entries; a flood of names forgets first the
// slowdowns that have run out, then the least charged, so the account
// under attack keeps its slowdown.
func TestBrakeTablesAreBounded(t *testing.T) {
	b := newBrake(t, LimiterConfig{Entries: 50, AccountFree: 10, AccountEvery: time.Minute})
	for i := range 10 {
		b.fail(stranger(i), "alice from an unknown address")
	}
	for i := range 500 {
		at := signInAttempt{account: fmt.Sprintf("name%d", i), addr: fmt.Sprintf("2001:db8::%x", i)}
		if i%2 == 0 {
			b.fail(at, "a flood of names")
		} else {
			b.succeed(at, "a flood of names")
		}
	}
	if len(b.l.m) > 50 || len(b.l.accounts) > 50 || len(b.l.known) > 50 {
		t.Fatalf("tables of %d, %d and %d keys, want at most 50 each", len(b.l.m), len(b.l.accounts), len(b.l.known))
	}
	b.refused(stranger(99), refusedSlowed, time.Minute, "alice after the flood")
}
