package loadgen

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// The generator's gateway side against the real gateway, through package
// client: tabs connect and subscribe, one thread streams runs back to back
// and another cancels its runs from random tabs, a tab whose connection is
// cut catches up by itself, every tab ends at the thread's last seq, and
// nothing counts as a protocol error.
func TestGatewayClients(t *testing.T) {
	ctx, r := gatewayRunner(t)
	const pace = 10 * time.Millisecond
	p, err := r.startGateway("test", pace, 8)
	if err != nil {
		t.Fatal(err)
	}
	var s ScenarioReport
	defer p.finish(ctx, &s)
	if err := p.setup(ctx, 2, 3, true); err != nil {
		t.Fatal(err)
	}
	streamer, canceller := p.threads[0], p.threads[1]
	var cs cancelStats
	rng := rand.New(rand.NewPCG(1, 2))
	stopAt := time.Now().Add(3 * time.Second)
	p.env.measuring.Store(true)
	var drivers sync.WaitGroup
	drivers.Go(func() { streamer.driveContinuous(ctx, stopAt, pace) })
	drivers.Go(func() {
		canceller.driveCancels(ctx, stopAt, 300*time.Millisecond, pace, rng, anyTab(canceller, rng), &cs)
	})
	sleep(ctx, time.Second)
	dropped := streamer.tabs[1]
	if !dropped.drop() {
		t.Fatal("no connection to cut")
	}
	if dropped.drop() {
		t.Fatal("a tab's connection was cut twice")
	}
	drivers.Wait()
	p.env.measuring.Store(false)
	p.env.verifyEnd(ctx, p.threads, 5*time.Second)
	p.finish(ctx, &s)

	if len(s.GatewayErrors) != 0 || s.Check == nil || !s.Check.OK {
		t.Fatalf("errors %+v, check %+v", s.GatewayErrors, s.Check)
	}
	if got := dropped.reconnects.Load(); got != 1 {
		t.Errorf("the cut tab reconnected %d times, want 1", got)
	}
	if cs.sent == 0 || len(cs.ack.v) == 0 || len(cs.cancelled.v) == 0 {
		t.Errorf("cancels: %d sent, %d acks and %d run.cancelled measured", cs.sent, len(cs.ack.v), len(cs.cancelled.v))
	}
	// Every sampled cancel had its hello probe on another tab answered (a
	// refused hello would be a protocol error above); a cancel refused
	// because its run had ended has a probe but no ack measured.
	if len(cs.probe.v) < len(cs.ack.v) {
		t.Errorf("%d hello probes measured for %d cancels", len(cs.probe.v), len(cs.ack.v))
	}
	for _, th := range p.threads {
		for _, tab := range th.tabs {
			if tab.deltas.Load() == 0 || len(tab.lat.v) == 0 {
				t.Errorf("tab %s: %d deltas, %d latencies", tab.tabID, tab.deltas.Load(), len(tab.lat.v))
			}
		}
	}
	if streamer.deltasProduced.Load() == 0 {
		t.Error("no delta counted as produced")
	}
}

// Admission against the real gateway: at capacity 1, three threads want a
// run each at once, so runs wait queued. Every queued run either starts
// (with a wait measured) or is cancelled while it waits (acked, then
// run.cancelled); neither the wait nor those cancels count as protocol
// errors, and the admission figures see both classes of runs.
func TestGatewayAdmission(t *testing.T) {
	ctx, r := gatewayRunner(t)
	r.admin = supportsFlag(r.gateway, "admin-addr")
	const pace = 5 * time.Millisecond
	p, err := r.startGateway("admission", pace, 1)
	if err != nil {
		t.Fatal(err)
	}
	var s ScenarioReport
	defer p.finish(ctx, &s)
	if m := p.scrape(ctx); m == nil {
		t.Skip("this gateway has no admin listener with /metrics")
	} else if _, ok := m.sum(promRunCapacity); !ok {
		t.Skip("this gateway has no admission (no " + promRunCapacity + ")")
	}
	const window = 4 * time.Second
	p.env.admission = true
	p.env.queueAllowance = window
	if err := p.setup(ctx, 4, 2, true); err != nil {
		t.Fatal(err)
	}
	stopAt := time.Now().Add(window)
	p.env.measuring.Store(true)
	stats := make([]cancelStats, len(p.threads))
	var drivers sync.WaitGroup
	for i, th := range p.threads {
		if i == 0 {
			rng := rand.New(rand.NewPCG(1, 3))
			drivers.Go(func() { th.driveCancels(ctx, stopAt, 300*time.Millisecond, pace, rng, anyTab(th, rng), &stats[i]) })
			continue
		}
		drivers.Go(func() { th.driveContinuous(ctx, stopAt, pace) })
	}
	drivers.Wait()
	p.env.measuring.Store(false)
	p.env.verifyEnd(ctx, p.threads, 5*time.Second)
	p.closeTabs()
	adm := make([]admissionStats, len(p.threads))
	for i, th := range p.threads {
		adm[i] = th.adm
	}
	at, ct := mergeAdmission(adm), mergeCancels(stats)
	p.finish(ctx, &s)
	t.Logf("runs: %d admitted, %d queued (position max %v), %d waits measured (p50 %.0f ms), %d cancelled while waiting; cancels: %d sent, %d of a waiting run, %d of a streaming run",
		at.admitted, at.queued, at.positions.Max, at.wait.N, at.wait.P50, at.neverStarted, ct.sent, ct.byWhen[cancelWaiting].ack.N, ct.byWhen[cancelStreaming].ack.N)

	if len(s.GatewayErrors) != 0 || s.Check == nil || !s.Check.OK {
		t.Fatalf("errors %+v, check %+v", s.GatewayErrors, s.Check)
	}
	if at.queued == 0 || at.positions.Max < 1 {
		t.Errorf("no run waited at capacity 1: %+v", at)
	}
	if at.wait.N+at.neverStarted != at.queued {
		t.Errorf("queued runs %d: %d waits measured and %d cancelled before they started", at.queued, at.wait.N, at.neverStarted)
	}
	if at.wait.N == 0 {
		t.Errorf("no queued run started: %+v", at)
	}
	if ct.sent == 0 || ct.ack.N != ct.byWhen[cancelWaiting].ack.N+ct.byWhen[cancelStreaming].ack.N {
		t.Errorf("cancels: %d sent, %d acks, split %d waiting + %d streaming", ct.sent, ct.ack.N, ct.byWhen[cancelWaiting].ack.N, ct.byWhen[cancelStreaming].ack.N)
	}
}

// gatewayRunner builds the gateway of this repository for a test (skipped
// with -short) and returns a runner for it, and a context bounded to five
// minutes that ends with the test.
func gatewayRunner(t *testing.T) (context.Context, *runner) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and starts the gateway")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{cfg: Config{Repo: repo, Auth: "header"}, start: time.Now(), dir: t.TempDir()}
	if r.gateway, err = build(ctx, repo, ".", r.dir, "gateway"); err != nil {
		t.Fatal(err)
	}
	return ctx, r
}
