package loadgen

import (
	"context"
	"runtime"
	"time"
)

// fanFigures is what one fan-out window measured on one server.
type fanFigures struct {
	window                float64 // seconds
	deliveries, deltas    float64 // per second, all tabs
	offered               float64 // deliveries per second the shape asks for
	cpuPerDelta           float64 // server µs per delivered delta
	serverCores, genCores float64
	serverMicros          int64 // server CPU over the window; valid when cpuOK
	cpuOK                 bool
	writtenBytes          int64 // the server's write_bytes over the window; valid when ioOK
	ioOK                  bool
	machineBusy           float64
	otherCores            float64 // CPU used by neither the server nor the generator
	lat, spread, publish  Dist
	reconnects, resyncs   int64
	replayed              int64
	store                 *storeStats
	storeErr              error
	deltaRate             float64     // distinct deltas per second per thread
	deltaSize             float64     // mean bytes per delta event
	published             float64     // floor: messages published per second
	prom                  *promWindow // the gateway's own metrics over the window
	eventsDelivered       int64       // all events the tabs received in the window
	serverPublish         Dist        // store ts: last delta's transaction → publish transaction
}

func (f *fanFigures) fill(m *cpuMeter, window time.Duration, deliveries, deltas int64) {
	f.window = window.Seconds()
	f.deliveries = float64(deliveries) / f.window
	f.deltas = float64(deltas) / f.window
	f.serverMicros, f.cpuOK = m.serverMicros(), m.err() == nil
	f.writtenBytes, f.ioOK = m.writtenBytes()
	f.cpuPerDelta = nan
	if f.cpuOK && deltas > 0 {
		f.cpuPerDelta = float64(m.serverMicros()) / float64(deltas)
	}
	f.serverCores = float64(m.serverMicros()) / (f.window * 1e6)
	f.genCores = float64(m.selfMicros()) / (f.window * 1e6)
	f.machineBusy = m.machineBusy()
	f.otherCores = max(0, f.machineBusy*float64(runtime.NumCPU())-f.serverCores-f.genCores)
}

// readStore reads the counts the stopped gateway's database db holds for
// the window [w0, w1] into f, and returns them.
func (f *fanFigures) readStore(ctx context.Context, db string, w0, w1 time.Time) storeStats {
	st, err := readStoreStats(ctx, db, w0.UnixMilli(), w1.UnixMilli())
	f.store, f.storeErr = &st, err
	return st
}

// runsStreaming is how many runs streamed at once over the window: the
// deltas committed per second times the time one run takes per delta
// (pace); NaN for an empty window.
func (f *fanFigures) runsStreaming(deltas int64, pace time.Duration) float64 {
	if f.window <= 0 {
		return nan
	}
	return float64(deltas) / f.window * pace.Seconds()
}

// cpuMetrics are the CPU figures of one server's window: the server's,
// the generator's, the machine's and everyone else's.
func cpuMetrics(f *fanFigures) []Metric {
	return []Metric{
		metric("server CPU", "cores", f.serverCores, ""),
		metric("generator CPU", "cores", f.genCores, ""),
		metric("machine busy", "%", 100*f.machineBusy, ""),
		metric("CPU of other processes", "cores", f.otherCores, ""),
	}
}

// cancelLatencyMetrics are the cancels as the tabs saw them: the ack and
// run.cancelled after the cancel was sent, p50 and p99 (the p99s against
// their targets).
func cancelLatencyMetrics(t cancelTotals, ackTarget, doneTarget string) []Metric {
	out := []Metric{
		metric("cancel ack p50", "ms", t.ack.P50, ""),
		metric("cancel ack p99", "ms", t.ack.P99, ackTarget),
		metric("cancel → run.cancelled p50", "ms", t.done.P50, ""),
		metric("cancel → run.cancelled p99", "ms", t.done.P99, doneTarget),
	}
	if t.probe.N > 0 {
		out = append(out,
			metric("floor: hello round trip on another tab, sent with each cancel, p50", "ms", t.probe.P50, ""),
			metric("floor: hello round trip on another tab, sent with each cancel, p99", "ms", t.probe.P99, ""))
	}
	return out
}

// cancelMetrics are the figures the cancel scenarios lead with: the
// cancels as the tabs saw them (cancel → run.cancelled p99 against
// doneTarget), the server's own histograms of them (bucket bounds), and
// cancel_requested → run.cancelled in the store (settle). on names the
// instances measured in the labels (the cluster's "both instances"); ""
// for one.
func cancelMetrics(t cancelTotals, pw *promWindow, settle Dist, doneTarget, on string) []Metric {
	bound := "bucket bound"
	if on != "" {
		bound += ", " + on
	}
	return append(
		cancelLatencyMetrics(t, "≤ 10 ms", doneTarget),
		metric("cancel → run.cancelled max", "ms", t.done.Max, ""),
		metric(
			"server metric: cancel ack p99 ("+bound+")",
			"ms",
			1000*pw.quantileBound(promCancelAck, `transport="websocket"`, 0.99),
			"",
		),
		metric("server metric: cancels acked from the cancel journal", "count", pw.delta(promJournaled), ""),
		metric(
			"server metric: cancel accepted → cancelled p99 ("+bound+")",
			"ms",
			1000*pw.quantileBound(promSettle, "", 0.99),
			"",
		),
		metric("server: cancel_requested → cancelled p50 (store ts)", "ms", settle.P50, ""),
		metric("server: cancel_requested → cancelled p99 (store ts)", "ms", settle.P99, ""),
	)
}

// cancelLoadMetrics are the load a cancel scenario's cancels met: how many
// runs streamed at once (st, at pace), how fast the deltas reached the
// tabs (lat), and the server CPU each delivery cost. on is as in
// cancelMetrics.
func cancelLoadMetrics(f *fanFigures, st storeStats, lat Dist, pace time.Duration, on string) []Metric {
	tabs, servers := "", ""
	if on != "" {
		tabs, servers = " (tabs on "+on+")", " ("+on+")"
	}
	return []Metric{
		metric("runs streaming at once (deltas/s × pace)", "runs", f.runsStreaming(st.Deltas, pace), ""),
		metric("delta delivery latency p50"+tabs, "ms", lat.P50, ""),
		metric("delta delivery latency p99"+tabs, "ms", lat.P99, ""),
		metric("deliveries/s, deltas", "1/s", f.deltas, ""),
		metric("server CPU per delivered delta"+servers, "µs", f.cpuPerDelta, ""),
	}
}

func nanFigures() fanFigures {
	d := Dist{P50: nan, P99: nan, Max: nan}
	return fanFigures{
		deliveries:    nan,
		deltas:        nan,
		offered:       nan,
		cpuPerDelta:   nan,
		serverCores:   nan,
		genCores:      nan,
		machineBusy:   nan,
		otherCores:    nan,
		lat:           d,
		spread:        d,
		publish:       d,
		serverPublish: d,
		deltaRate:     nan,
		deltaSize:     nan,
		published:     nan,
	}
}

// storeMetrics turns the database's counts of a window into rates.
func storeMetrics(f *fanFigures, s *ScenarioReport) []Metric {
	if f == nil || f.store == nil {
		return nil
	}
	if f.storeErr != nil {
		s.Notes = append(s.Notes, "store figures unavailable: "+f.storeErr.Error())
		return nil
	}
	st, w := f.store, f.window
	perBatch := nan
	if st.RunBatches > 0 {
		perBatch = float64(st.Deltas) / float64(st.RunBatches)
	}
	return []Metric{
		metric("deltas committed (stream buffer)", "1/s", float64(st.Deltas)/w, ""),
		metric("durable events committed", "1/s", float64(st.Durable)/w, ""),
		metric("store commits (est.: delta ms-stamps + durable tx)", "1/s", float64(st.DeltaMillis+st.DurableTx)/w, ""),
		metric("per-run delta batches", "1/s", float64(st.RunBatches)/w, ""),
		metric("deltas per run batch", "count", perBatch, ""),
	}
}

// The gateway's own metrics (package metrics) used when its admin
// listener serves them.
const (
	promTx        = "gateway_store_transaction_seconds"
	promTxWrite   = `gateway_store_transaction_seconds_count{kind="write"}`
	promTxWriteS  = `gateway_store_transaction_seconds_sum{kind="write"}`
	promGroupSum  = "gateway_store_group_commit_requests_sum"
	promGroupN    = "gateway_store_group_commit_requests_count"
	promDeltas    = "gateway_deltas_streamed_total"
	promFramesOut = "gateway_websocket_frames_sent_total"
	promCancelAck = "gateway_cancel_ack_seconds"
	promSettle    = "gateway_cancel_to_cancelled_seconds"
	promJournaled = "gateway_cancels_journaled_total"
)

// serverMetrics turns the gateway's own metrics over a window into
// figures; none when it exposes none.
func serverMetrics(f *fanFigures, s *ScenarioReport) []Metric {
	if f == nil || f.prom == nil || !f.prom.has(promTxWrite) {
		s.Notes = append(
			s.Notes,
			"no server metrics (the gateway has no admin listener with /metrics): "+
				"store commits are estimated from the database",
		)
		return nil
	}
	w := f.prom
	ms := func(v float64) float64 { return 1000 * v }
	perFrame := nan
	if frames := w.delta(promFramesOut); frames > 0 && f.eventsDelivered > 0 {
		perFrame = float64(f.eventsDelivered) / frames
	}
	return []Metric{
		metric("server metric: store commits (group commits of every write)", "1/s", w.rate(promTxWrite), ""),
		metric("server metric: writes per group commit", "count", w.delta(promGroupSum)/w.delta(promGroupN), ""),
		metric("server metric: writer busy (write tx time / window)", "%", 100*w.delta(promTxWriteS)/w.seconds, ""),
		metric(
			"server metric: write tx p99 (bucket bound)",
			"ms",
			ms(w.quantileBound(promTx, `kind="write"`, 0.99)),
			"≤ 10 ms (publish + checkpoint)",
		),
		metric(
			"server metric: write tx p99 (interpolated in its bucket)",
			"ms",
			ms(w.quantile(promTx, `kind="write"`, 0.99)),
			"",
		),
		metric("server metric: write tx mean", "ms", ms(w.delta(promTxWriteS)/w.delta(promTxWrite)), ""),
		metric("server metric: deltas streamed", "1/s", w.rate(promDeltas), ""),
		metric("events per WebSocket frame (coalescing)", "count", perFrame, ""),
	}
}
