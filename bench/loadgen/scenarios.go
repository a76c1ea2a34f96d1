package loadgen

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

var nan = math.NaN()

// settle is how long a server is left alone before its RSS is read.
const settle = 2 * time.Second

// idle: IdleTabs tabs connected and subscribed, no traffic; RSS per tab =
// (VmRSS with the tabs - VmRSS before them) / tabs, for the gateway and
// for the floor.
func (r *runner) idle(ctx context.Context) (s ScenarioReport) {
	c := r.cfg
	per := c.IdleTabs / c.IdleThreads
	n := per * c.IdleThreads
	s.Shape = fmt.Sprintf(
		"%d tabs over %d threads (%d each), connected and subscribed, no traffic",
		n, c.IdleThreads, per,
	)
	gw0, gw1, fl0, fl1 := nan, nan, nan, nan
	var gwConnect, flConnect float64 = nan, nan
	pw := &promWindow{seconds: 1}

	if p, err := r.startGateway("idle", c.Pace, 64); err != nil {
		s.Failure = err.Error()
	} else {
		func() {
			defer p.finish(ctx, &s)
			if err := p.createThreads(ctx, c.IdleThreads); err != nil {
				s.Failure = err.Error()
				return
			}
			gw0 = settledRSS(ctx, p.proc.pid)
			pw.before = p.scrape(ctx)
			began := time.Now()
			if err := p.connectTabs(ctx, per, false); err != nil {
				s.Failure = err.Error()
				return
			}
			gwConnect = time.Since(began).Seconds()
			gw1 = settledRSS(ctx, p.proc.pid)
			pw.after = p.scrape(ctx)
			p.env.verifyEnd(ctx, p.threads, 5*time.Second)
		}()
	}

	if p, err := r.startFloor("idle"); err != nil {
		s.Failure = err.Error()
	} else {
		func() {
			defer p.finish(&s)
			fl0 = settledRSS(ctx, p.proc.pid)
			began := time.Now()
			if err := p.setup(ctx, c.IdleThreads, per); err != nil {
				s.Failure = err.Error()
				return
			}
			flConnect = time.Since(began).Seconds()
			fl1 = settledRSS(ctx, p.proc.pid)
		}()
	}
	s.Metrics = []Metric{
		compared("RSS per idle tab", "KiB", (gw1-gw0)/float64(n), (fl1-fl0)/float64(n), "≤ 40 KiB"),
		compared("RSS before the tabs", "MiB", gw0/1024, fl0/1024, ""),
		compared("RSS with the tabs", "MiB", gw1/1024, fl1/1024, ""),
		compared("connect + subscribe all tabs", "s", gwConnect, flConnect, ""),
	}
	// The gateway's Go runtime metrics split its share: stacks, heap,
	// goroutines per tab.
	if pw.has("go_goroutines") {
		per := func(series string) float64 { return pw.delta(series) / float64(n) }
		s.Metrics = append(s.Metrics,
			metric("server metric: goroutines per tab", "count", per("go_goroutines"), ""),
			metric("server metric: Go stack in use per tab", "KiB", per("go_memstats_stack_inuse_bytes")/1024, ""),
			metric("server metric: Go heap in use per tab", "KiB", per("go_memstats_heap_inuse_bytes")/1024, ""),
		)
	}
	return s
}

// endDrivers waits for the drivers, checks that every tab received every
// event of its thread (waiting at most timeout), and closes the tabs:
// after it, their samples may be read.
func (p *gwPhase) endDrivers(ctx context.Context, drivers *sync.WaitGroup, timeout time.Duration) {
	drivers.Wait()
	p.env.verifyEnd(ctx, p.threads, timeout)
	p.closeTabs()
}

// settledRSS leaves the server pid alone for settle, then reads its RSS
// in KiB; NaN when unreadable.
func settledRSS(ctx context.Context, pid int) float64 {
	sleep(ctx, settle)
	v, err := rssKiB(pid)
	if err != nil {
		return nan
	}
	return float64(v)
}

// deliveryLatency is the delta delivery latency over every tab of threads.
func deliveryLatency(threads []*gwThread) Dist {
	var lat []*samples
	for _, th := range threads {
		for _, t := range th.tabs {
			lat = append(lat, &t.lat)
		}
	}
	return summarize(merged(lat...))
}

// startSetUp starts a gateway for the scenario name (see startGateway)
// and sets up threads with tabsPer tabs each on it (see gwPhase.setup).
// On failure it records it in s, finishes what it started and returns
// nil; otherwise the caller finishes the phase.
func (r *runner) startSetUp(
	ctx context.Context,
	s *ScenarioReport,
	name string,
	pace time.Duration,
	workers, threads, tabsPer int,
	notesAll bool,
) *gwPhase {
	p, err := r.startGateway(name, pace, workers)
	if err != nil {
		s.Failure = err.Error()
		return nil
	}
	if err := p.setup(ctx, threads, tabsPer, notesAll); err != nil {
		s.Failure = err.Error()
		p.finish(ctx, s)
		return nil
	}
	return p
}

// dropper drops each of tabs once, at a random moment within window.
func dropper(ctx context.Context, tabs []*gwTab, window time.Duration, rng *rand.Rand) {
	at := make([]time.Duration, len(tabs))
	for i := range at {
		at[i] = time.Duration(rng.Int64N(int64(window)))
	}
	order := make([]int, len(tabs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return int(at[a] - at[b]) })
	began := time.Now()
	for _, i := range order {
		sleep(ctx, at[i]-time.Since(began))
		if ctx.Err() != nil {
			return
		}
		tabs[i].drop()
	}
}

// measureGateway measures the gateway over a window of d while during
// (when not nil) runs: the server's CPU, the events and deltas its tabs
// received, its own metrics before and after, and, when asked (-perf), perf
// and pprof profiles under name. It fills f and returns the window's
// bounds; during's context ends with the window.
func (r *runner) measureGateway(
	ctx context.Context,
	p *gwPhase,
	name string,
	d time.Duration,
	f *fanFigures,
	during func(context.Context),
) (w0, w1 time.Time) {
	var m cpuMeter
	f.prom = &promWindow{before: p.scrape(ctx)}
	p.env.measuring.Store(true)
	d0, x0 := p.counts()
	m.start(p.proc.pid)
	w0 = time.Now()
	perf := r.startPerf(name, p.proc.pid, d)
	prof := p.startPprof(name, d-time.Second)
	var side sync.WaitGroup
	sideCtx, stop := context.WithCancel(ctx)
	if during != nil {
		side.Go(func() { during(sideCtx) })
	}
	sleep(ctx, d)
	m.finish()
	w1 = time.Now()
	d1, x1 := p.counts()
	p.env.measuring.Store(false)
	f.prom.after, f.prom.seconds = p.scrape(ctx), w1.Sub(w0).Seconds()
	stop()
	side.Wait()
	perf.wait(r)
	prof.wait(r)
	f.fill(&m, w1.Sub(w0), d1-d0, x1-x0)
	f.eventsDelivered = d1 - d0
	return w0, w1
}

// fanoutGateway runs FanoutThreads threads with FanoutTabs tabs each; tab
// 0 of every thread keeps a run streaming at Pace; a fraction of the other
// tabs drop once during the window and resubscribe with after_seq.
func (r *runner) fanoutGateway(ctx context.Context, s *ScenarioReport) *fanFigures {
	c := r.cfg
	p := r.startSetUp(ctx, s, "fanout", c.Pace, c.FanoutThreads+16, c.FanoutThreads, c.FanoutTabs, false)
	if p == nil {
		return nil
	}
	defer p.finish(ctx, s)
	f := &fanFigures{offered: float64(c.FanoutThreads*c.FanoutTabs) / c.Pace.Seconds()}
	stopAt := time.Now().Add(c.Warmup + c.Window)
	var drivers sync.WaitGroup
	for _, th := range p.threads {
		drivers.Go(func() { th.driveContinuous(ctx, stopAt, c.Pace) })
	}
	r.logf("fanout: gateway warming up %s", c.Warmup)
	sleep(ctx, c.Warmup)

	var droppable []*gwTab
	for _, t := range p.tabsOf() {
		if t.k != 0 {
			droppable = append(droppable, t)
		}
	}
	rng := rand.New(rand.NewPCG(c.Seed, 1))
	rng.Shuffle(len(droppable), func(i, j int) { droppable[i], droppable[j] = droppable[j], droppable[i] })
	droppable = droppable[:int(math.Round(c.ReconnectFraction*float64(len(droppable))))]

	r.logf("fanout: gateway measuring %s (%d tabs drop and resubscribe)", c.Window, len(droppable))
	w0, w1 := r.measureGateway(
		ctx,
		p,
		"fanout-gateway",
		c.Window,
		f,
		func(ctx context.Context) { dropper(ctx, droppable, c.Window, rng) },
	)

	p.endDrivers(ctx, &drivers, 5*time.Second)
	var lat, spread, publish []*samples
	var produced, bytes int64
	for _, th := range p.threads {
		produced += th.deltasProduced.Load()
		bytes += th.deltaBytes.Load()
		for _, t := range th.tabs {
			lat, spread, publish = append(lat, &t.lat), append(spread, &t.spreadUs), append(publish, &t.publishUs)
			f.reconnects += t.reconnects.Load()
			f.resyncs += t.resyncs.Load()
			f.replayed += t.replayed.Load()
		}
	}
	f.lat, f.spread, f.publish = summarize(merged(lat...)), summarize(merged(spread...)), summarize(merged(publish...))
	if produced > 0 {
		f.deltaRate = float64(produced) / f.window / float64(len(p.threads))
		f.deltaSize = float64(bytes) / float64(produced)
	}
	p.finish(ctx, s)
	f.readStore(ctx, p.db, w0, w1)
	f.serverPublish = summarize(storeGaps(ctx, &s.Notes, "publish", publishGaps, p.db, w0, w1))
	return f
}

// fanoutFloor drives the floor with the gateway's shape: as many topics
// and subscribers, one publisher per topic at the gateway's measured delta
// rate per thread, messages of the gateway's mean delta size.
func (r *runner) fanoutFloor(ctx context.Context, s *ScenarioReport) *fanFigures {
	c := r.cfg
	interval := c.Pace
	if r.gwDeltaRate > 0 {
		interval = time.Duration(float64(time.Second) / r.gwDeltaRate)
	}
	size := r.gwDeltaSize
	if size <= 0 {
		size = 200
	}
	p, err := r.startFloor("fanout")
	if err != nil {
		s.Failure = err.Error()
		return nil
	}
	defer p.finish(s)
	if err := p.setup(ctx, c.FanoutThreads, c.FanoutTabs); err != nil {
		s.Failure = err.Error()
		return nil
	}
	f := &fanFigures{offered: float64(c.FanoutThreads*c.FanoutTabs) * float64(time.Second) / float64(interval)}
	stopAt := time.Now().Add(c.Warmup + c.Window)
	maxMessages := int64((c.Warmup+c.Window)/interval) + 1
	var pubs sync.WaitGroup
	for i, t := range p.topics {
		offset := interval * time.Duration(i) / time.Duration(len(p.topics))
		pubs.Go(func() { t.publish(ctx, offset, interval, size, stopAt, maxMessages) })
	}
	r.logf(
		"fanout: floor publishing every %s per topic, %d-byte messages; warming up %s",
		interval.Round(time.Microsecond), size, c.Warmup,
	)
	sleep(ctx, c.Warmup)
	r.logf("fanout: floor measuring %s", c.Window)
	var m cpuMeter
	p.env.measuring.Store(true)
	d0 := p.deliveries()
	m.start(p.proc.pid)
	w0 := time.Now()
	perf := r.startPerf("fanout-floor", p.proc.pid, c.Window)
	sleep(ctx, c.Window)
	m.finish()
	w1 := time.Now()
	d1 := p.deliveries()
	p.env.measuring.Store(false)
	perf.wait(r)
	f.fill(&m, w1.Sub(w0), d1-d0, d1-d0)
	pubs.Wait()

	// every subscriber must get every message
	deadline := time.Now().Add(5 * time.Second)
	for range 100_000 {
		behind := 0
		for _, t := range p.topics {
			for _, sub := range t.subs {
				if sub.lastSeqA.Load() < t.final.Load() {
					behind++
				}
			}
		}
		if behind == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, t := range p.topics {
		for _, sub := range t.subs {
			if got := sub.lastSeqA.Load(); got < t.final.Load() {
				p.env.errs.add("missing_messages_at_end", fmt.Sprintf("%s at %d of %d", sub.name, got, t.final.Load()))
			}
		}
	}
	p.closeSubs()
	var lat, spread []*samples
	var published int64
	for _, t := range p.topics {
		published += t.published.Load()
		for _, sub := range t.subs {
			lat, spread = append(lat, &sub.lat), append(spread, &sub.spreadUs)
		}
	}
	f.lat, f.spread = summarize(merged(lat...)), summarize(merged(spread...))
	f.published = float64(published) / f.window
	p.finish(s)
	return f
}

func (r *runner) fanout(ctx context.Context) (s ScenarioReport) {
	c := r.cfg
	s.Shape = fmt.Sprintf(
		"%d threads × %d tabs, one run streaming per thread at %s a word, %s measured after %s warm-up, "+
			"%.0f%% of tabs reconnect once",
		c.FanoutThreads, c.FanoutTabs, c.Pace, c.Window, c.Warmup, 100*c.ReconnectFraction,
	)
	gw := r.fanoutGateway(ctx, &s)
	if gw != nil && gw.deltaRate > 0 {
		r.gwDeltaRate, r.gwDeltaSize = gw.deltaRate, int(math.Round(gw.deltaSize))
	}
	fl := r.fanoutFloor(ctx, &s)
	if gw == nil {
		gw = &fanFigures{}
		*gw = nanFigures()
	}
	if fl == nil {
		fl = &fanFigures{}
		*fl = nanFigures()
	}
	s.Metrics = []Metric{
		compared("deliveries/s, deltas", "1/s", gw.deltas, fl.deltas, "50,000 at p99 ≤ 25 ms"),
		compared("deliveries/s offered by the shape", "1/s", gw.offered, fl.offered, ""),
		compared("server CPU per delivered delta", "µs", gw.cpuPerDelta, fl.cpuPerDelta, "≤ 1.3× floor"),
		compared("delta delivery latency p50", "ms", gw.lat.P50, fl.lat.P50, ""),
		compared("delta delivery latency p99", "ms", gw.lat.P99, fl.lat.P99, "≤ 25 ms"),
		compared("fan-out spread p50", "ms", gw.spread.P50, fl.spread.P50, ""),
		compared("fan-out spread p99", "ms", gw.spread.P99, fl.spread.P99, ""),
		compared("server CPU", "cores", gw.serverCores, fl.serverCores, ""),
		compared("generator CPU", "cores", gw.genCores, fl.genCores, ""),
		compared("machine busy", "%", 100*gw.machineBusy, 100*fl.machineBusy, ""),
		compared("CPU of other processes", "cores", gw.otherCores, fl.otherCores, ""),
		compared("deltas per thread", "1/s", gw.deltaRate, fl.published/float64(c.FanoutThreads), ""),
		metric("all events delivered", "1/s", gw.deliveries, ""),
		metric("publish latency p50 (last delta → message.published)", "ms", gw.publish.P50, ""),
		metric("publish latency p99 (last delta → message.published)", "ms", gw.publish.P99, "≤ 10 ms"),
		metric("server: last delta → publish tx p50 (store ts)", "ms", gw.serverPublish.P50, ""),
		metric("server: last delta → publish tx p99 (store ts)", "ms", gw.serverPublish.P99, ""),
		metric("reconnects (after_seq)", "count", float64(gw.reconnects), ""),
		metric("snapshot resyncs", "count", float64(gw.resyncs), ""),
		metric("replayed events", "count", float64(gw.replayed), ""),
	}
	s.Metrics = append(s.Metrics, storeMetrics(gw, &s)...)
	s.Metrics = append(s.Metrics, serverMetrics(gw, &s)...)
	return s
}

// cancel: CancelRuns threads with CancelTabs tabs each; every thread
// keeps a run streaming and cancels it at a random moment from a random
// tab of the thread, then starts the next, until the window ends.
func (r *runner) cancel(ctx context.Context) (s ScenarioReport) {
	c := r.cfg
	maxDelay := c.cancelMaxDelay()
	s.Shape = fmt.Sprintf(
		"%d concurrent runs at %s a word, %d tabs each; each run cancelled at a random moment "+
			"(0–%s after its first delta) from a random tab, then the next started; %s measured after %s warm-up",
		c.CancelRuns, c.Pace, c.CancelTabs, maxDelay, c.CancelWindow, c.Warmup,
	)
	p := r.startSetUp(ctx, &s, "cancel", c.Pace, c.CancelRuns+16, c.CancelRuns, c.CancelTabs, true)
	if p == nil {
		return s
	}
	defer p.finish(ctx, &s)
	stats := make([]cancelStats, len(p.threads))
	stopAt := time.Now().Add(c.Warmup + c.CancelWindow)
	var drivers sync.WaitGroup
	for i, th := range p.threads {
		rng := rand.New(rand.NewPCG(c.Seed, uint64(1000+i)))
		drivers.Go(func() { th.driveCancels(ctx, stopAt, maxDelay, c.Pace, rng, anyTab(th, rng), &stats[i]) })
	}
	sleep(ctx, c.Warmup)
	r.logf("cancel: measuring %s", c.CancelWindow)
	var f fanFigures
	w0, w1 := r.measureGateway(ctx, p, "cancel-gateway", c.CancelWindow, &f, nil)
	pw := f.prom
	p.endDrivers(ctx, &drivers, 5*time.Second)

	ct, l := mergeCancels(stats), deliveryLatency(p.threads)
	p.finish(ctx, &s)
	st := f.readStore(ctx, p.db, w0, w1)
	g := summarize(storeGaps(ctx, &s.Notes, "cancel", cancelGaps, p.db, w0, w1))
	fd := summarize(storeGaps(ctx, &s.Notes, "first-delta", firstDeltaGaps, p.db, w0, w1))
	target := fmt.Sprintf("≤ %s", (c.Pace + 10*time.Millisecond))
	s.Metrics = slices.Concat(cancelMetrics(ct, pw, g, target, ""), []Metric{
		metric("server: run.started → first delta p50 (store ts)", "ms", fd.P50, ""),
		metric("server: run.started → first delta p99 (store ts)", "ms", fd.P99, ""),
		metric("cancels measured", "count", float64(ct.ack.N), ""),
		metric("cancels sent (warm-up included)", "count", float64(ct.sent), ""),
		metric("runs completed before their cancel", "count", float64(ct.missed), ""),
	}, cancelLoadMetrics(&f, st, l, c.Pace, ""), cpuMetrics(&f), storeMetrics(&f, &s), serverMetrics(&f, &s))
	return s
}

// storage: StorageRuns threads, one tab each, runs streaming back to back
// at StoragePace; the deltas the store committed in the window are counted
// in its database afterwards.
func (r *runner) storage(ctx context.Context) (s ScenarioReport) {
	c := r.cfg
	s.Shape = fmt.Sprintf("%d runs streaming back to back at %s a word, one tab each, %s measured after %s warm-up",
		c.StorageRuns, c.StoragePace, c.StorageWindow, c.Warmup)
	p := r.startSetUp(ctx, &s, "storage", c.StoragePace, c.StorageRuns+16, c.StorageRuns, 1, false)
	if p == nil {
		return s
	}
	defer p.finish(ctx, &s)
	stopAt := time.Now().Add(c.Warmup + c.StorageWindow)
	var drivers sync.WaitGroup
	for _, th := range p.threads {
		drivers.Go(func() { th.driveContinuous(ctx, stopAt, c.StoragePace) })
	}
	sleep(ctx, c.Warmup)
	r.logf("storage: measuring %s", c.StorageWindow)
	var f fanFigures
	w0, w1 := r.measureGateway(ctx, p, "storage-gateway", c.StorageWindow, &f, nil)
	p.endDrivers(ctx, &drivers, 5*time.Second)
	var publish []*samples
	for _, t := range p.tabsOf() {
		publish = append(publish, &t.publishUs)
	}
	pub, l := summarize(merged(publish...)), deliveryLatency(p.threads)
	p.finish(ctx, &s)
	st, err := readStoreStats(ctx, p.db, w0.UnixMilli(), w1.UnixMilli())
	if err != nil {
		s.Notes = append(s.Notes, "store figures unavailable: "+err.Error())
	}
	cpuPerCommitted, bytesPerCommitted := nan, nan
	if st.Deltas > 0 && f.cpuOK {
		cpuPerCommitted = float64(f.serverMicros) / float64(st.Deltas)
	}
	if st.Deltas > 0 && f.ioOK {
		bytesPerCommitted = float64(f.writtenBytes) / float64(st.Deltas)
	}
	f.store = &st
	f.storeErr = err
	sp := summarize(storeGaps(ctx, &s.Notes, "publish", publishGaps, p.db, w0, w1))
	fd := summarize(storeGaps(ctx, &s.Notes, "first-delta", firstDeltaGaps, p.db, w0, w1))
	s.Metrics = append([]Metric{
		metric("deltas buffered (committed)", "1/s", float64(st.Deltas)/f.window, "≥ 30,000"),
		metric("publish latency p50 (last delta → message.published)", "ms", pub.P50, ""),
		metric("publish latency p99 (last delta → message.published)", "ms", pub.P99, "≤ 10 ms"),
		metric("server: last delta → publish tx p50 (store ts)", "ms", sp.P50, ""),
		metric("server: last delta → publish tx p99 (store ts)", "ms", sp.P99, ""),
		metric("publishes measured", "count", float64(pub.N), ""),
		metric("server: run.started → first delta p50 (store ts)", "ms", fd.P50, ""),
		metric("server: run.started → first delta p99 (store ts)", "ms", fd.P99, ""),
		metric("server CPU per committed delta", "µs", cpuPerCommitted, "≤ 10 µs"),
		metric("bytes written to storage per committed delta (/proc/PID/io)", "B", bytesPerCommitted, "≤ 300"),
		metric("bytes written to storage", "MiB/s", float64(f.writtenBytes)/f.window/(1<<20), ""),
		metric("delta delivery latency p99", "ms", l.P99, ""),
	}, cpuMetrics(&f)...)
	if more := storeMetrics(&f, &s); len(more) > 1 {
		s.Metrics = append(s.Metrics, more[1:]...) // the first is the deltas/s above
	}
	s.Metrics = append(s.Metrics, serverMetrics(&f, &s)...)
	return s
}

// scale: the many-streams shape of issue 18, with admission (issue 31).
// ScaleRuns threads with ScaleTabs tabs each keep one run streaming at
// ScalePace; every ScaleCancelEvery-th thread cancels its runs at random
// moments from a random tab (as cancel does), the others let them finish
// and start the next (as storage does). The gateway runs with
// ScaleCapacity workers (0: its default), so runs beyond its capacity
// wait queued. It measures how much of the offered delivery rate arrives,
// at what CPU, and what the cancels and first deltas cost under that
// load; then the same for admitted and queued runs apart, and the cancels
// by whether they found their run waiting or streaming.
func (r *runner) scale(ctx context.Context) (s ScenarioReport) {
	c := r.cfg
	maxDelay := 60 * c.ScalePace
	cancellers := (c.ScaleRuns + c.ScaleCancelEvery - 1) / c.ScaleCancelEvery
	capacity := "the gateway's default capacity"
	if c.ScaleCapacity > 0 {
		capacity = fmt.Sprintf("capacity %d (-workers)", c.ScaleCapacity)
	}
	s.Shape = fmt.Sprintf(
		"%d concurrent runs at %s a word, %d tabs each (%.0f deliveries/s offered), %s; "+
			"%d of the threads cancel each run at a random moment (0–%s after its first delta, or, "+
			"for half of the queued runs, after its ack) from a random tab, the others stream back to back; "+
			"%s measured after %s warm-up",
		c.ScaleRuns, c.ScalePace, c.ScaleTabs, float64(c.ScaleRuns*c.ScaleTabs)/c.ScalePace.Seconds(), capacity,
		cancellers, maxDelay, c.ScaleWindow, c.Warmup,
	)
	p, err := r.startGateway("scale", c.ScalePace, c.ScaleCapacity)
	if err != nil {
		s.Failure = err.Error()
		return s
	}
	defer p.finish(ctx, &s)
	// before any tab exists: the tabs read these
	p.env.admission = true
	p.env.queueAllowance = c.Warmup + c.ScaleWindow
	if err := p.setup(ctx, c.ScaleRuns, c.ScaleTabs, true); err != nil {
		s.Failure = err.Error()
		return s
	}
	f := fanFigures{offered: float64(c.ScaleRuns*c.ScaleTabs) / c.ScalePace.Seconds()}
	stats := make([]cancelStats, len(p.threads))
	stopAt := time.Now().Add(c.Warmup + c.ScaleWindow)
	var drivers sync.WaitGroup
	for i, th := range p.threads {
		if i%c.ScaleCancelEvery != 0 {
			drivers.Go(func() { th.driveContinuous(ctx, stopAt, c.ScalePace) })
			continue
		}
		rng := rand.New(rand.NewPCG(c.Seed, uint64(5000+i)))
		drivers.Go(func() { th.driveCancels(ctx, stopAt, maxDelay, c.ScalePace, rng, anyTab(th, rng), &stats[i]) })
	}
	r.logf("scale: warming up %s", c.Warmup)
	sleep(ctx, c.Warmup)
	r.logf("scale: measuring %s", c.ScaleWindow)
	var gauges map[string][]float64 // the admission gauges, scraped through the window
	w0, w1 := r.measureGateway(ctx, p, "scale-gateway", c.ScaleWindow, &f, func(ctx context.Context) {
		gauges = p.sampleGauges(ctx, gaugeEvery, promRunsWaiting, promRunsExecuting)
	})
	pw := f.prom
	p.endDrivers(ctx, &drivers, 10*time.Second)

	ct, l := mergeCancels(stats), deliveryLatency(p.threads)
	adm := make([]admissionStats, len(p.threads))
	var classes [2][]*deltaClass
	for i, th := range p.threads {
		adm[i] = th.adm
		for _, t := range th.tabs {
			classes[classAdmitted] = append(classes[classAdmitted], &t.classes[classAdmitted])
			classes[classQueued] = append(classes[classQueued], &t.classes[classQueued])
		}
	}
	at := mergeAdmission(adm)
	dAdm, dQ := mergeDeltaClass(classes[classAdmitted]), mergeDeltaClass(classes[classQueued])
	p.finish(ctx, &s)
	st := f.readStore(ctx, p.db, w0, w1)
	g := summarize(storeGaps(ctx, &s.Notes, "cancel", cancelGaps, p.db, w0, w1))
	byRun, err := firstDeltaRuns(ctx, p.db, w0.UnixMilli(), w1.UnixMilli())
	if err != nil {
		s.Notes = append(s.Notes, "server-side first-delta figures unavailable: "+err.Error())
	}
	all := make([]int32, 0, len(byRun))
	for _, x := range byRun {
		all = append(all, x.us)
	}
	fd := summarize(all)
	queued := p.queuedRuns()
	fdAdm, fdQ := splitGaps(byRun, func(runID string) bool { return queued[runID] })
	delivered := nan
	if f.offered > 0 {
		delivered = 100 * f.deltas / f.offered
	}
	s.Notes = append(
		s.Notes,
		"delivered is delta deliveries against the offer of every thread streaming all the time; "+
			"a cancelling thread is idle between its cancel and its next run's first delta, "+
			"and with admission a run waits queued without streaming, "+
			"so the offer is more than the shape can ask for",
		"admitted: runs whose run.start ack carried no queue_position; queued: "+
			"runs whose ack carried one. Run counts, first deltas and waits are of the runs acked in the window; "+
			"delta figures are of the deltas received in the window, "+
			"whenever their run was acked (runs admitted in the warm-up stream into the window); "+
			"a run queued near the window's end that was cancelled before it started (by its thread, "+
			"or when the phase stopped) has no wait figure and is counted as cancelled before it "+
			"started",
	)
	firstTarget := fmt.Sprintf("≤ %s", c.ScalePace+20*time.Millisecond)
	s.Metrics = slices.Concat(
		[]Metric{
			metric("deliveries/s offered by the shape", "1/s", f.offered, ""),
			metric("deliveries/s, deltas", "1/s", f.deltas, ""),
			metric("delivered of the offer", "%", delivered, "≥ 95 %"),
			metric("server CPU per delivered delta", "µs", f.cpuPerDelta, "≤ 20 µs"),
			metric("server: run.started → first delta p50 (store ts)", "ms", fd.P50, ""),
			metric("server: run.started → first delta p99 (store ts)", "ms", fd.P99, firstTarget),
		},
		cancelLatencyMetrics(ct, "≤ 5 ms", "≤ 15 ms"),
		[]Metric{
			metric(
				"server metric: cancel ack p99 (bucket bound)",
				"ms",
				1000*pw.quantileBound(promCancelAck, `transport="websocket"`, 0.99),
				"",
			),
			metric("server: cancel_requested → cancelled p99 (store ts)", "ms", g.P99, ""),
			metric("server metric: cancels acked from the cancel journal", "count", pw.delta(promJournaled), ""),
			metric("cancels measured", "count", float64(ct.ack.N), ""),
			metric("cancels sent (warm-up included)", "count", float64(ct.sent), ""),
			metric("delta delivery latency p50", "ms", l.P50, ""),
			metric("delta delivery latency p99", "ms", l.P99, ""),
		},
		admissionMetrics(at, dAdm, dQ, summarize(fdAdm), summarize(fdQ), c.ScalePace),
		waitCancelMetrics(ct),
		[]Metric{
			metric(
				"runs streaming at once (deltas committed/s × pace)",
				"runs",
				f.runsStreaming(st.Deltas, c.ScalePace),
				"",
			),
		},
		capacityMetrics(pw, gauges),
		cpuMetrics(&f),
		storeMetrics(&f, &s),
		serverMetrics(&f, &s),
	)
	return s
}

// queuedRuns is the set of runs whose run.start ack carried a
// queue_position, over every thread of the phase.
func (p *gwPhase) queuedRuns() map[string]bool {
	out := map[string]bool{}
	for _, th := range p.threads {
		th.queued.Range(func(k, _ any) bool {
			out[k.(string)] = true
			return true
		})
	}
	return out
}
