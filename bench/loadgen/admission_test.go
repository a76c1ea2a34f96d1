package loadgen

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestAdmissionCountedAndMerged(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	var a, b admissionStats
	a.counted(started{runID: "r1", acked: t0, sampled: true}, ms(30))                   // admitted, 30 ms to its first delta
	a.counted(started{runID: "r2", acked: t0, sampled: false, position: 9}, ms(5000))   // acked outside the window: not counted
	a.counted(started{runID: "r3", position: 4, acked: t0, sampled: true}, ms(2000))    // queued, waited 2 s
	b.counted(started{runID: "r4", position: 1, acked: t0, sampled: true}, time.Time{}) // queued, cancelled before it started
	b.counted(started{runID: "r5", acked: t0, sampled: true}, ms(50))
	b.counted(started{runID: "r6", position: 7, acked: t0, sampled: true}, ms(4000))
	b.counted(started{runID: "r7", acked: t0, sampled: true}, time.Time{}) // admitted, ended before a delta: counted, no figure

	got := mergeAdmission([]admissionStats{a, b})
	if got.admitted != 3 || got.queued != 3 || got.neverStarted != 1 {
		t.Errorf("counts = %d admitted, %d queued, %d never started; want 3, 3, 1", got.admitted, got.queued, got.neverStarted)
	}
	if got.positions.N != 3 || got.positions.P50 != 4 || got.positions.Max != 7 {
		t.Errorf("positions = %+v, want 3 of them, p50 4, max 7", got.positions)
	}
	if got.firstDelta.N != 2 || got.firstDelta.P50 != 30 || got.firstDelta.Max != 50 {
		t.Errorf("admitted first delta = %+v, want 2 samples, p50 30 ms, max 50 ms", got.firstDelta)
	}
	if got.wait.N != 2 || got.wait.P50 != 2000 || got.wait.P99 != 4000 {
		t.Errorf("queued wait = %+v, want 2 samples, p50 2000 ms, p99 4000 ms", got.wait)
	}
	if empty := mergeAdmission(nil); empty.admitted != 0 || !math.IsNaN(empty.positions.P50) || !math.IsNaN(empty.wait.P99) {
		t.Errorf("merge of nothing = %+v", empty)
	}
}

func TestSummarizeInts(t *testing.T) {
	v := []int{5, 1, 3, 2, 4}
	if got := summarizeInts(v); got.N != 5 || got.P50 != 3 || got.Max != 5 {
		t.Errorf("summarizeInts(5 1 3 2 4) = %+v", got)
	}
	if !slices.IsSorted(v) {
		t.Errorf("not sorted in place: %v", v)
	}
	if got := summarizeInts([]int{1, 2}); got.P50 != 1 { // nearest rank: the 1st of 2
		t.Errorf("p50 of 1, 2 = %v, want 1", got.P50)
	}
	if got := summarizeInts(nil); got.N != 0 || !math.IsNaN(got.P50) || !math.IsNaN(got.Max) {
		t.Errorf("summarizeInts(nil) = %+v", got)
	}
}

func TestPaceTracker(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var p paceTracker
	steps := []struct {
		run    string
		at     time.Duration
		gap    time.Duration
		follow bool
	}{
		{"a", 0, 0, false}, // a run's first delta has no gap
		{"a", 20 * time.Millisecond, 20 * time.Millisecond, true},
		{"a", 75 * time.Millisecond, 55 * time.Millisecond, true},
		{"b", 80 * time.Millisecond, 0, false}, // the next run starts afresh
		{"b", 100 * time.Millisecond, 20 * time.Millisecond, true},
	}
	for i, s := range steps {
		gap, ok := p.gap(s.run, t0.Add(s.at))
		if gap != s.gap || ok != s.follow {
			t.Errorf("step %d (%s at %s): gap %s %v, want %s %v", i, s.run, s.at, gap, ok, s.gap, s.follow)
		}
	}
	p = paceTracker{} // reset (a replay)
	if _, ok := p.gap("b", t0.Add(time.Second)); ok {
		t.Error("a delta after a reset has a gap")
	}
}

func TestDeltaClassShares(t *testing.T) {
	const pace = 20 * time.Millisecond // at pace: within 40 ms
	var a, b deltaClass
	a.observe(10_000, 0, false, pace)                   // first delta of a run: latency only
	a.observe(40_000, 40*time.Millisecond, true, pace)  // both at the limit: within
	a.observe(41_000, 41*time.Millisecond, true, pace)  // both just over
	b.observe(5_000, 20*time.Millisecond, true, pace)   // within
	b.observe(90_000, 100*time.Millisecond, true, pace) // a stall: neither
	got := mergeDeltaClass([]*deltaClass{&a, &b})
	if got.deltas != 5 || got.gaps != 4 || got.starved != 2 {
		t.Errorf("deltas %d, gaps %d, starved %d; want 5, 4, 2", got.deltas, got.gaps, got.starved)
	}
	if got.latWithin != 60 || got.gapWithin != 50 {
		t.Errorf("within: latency %v %%, gap %v %%; want 60, 50", got.latWithin, got.gapWithin)
	}
	if got.lat.Max != 90 || got.lat.P50 != 40 {
		t.Errorf("latency = %+v", got.lat)
	}
	if none := mergeDeltaClass(nil); !math.IsNaN(none.gapWithin) || !math.IsNaN(none.latWithin) || !math.IsNaN(none.lat.P99) {
		t.Errorf("no deltas = %+v", none)
	}
}

func TestCancelWhen(t *testing.T) {
	for _, c := range []struct {
		queued, saw bool
		want        int
	}{
		{false, false, cancelStreaming}, // admitted runs are cancelled after their first delta anyway
		{false, true, cancelStreaming},
		{true, false, cancelWaiting},
		{true, true, cancelStreaming}, // it left the queue before the cancel
	} {
		if got := cancelWhen(c.queued, c.saw); got != c.want {
			t.Errorf("cancelWhen(queued %v, saw a delta %v) = %d, want %d", c.queued, c.saw, got, c.want)
		}
	}
}

func TestMergeCancelsByWhen(t *testing.T) {
	var a, b cancelStats
	for _, s := range []*cancelStats{&a, &b} {
		s.ack.add(2000)
		s.cancelled.add(9000)
		s.byWhen[cancelStreaming].ack.add(2000)
		s.byWhen[cancelStreaming].cancelled.add(9000)
		s.sent++
	}
	a.ack.add(1000)
	a.cancelled.add(3000)
	a.byWhen[cancelWaiting].ack.add(1000)
	a.byWhen[cancelWaiting].cancelled.add(3000)
	got := mergeCancels([]cancelStats{a, b})
	if got.ack.N != 3 || got.sent != 2 {
		t.Errorf("aggregate: %d acks, %d sent; want 3, 2", got.ack.N, got.sent)
	}
	w, s := got.byWhen[cancelWaiting], got.byWhen[cancelStreaming]
	if w.ack.N != 1 || w.ack.P99 != 1 || w.done.P99 != 3 {
		t.Errorf("waiting = %+v", w)
	}
	if s.ack.N != 2 || s.ack.P99 != 2 || s.done.P99 != 9 {
		t.Errorf("streaming = %+v", s)
	}
}

func TestSplitGaps(t *testing.T) {
	gaps := []runGap{{"r1", 30_000}, {"r2", 4_000_000}, {"r3", 25_000}, {"r4", 1_500_000}}
	queued := map[string]bool{"r2": true, "r4": true, "r9": true}
	adm, q := splitGaps(gaps, func(id string) bool { return queued[id] })
	if !slices.Equal(adm, []int32{30_000, 25_000}) || !slices.Equal(q, []int32{4_000_000, 1_500_000}) {
		t.Errorf("split = admitted %v, queued %v", adm, q)
	}
	if adm, q := splitGaps(nil, func(string) bool { return true }); adm != nil || q != nil {
		t.Errorf("split of nothing = %v %v", adm, q)
	}
}

func TestShareAndMeanMax(t *testing.T) {
	if got := share(99, 100); got != 99 {
		t.Errorf("share(99, 100) = %v", got)
	}
	if got := share(0, 0); !math.IsNaN(got) {
		t.Errorf("share of nothing = %v", got)
	}
	if mean, top := meanMax([]float64{0, 4, 2}); mean != 2 || top != 4 {
		t.Errorf("meanMax(0 4 2) = %v %v", mean, top)
	}
	if mean, top := meanMax(nil); !math.IsNaN(mean) || !math.IsNaN(top) {
		t.Errorf("meanMax(nil) = %v %v", mean, top)
	}
}

func TestPromSum(t *testing.T) {
	s := promSample{
		"gateway_run_capacity":                    64,
		`gateway_runs_waiting{instance="a"}`:      3,
		`gateway_runs_waiting{instance="b"}`:      4,
		"gateway_runs_waiting_total":              100, // another metric with the name as its prefix
		`gateway_runs_waiting_seconds{le="+Inf"}`: 9,
	}
	if v, ok := s.sum("gateway_run_capacity"); !ok || v != 64 {
		t.Errorf("capacity = %v %v", v, ok)
	}
	if v, ok := s.sum("gateway_runs_waiting"); !ok || v != 7 {
		t.Errorf("waiting = %v %v, want 7 over both series", v, ok)
	}
	if _, ok := s.sum("gateway_nothing"); ok {
		t.Error("a missing metric was found")
	}
}

func TestCapacityMetrics(t *testing.T) {
	if got := capacityMetrics(&promWindow{before: promSample{}, after: promSample{"x": 1}}, nil); len(got) != 0 {
		t.Errorf("a gateway without the gauges got figures: %+v", got)
	}
	pw := &promWindow{before: promSample{}, after: promSample{promRunCapacity: 48, promRunsWaiting: 2}}
	got := capacityMetrics(pw, map[string][]float64{promRunsWaiting: {1, 5, 3}})
	var names []string
	for _, m := range got {
		names = append(names, m.Name)
	}
	if len(got) != 3 || *got[0].Gateway != 48 || *got[1].Gateway != 3 || *got[2].Gateway != 5 ||
		!strings.Contains(names[1], "mean of 3 scrapes") {
		t.Errorf("figures = %q %+v", names, got)
	}
	got = capacityMetrics(pw, map[string][]float64{promRunsWaiting: {1}, promRunsExecuting: {40, 48}})
	if len(got) != 5 || *got[3].Gateway != 44 || *got[4].Gateway != 48 {
		t.Errorf("with runs executing: %+v", got)
	}
}

func TestGatewayArgsCapacity(t *testing.T) {
	r := &runner{cfg: Config{Auth: "header"}}
	flag := func(args []string, name string) (string, bool) {
		i := slices.Index(args, name)
		if i < 0 || i+1 >= len(args) {
			return "", false
		}
		return args[i+1], true
	}
	if v, ok := flag(r.gatewayArgs("x.db", time.Millisecond, 516), "-workers"); !ok || v != "516" {
		t.Errorf("-workers = %q %v, want 516", v, ok)
	}
	args := r.gatewayArgs("x.db", time.Millisecond, 0)
	if _, ok := flag(args, "-workers"); ok {
		t.Errorf("workers 0 passed -workers: %q", args)
	}
	if v, _ := flag(args, "-db"); v != "x.db" {
		t.Errorf("-db = %q", v)
	}
}

func TestConfigValidateScaleCapacity(t *testing.T) {
	c := Config{Scenarios: []string{"scale"}, Auth: "header", Pace: 1, Window: 1, StorageWindow: 1, CancelWindow: 1,
		IdleThreads: 1, IdleTabs: 1, FanoutThreads: 1, FanoutTabs: 1, CancelRuns: 1, CancelTabs: 1, StorageRuns: 1,
		ScaleRuns: 1, ScaleTabs: 1, ScalePace: 1, ScaleWindow: 1, ScaleCancelEvery: 1}
	for _, n := range []int{0, 64} {
		c.ScaleCapacity = n
		if err := c.Validate(); err != nil {
			t.Errorf("-scale-capacity %d refused: %v", n, err)
		}
	}
	c.ScaleCapacity = -1
	if err := c.Validate(); err == nil {
		t.Error("-scale-capacity -1 accepted")
	}
}
