package loadgen

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Admission (docs/protocol.md "Admission"): at capacity the gateway answers
// run.start with queue_position ≥ 1 and starts the run when a slot frees;
// the first event the tabs see of it is then its first message.delta. The
// generator calls a run "queued" when its ack carried a queue_position,
// else "admitted", and measures the two apart.

// Run classes: the index of a class's figures.
const (
	classAdmitted = 0
	classQueued   = 1
)

// started is what a driver learnt from a run.start ack.
type started struct {
	runID    string
	position int       // the ack's queue_position; 0: a slot was free (admitted)
	acked    time.Time // when the tab's reader read the ack
	sampled  bool      // acked while the environment measured
}

func (s started) queued() bool { return s.position > 0 }

// admissionStats is what one driver measured of its runs' admission;
// only runs acked while the environment measured count.
type admissionStats struct {
	admitted, queued int     // runs
	positions        []int   // queue_position of each queued run
	firstDelta       samples // admitted: µs from the ack's receipt to the first delta on tab 0
	wait             samples // queued: µs from the ack's receipt to the first delta on tab 0
	neverStarted     int     // queued runs that ended (cancelled) before their first delta
}

// counted records run s, whose first delta tab 0 received at first (zero
// when it ended without one).
func (a *admissionStats) counted(s started, first time.Time) {
	if !s.sampled {
		return
	}
	if !s.queued() {
		a.admitted++
		if !first.IsZero() {
			a.firstDelta.add(first.Sub(s.acked).Microseconds())
		}
		return
	}
	a.queued++
	a.positions = append(a.positions, s.position)
	if first.IsZero() {
		a.neverStarted++
		return
	}
	a.wait.add(first.Sub(s.acked).Microseconds())
}

// admissionTotals is what all the drivers of a scenario measured of
// admission.
type admissionTotals struct {
	admitted, queued, neverStarted int
	positions                      intDist
	firstDelta, wait               Dist // ms
}

// mergeAdmission merges the drivers' admission figures.
func mergeAdmission(stats []admissionStats) admissionTotals {
	var t admissionTotals
	var first, wait []*samples
	var positions []int
	for i := range stats {
		s := &stats[i]
		t.admitted += s.admitted
		t.queued += s.queued
		t.neverStarted += s.neverStarted
		positions = append(positions, s.positions...)
		first, wait = append(first, &s.firstDelta), append(wait, &s.wait)
	}
	t.positions = summarizeInts(positions)
	t.firstDelta, t.wait = summarize(merged(first...)), summarize(merged(wait...))
	return t
}

// intDist summarises counts (queue positions): nearest-rank p50 and the
// maximum; NaN without values.
type intDist struct {
	N        int
	P50, Max float64
}

// summarizeInts sorts v in place and summarises it.
func summarizeInts(v []int) intDist {
	if len(v) == 0 {
		return intDist{P50: math.NaN(), Max: math.NaN()}
	}
	slices.Sort(v)
	rank := min(max(int(math.Ceil(0.5*float64(len(v)))), 1), len(v))
	return intDist{N: len(v), P50: float64(v[rank-1]), Max: float64(v[len(v)-1])}
}

// deltaClass is what one tab measured of the deltas of one class of runs
// (admitted or queued): their delivery latency, and how many kept pace.
type deltaClass struct {
	lat samples // µs, receipt − ts, as gwTab.lat
	// latWithin of the deltas in lat arrived within pace + paceSlack of
	// their ts.
	latWithin int64
	// gaps: deltas that followed a delta of the same run on this tab;
	// gapWithin of them arrived within pace + paceSlack of it.
	gaps, gapWithin int64
}

// paceSlack is how late after a pace a delta may come and still count as
// at pace.
const paceSlack = 20 * time.Millisecond

// paceTracker follows the deltas of one tab, one run at a time (a thread
// streams one run at a time): gap returns the time since the previous
// delta of run on this tab, and false for a run's first delta.
type paceTracker struct {
	run  string
	last time.Time
}

func (p *paceTracker) gap(run string, at time.Time) (time.Duration, bool) {
	prev, same := p.last, p.run == run && !p.last.IsZero()
	p.run, p.last = run, at
	if !same {
		return 0, false
	}
	return at.Sub(prev), true
}

// observe counts one live delta of the class's runs received at at with
// latency latUs (µs), gap since the run's previous delta on the tab (ok
// false for its first), against pace.
func (d *deltaClass) observe(latUs int64, gap time.Duration, ok bool, pace time.Duration) {
	limit := pace + paceSlack
	d.lat.add(latUs)
	if latUs <= limit.Microseconds() {
		d.latWithin++
	}
	if ok {
		d.gaps++
		if gap <= limit {
			d.gapWithin++
		}
	}
}

// deltaClassTotals is what every tab measured of one class of runs.
type deltaClassTotals struct {
	lat                   Dist
	latWithin, gapWithin  float64 // shares, %: NaN without deltas
	deltas, gaps, starved int64   // starved: gaps longer than pace + paceSlack
}

// mergeDeltaClass merges the tabs' figures of one class.
func mergeDeltaClass(all []*deltaClass) deltaClassTotals {
	var lat []*samples
	var t deltaClassTotals
	var latWithin, gapWithin int64
	for _, d := range all {
		lat = append(lat, &d.lat)
		latWithin += d.latWithin
		t.gaps += d.gaps
		gapWithin += d.gapWithin
	}
	t.lat = summarize(merged(lat...))
	t.deltas = int64(t.lat.N)
	t.starved = t.gaps - gapWithin
	t.latWithin, t.gapWithin = share(latWithin, t.deltas), share(gapWithin, t.gaps)
	return t
}

// share is part of whole in %, NaN for an empty whole.
func share(part, whole int64) float64 {
	if whole <= 0 {
		return math.NaN()
	}
	return 100 * float64(part) / float64(whole)
}

// cancelWhen says where a cancel found its run: still waiting for a slot
// (queued, and tab 0 had seen no delta of it) or streaming.
func cancelWhen(queued, sawDelta bool) int {
	if queued && !sawDelta {
		return cancelWaiting
	}
	return cancelStreaming
}

const (
	cancelStreaming = 0
	cancelWaiting   = 1
)

// runGap is a store-side figure of one run (µs).
type runGap struct {
	runID string
	us    int32
}

// splitGaps splits per-run figures into those of admitted runs and those
// of queued runs (queued reports whether the generator saw a
// queue_position on the run's ack).
func splitGaps(gaps []runGap, queued func(runID string) bool) (admitted, q []int32) {
	for _, g := range gaps {
		if queued(g.runID) {
			q = append(q, g.us)
		} else {
			admitted = append(admitted, g.us)
		}
	}
	return admitted, q
}

// admissionMetrics are scale's figures of admitted and queued runs apart:
// at (the drivers' view of starts), dAdm and dQ (the tabs' view of their
// deltas), fdAdm and fdQ (run.started → first delta in the store).
func admissionMetrics(at admissionTotals, dAdm, dQ deltaClassTotals, fdAdm, fdQ Dist, pace time.Duration) []Metric {
	within := fmt.Sprintf("pace + %s", paceSlack)
	firstTarget := fmt.Sprintf("≤ %s", pace+paceSlack)
	return []Metric{
		metric("admitted: runs started with a free slot (acked in the window)", "count", float64(at.admitted), ""),
		metric("admitted: run.start ack → first delta p50 (tab 0)", "ms", at.firstDelta.P50, ""),
		metric("admitted: run.start ack → first delta p99 (tab 0)", "ms", at.firstDelta.P99, firstTarget),
		metric("admitted: server: run.started → first delta p99 (store ts)", "ms", fdAdm.P99, firstTarget),
		metric("admitted: delta delivery latency p50", "ms", dAdm.lat.P50, ""),
		metric("admitted: delta delivery latency p99", "ms", dAdm.lat.P99, ""),
		metric(
			"admitted: deltas at pace (within "+within+" of the run's previous delta)",
			"%",
			dAdm.gapWithin,
			"≥ 99 %",
		),
		metric("admitted: deltas delivered within "+within+" of their ts", "%", dAdm.latWithin, "≥ 99 %"),
		metric("admitted: deltas measured (runs acked any time)", "count", float64(dAdm.deltas), ""),
		metric("queued: runs that waited for a slot (acked in the window)", "count", float64(at.queued), ""),
		metric(
			"queued: share of the runs acked in the window",
			"%",
			share(int64(at.queued), int64(at.queued+at.admitted)),
			"",
		),
		metric("queued: queue_position p50", "count", at.positions.P50, ""),
		metric("queued: queue_position max", "count", at.positions.Max, ""),
		metric("queued: wait, run.start ack → first delta p50 (tab 0)", "ms", at.wait.P50, ""),
		metric("queued: wait, run.start ack → first delta p99 (tab 0)", "ms", at.wait.P99, ""),
		metric("queued: server: run.started → first delta p99 (store ts)", "ms", fdQ.P99, ""),
		metric("queued: cancelled before they started", "count", float64(at.neverStarted), ""),
		metric("queued, once started: delta delivery latency p99", "ms", dQ.lat.P99, ""),
		metric(
			"queued, once started: deltas at pace (within "+within+" of the run's previous delta)",
			"%",
			dQ.gapWithin,
			"",
		),
	}
}

// waitCancelMetrics are the cancels split by where they found their run:
// still waiting for a slot, or streaming.
func waitCancelMetrics(t cancelTotals) []Metric {
	var out []Metric
	for _, w := range []struct {
		when int
		name string
	}{{cancelWaiting, "cancel of a waiting run"}, {cancelStreaming, "cancel of a streaming run"}} {
		d := t.byWhen[w.when]
		out = append(out,
			metric(w.name+": ack p50", "ms", d.ack.P50, ""),
			metric(w.name+": ack p99", "ms", d.ack.P99, "≤ 10 ms"),
			metric(w.name+": → run.cancelled p50", "ms", d.done.P50, ""),
			metric(w.name+": → run.cancelled p99", "ms", d.done.P99, "≤ 30 ms"),
			metric(w.name+": cancels measured", "count", float64(d.ack.N), ""),
		)
	}
	return out
}

// The gateway's admission gauges (docs/protocol.md "Admission").
const (
	promRunCapacity   = "gateway_run_capacity"   // slots: runs executing at once
	promRunsWaiting   = "gateway_runs_waiting"   // queued runs not yet claimed
	promRunsExecuting = "gateway_runs_executing" // runs the workers hold
)

// gaugeEvery is how often a gauge is scraped through a window.
const gaugeEvery = 500 * time.Millisecond

// capacityMetrics are the gateway's admission gauges over a window: its
// capacity at the window's end, and the runs waiting for a slot and the
// runs executing over gauges (scrapes through the window, by name); none
// of those the gateway lacks.
func capacityMetrics(pw *promWindow, gauges map[string][]float64) []Metric {
	var out []Metric
	if pw != nil && pw.after != nil {
		if v, ok := pw.after.sum(promRunCapacity); ok {
			out = append(out, metric("server metric: run capacity ("+promRunCapacity+")", "runs", v, ""))
		}
	}
	for _, g := range []struct{ name, what string }{
		{promRunsWaiting, "runs waiting for a slot"},
		{promRunsExecuting, "runs executing"},
	} {
		v := gauges[g.name]
		if len(v) == 0 {
			continue
		}
		mean, top := meanMax(v)
		out = append(out,
			metric(fmt.Sprintf("server metric: %s, mean of %d scrapes (%s)", g.what, len(v), g.name), "runs", mean, ""),
			metric("server metric: "+g.what+", max", "runs", top, ""),
		)
	}
	return out
}

// meanMax is the mean and the maximum of v; NaN for none.
func meanMax(v []float64) (mean, top float64) {
	if len(v) == 0 {
		return math.NaN(), math.NaN()
	}
	top = math.Inf(-1)
	for _, x := range v {
		mean += x
		top = max(top, x)
	}
	return mean / float64(len(v)), top
}
