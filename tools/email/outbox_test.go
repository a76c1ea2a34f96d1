package email

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/tools"
)

func openTestOutbox(t *testing.T, cfg OutboxConfig) *Outbox {
	t.Helper()
	o, err := openOutbox(t, testDSN(t, "provider db.sqlite"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

var testEmail = Email{To: "ann@example.com", Subject: "Hi", Body: "Hello"}

func attemptResults(t *testing.T, o *Outbox, key string) []string {
	t.Helper()
	as, err := o.Attempts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range as {
		if a.Key == key {
			out = append(out, a.Result)
		}
	}
	return out
}

func accepted(t *testing.T, o *Outbox) map[string]bool {
	t.Helper()
	m, err := o.Accepted(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestOutboxOneAcceptancePerKey(t *testing.T) {
	o := openTestOutbox(t, OutboxConfig{Latency: 5 * time.Millisecond})
	ctx := context.Background()
	const n = 20
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ids[i], errs[i] = o.Send(ctx, "k1", testEmail) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("send %d: %v", i, errs[i])
		}
		if ids[i] == "" || ids[i] != ids[0] {
			t.Fatalf("provider ids differ: %q vs %q", ids[i], ids[0])
		}
	}
	if got := accepted(t, o); len(got) != 1 || !got["k1"] {
		t.Fatalf("accepted = %v", got)
	}
	res := attemptResults(t, o, "k1")
	if len(res) != n {
		t.Fatalf("%d attempts, want %d", len(res), n)
	}
	acc := 0
	for _, r := range res {
		if r == AttemptAccepted {
			acc++
		} else if r != AttemptDuplicate {
			t.Errorf("attempt result %q", r)
		}
	}
	if acc != 1 {
		t.Fatalf("%d attempts accepted, want 1", acc)
	}
	id, found, err := o.Lookup(ctx, "k1")
	if err != nil || !found || id != ids[0] {
		t.Fatalf("Lookup = %q, %v, %v", id, found, err)
	}
	if _, found, _ := o.Lookup(ctx, "k2"); found {
		t.Fatal("unknown key found")
	}
}

func TestOutboxReject(t *testing.T) {
	o := openTestOutbox(t, OutboxConfig{Fault: FaultReject})
	ctx := context.Background()
	_, err := o.Send(ctx, "k1", testEmail)
	if !errors.Is(err, tools.ErrRejected) {
		t.Fatalf("err = %v, want ErrRejected", err)
	}
	if got := accepted(t, o); len(got) != 0 {
		t.Fatalf("accepted = %v", got)
	}
	if _, found, _ := o.Lookup(ctx, "k1"); found {
		t.Fatal("rejected key found")
	}
	if res := attemptResults(t, o, "k1"); len(res) != 1 || res[0] != AttemptRejected {
		t.Fatalf("attempts = %v", res)
	}
}

func TestOutboxAcceptThenTimeout(t *testing.T) {
	o := openTestOutbox(t, OutboxConfig{Fault: FaultAcceptThenTimeout})
	ctx := context.Background()
	id, err := o.Send(ctx, "k1", testEmail)
	if !errors.Is(err, context.DeadlineExceeded) || id != "" {
		t.Fatalf("Send = %q, %v; want a DeadlineExceeded error", id, err)
	}
	got, found, err := o.Lookup(ctx, "k1")
	if err != nil || !found || got == "" {
		t.Fatalf("Lookup = %q, %v, %v; want the key accepted", got, found, err)
	}
	if acc := accepted(t, o); !acc["k1"] {
		t.Fatalf("accepted = %v", acc)
	}
}

// Under record-late the provider takes the call and acts, but the answer
// is lost and the key is recorded only RecordDelay later: lookups find
// nothing until then (also from another process, which cannot take it
// again or get it refused), and the same key afterwards.
func TestOutboxRecordLate(t *testing.T) {
	const delay = 2 * time.Second
	dsn := testDSN(t, "provider.db")
	o, err := openOutbox(t, dsn, OutboxConfig{Fault: FaultRecordLate, RecordDelay: delay})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	id, err := o.Send(ctx, "k1", testEmail)
	if !errors.Is(err, context.DeadlineExceeded) || id != "" {
		t.Fatalf("Send = %q, %v; want a DeadlineExceeded error", id, err)
	}
	if _, found, err := o.Lookup(ctx, "k1"); err != nil || found {
		t.Fatalf("Lookup right after the lost answer: found %v, %v; want not found", found, err)
	}
	// The provider has taken it: it acts on it (check compares with this).
	if acc := accepted(t, o); len(acc) != 1 || !acc["k1"] {
		t.Fatalf("accepted = %v", acc)
	}
	// Asked again before it is recorded: still no answer, nothing taken
	// twice, whatever the asking process's fault (none, or reject).
	if _, err := o.Send(ctx, "k1", testEmail); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("repeat while not recorded: %v, want DeadlineExceeded", err)
	}
	for _, fault := range []string{FaultNone, FaultReject} {
		other, err := openOutbox(t, dsn, OutboxConfig{Fault: fault})
		if err != nil {
			t.Fatal(err)
		}
		if _, found, err := other.Lookup(ctx, "k1"); err != nil || found {
			t.Fatalf("fault %q: Lookup found %v, %v; want not found", fault, found, err)
		}
		if _, err := other.Send(ctx, "k1", testEmail); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("fault %q: repeat while not recorded: %v, want DeadlineExceeded (never a refusal)", fault, err)
		}
	}
	if time.Since(start) >= delay {
		t.Fatalf("the checks before the key is recorded took %v, longer than the delay %v", time.Since(start), delay)
	}
	if res := attemptResults(t, o, "k1"); len(res) != 4 || res[0] != AttemptAccepted || res[1] != AttemptPending || res[2] != AttemptPending || res[3] != AttemptPending {
		t.Fatalf("attempts = %v, want accepted then 3 pending", res)
	}

	// Recorded RecordDelay after it was taken, not before.
	var got string
	for deadline := time.Now().Add(delay + 10*time.Second); ; {
		var found bool
		if got, found, err = o.Lookup(ctx, "k1"); err != nil {
			t.Fatal(err)
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key not recorded %v after the call", time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if waited := time.Since(start); waited < delay {
		t.Fatalf("key recorded after %v, before the delay %v", waited, delay)
	}
	// From then on it is answered as any accepted key.
	sent, err := o.Deliver(ctx, "k1", testEmail)
	if err != nil || sent.ProviderID != got || !sent.Duplicate {
		t.Fatalf("Deliver after recording = %+v, %v; want duplicate %q", sent, err, got)
	}
	res := attemptResults(t, o, "k1")
	if n := len(res); n != 5 || res[n-1] != AttemptDuplicate {
		t.Fatalf("attempts = %v, want a duplicate last", res)
	}
	if n := countResult(res, AttemptAccepted); n != 1 {
		t.Fatalf("%d acceptances of k1, want 1", n)
	}
}

func countResult(res []string, want string) int {
	n := 0
	for _, r := range res {
		if r == want {
			n++
		}
	}
	return n
}

func TestOutboxCrash(t *testing.T) {
	var o *Outbox
	crashed := 0
	var seen bool
	o = openTestOutbox(t, OutboxConfig{Fault: FaultCrash, CrashFunc: func() {
		crashed++
		// The acceptance is durable before the "process" dies.
		_, seen, _ = o.Lookup(context.Background(), "k1")
	}})
	_, err := o.Send(context.Background(), "k1", testEmail)
	if !errors.Is(err, ErrSimulatedCrash) {
		t.Fatalf("err = %v", err)
	}
	if crashed != 1 || !seen {
		t.Fatalf("crashed %d times, key seen at crash: %v", crashed, seen)
	}
}

// Without a CrashFunc the crash fault is an error the caller sees (no
// process exit in this package: the gateway's main supplies that), after
// the acceptance is durable.
func TestOutboxCrashWithoutCrashFunc(t *testing.T) {
	o := openTestOutbox(t, OutboxConfig{Fault: FaultCrash})
	if _, err := o.Send(context.Background(), "k1", testEmail); !errors.Is(err, ErrSimulatedCrash) {
		t.Fatalf("err = %v, want ErrSimulatedCrash", err)
	}
	if _, found, err := o.Lookup(context.Background(), "k1"); err != nil || !found {
		t.Fatalf("after the crash fault the key is found: %v, %v", found, err)
	}
}

func TestOutboxCrashPanics(t *testing.T) {
	path := testDSN(t, "gw.db")
	o, err := openOutbox(t, path, OutboxConfig{Fault: FaultCrash, CrashFunc: func() { panic("crash") }})
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r != "crash" {
				t.Fatalf("recovered %v", r)
			}
		}()
		o.Send(context.Background(), "k1", testEmail)
	}()
	// A fresh process (a new Outbox on the same file) finds the key.
	o2, err := openOutbox(t, path, OutboxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := o2.Lookup(context.Background(), "k1"); err != nil || !found {
		t.Fatalf("after crash: found %v, %v", found, err)
	}
}

func TestOutboxFaultEvery(t *testing.T) {
	o := openTestOutbox(t, OutboxConfig{Fault: FaultReject, FaultEvery: 2})
	ctx := context.Background()
	if _, err := o.Send(ctx, "k1", testEmail); !errors.Is(err, tools.ErrRejected) {
		t.Fatalf("call 1: %v, want rejected", err)
	}
	id, err := o.Send(ctx, "k1", testEmail)
	if err != nil || id == "" {
		t.Fatalf("call 2: %q, %v", id, err)
	}
	// Call 3 is faulty again, but the key is accepted: the provider
	// answers with it rather than claim it did nothing.
	id3, err := o.Send(ctx, "k1", testEmail)
	if err != nil || id3 != id {
		t.Fatalf("call 3: %q, %v", id3, err)
	}
	if _, err := o.Send(ctx, "k2", testEmail); err != nil {
		t.Fatalf("call 4: %v", err)
	}
	if _, err := o.Send(ctx, "k3", testEmail); !errors.Is(err, tools.ErrRejected) {
		t.Fatalf("call 5: %v, want rejected", err)
	}
	want := []string{AttemptRejected, AttemptAccepted, AttemptDuplicate}
	if res := attemptResults(t, o, "k1"); len(res) != 3 || res[0] != want[0] || res[1] != want[1] || res[2] != want[2] {
		t.Fatalf("attempts = %v, want %v", res, want)
	}

	// accept-then-timeout on the first call, success on the second.
	o2 := openTestOutbox(t, OutboxConfig{Fault: FaultAcceptThenTimeout, FaultEvery: 2})
	if _, err := o2.Send(ctx, "k", testEmail); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first: %v", err)
	}
	id, err = o2.Send(ctx, "k", testEmail)
	if err != nil {
		t.Fatalf("second: %v", err)
	}
	if got, _, _ := o2.Lookup(ctx, "k"); got != id {
		t.Fatalf("retry returned %q, stored %q", id, got)
	}
	if acc := accepted(t, o2); !acc["k"] {
		t.Fatalf("accepted = %v", acc)
	}
}

func TestOutboxCancelDuringLatency(t *testing.T) {
	o := openTestOutbox(t, OutboxConfig{Latency: 10 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := o.Send(ctx, "k1", testEmail)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
	if acc := accepted(t, o); len(acc) != 0 {
		t.Fatalf("accepted = %v", acc)
	}
	if res := attemptResults(t, o, "k1"); len(res) != 1 || res[0] != AttemptCancelled {
		t.Fatalf("attempts = %v", res)
	}
}

func TestNewOutboxBadConfig(t *testing.T) {
	dsn := testDSN(t, "x.db")
	if _, err := openOutbox(t, dsn, OutboxConfig{Fault: "flaky"}); err == nil || !strings.Contains(err.Error(), "use reject, accept-then-timeout, record-late or crash") {
		t.Fatalf("unknown fault: %v, want a refusal naming the faults", err)
	}
	if _, err := openOutbox(t, dsn, OutboxConfig{Fault: FaultRecordLate, RecordDelay: -time.Second}); err == nil {
		t.Fatal("negative record delay accepted")
	}
	if _, err := NewOutbox(nil, OutboxConfig{}); err == nil {
		t.Fatal("no database accepted")
	}
}

// Two Outboxes on one database (each on a store of its own, as two
// instances on one PostgreSQL database have) still accept a key once.
func TestOutboxSharedFile(t *testing.T) {
	path := testDSN(t, "shared.db")
	var obs [2]*Outbox
	var errs2 [2]error
	var wg sync.WaitGroup
	for i := range obs {
		obs[i], errs2[i] = openOutbox(t, path, OutboxConfig{})
	}
	for i := range obs {
		if errs2[i] != nil {
			t.Fatal(errs2[i])
		}
	}
	ids := make([]string, 10)
	errs := make([]error, 10)
	for i := range ids {
		wg.Go(func() { ids[i], errs[i] = obs[i%2].Send(context.Background(), "k", testEmail) })
	}
	wg.Wait()
	for i := range ids {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Fatalf("send %d: %q, %v (first %q)", i, ids[i], errs[i], ids[0])
		}
	}
	if acc := accepted(t, obs[0]); len(acc) != 1 || !acc["k"] {
		t.Fatalf("accepted = %v", acc)
	}
	if res := attemptResults(t, obs[1], "k"); len(res) != 10 {
		t.Fatalf("%d attempts", len(res))
	}
}
