package loadgen

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// clusterIDs are the -instance-id of the cluster scenario's two gateways.
var clusterIDs = []string{"gwA", "gwB"}

// schemaDSN is base with search_path set to schema, so that everything
// the gateway creates lands in that schema.
func schemaDSN(base, schema string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// newSchema creates a fresh schema in the PostgreSQL database base names
// and returns its DSN and a function that drops it with everything in it.
func newSchema(ctx context.Context, base string) (dsn, schema string, drop func() error, err error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", nil, err
	}
	schema = "bench_cluster_" + hex.EncodeToString(b[:])
	if dsn, err = schemaDSN(base, schema); err != nil {
		return "", "", nil, err
	}
	admin, err := sql.Open("pgx", base)
	if err != nil {
		return "", "", nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(cctx, `CREATE SCHEMA `+schema); err != nil {
		admin.Close()
		return "", "", nil, fmt.Errorf(
			"create schema %s in %s: %w (is PostgreSQL running, and may this user create schemas?)",
			schema, redactDB(base), err,
		)
	}
	drop = func() error {
		defer admin.Close()
		// Even when the run was interrupted: the schema must not outlive it.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, err := admin.ExecContext(dctx, `DROP SCHEMA `+schema+` CASCADE`)
		return err
	}
	return dsn, schema, drop, nil
}

// ownerInstance is the index in ids of the instance whose process holds
// a lease named owner ("<instance-id>.<process>"); -1 for none.
func ownerInstance(owner string, ids []string) int {
	for i, id := range ids {
		if strings.HasPrefix(owner, id+".") {
			return i
		}
	}
	return -1
}

// tabsOn lists the indexes of th's tabs connected to instance inst (or,
// when other, to any other instance).
func tabsOn(th *gwThread, inst int, other bool) []int {
	var out []int
	for k, t := range th.tabs {
		if (t.inst == inst) != other {
			out = append(out, k)
		}
	}
	return out
}

// clusterPhase is the cluster scenario's two gateway processes on one
// PostgreSQL schema, with the threads and tabs spread over them.
type clusterPhase struct {
	r       *runner
	procs   []*process
	dsn     string
	env     *gwEnv
	threads []*gwThread
	leases  *sql.DB // reads runs.lease_owner before each cancel

	stopTabs context.CancelFunc
	tabs     sync.WaitGroup
	closed   bool

	// cancels measured, by the instance executing the run
	byOwner [2]atomic.Int64
}

// startCluster starts one gateway per clusterIDs on dsn and natsURL.
func (r *runner) startCluster(dsn string, pace time.Duration, workers int) (*clusterPhase, error) {
	p := &clusterPhase{r: r, dsn: dsn}
	for _, id := range clusterIDs {
		args := []string{"-addr", "127.0.0.1:0", "-db", dsn, "-nats", r.cfg.NATS, "-instance-id", id,
			"-demo-pace", pace.String(), "-workers", strconv.Itoa(workers), "-auth", r.cfg.Auth,
			"-max-conns-per-user", "100000", "-max-subscriptions-per-user", "100000", "-user-command-rate", "100000"}
		if r.cfg.Auth == "header" {
			args = append(args, "-trusted-proxies", "127.0.0.1")
		}
		if r.admin {
			args = append(args, "-admin-addr", "127.0.0.1:0")
		}
		proc, err := startProcess("gateway "+id, r.gateway, args, 60*time.Second)
		if err != nil {
			p.stopProcs()
			return nil, err
		}
		p.procs = append(p.procs, proc)
		r.logf("cluster: gateway %s pid %d at %s (pace %s, %d workers)", id, proc.pid, proc.addr, pace, workers)
	}
	p.env = newGWEnv(p.procs[0].addr, r.cfg.Auth, "cluster")
	p.env.bases = []string{p.procs[0].addr, p.procs[1].addr}
	var err error
	if p.leases, err = openRead(dsn); err != nil {
		p.stopProcs()
		return nil, err
	}
	return p, nil
}

// stopProcs stops every process started so far; the errors, joined.
func (p *clusterPhase) stopProcs() error {
	var errs []error
	for _, proc := range p.procs {
		if err := proc.stop(20 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *clusterPhase) pids() []int {
	var out []int
	for _, proc := range p.procs {
		out = append(out, proc.pid)
	}
	return out
}

func (p *clusterPhase) setup(ctx context.Context, threads, tabsPer int) error {
	var err error
	if p.threads, err = p.env.createThreads(ctx, threads); err != nil {
		return err
	}
	tabsCtx, stop := context.WithCancel(ctx)
	p.stopTabs = stop
	began := time.Now()
	if err := p.env.connect(tabsCtx, p.threads, tabsPer, true, &p.tabs, 60*time.Second); err != nil {
		return err
	}
	p.r.logf(
		"cluster: %d tabs over %d threads and 2 instances subscribed in %.1fs",
		threads*tabsPer, threads, time.Since(began).Seconds(),
	)
	return nil
}

func (p *clusterPhase) closeTabs() {
	if p.stopTabs != nil {
		p.stopTabs()
	}
	p.tabs.Wait()
}

func (p *clusterPhase) counts() (deliveries, deltas int64) {
	for _, th := range p.threads {
		for _, t := range th.tabs {
			deliveries += t.deliveries.Load()
			deltas += t.deltas.Load()
		}
	}
	return
}

// scrape sums both gateways' metrics (counters and histogram buckets
// add up); nil when either has none.
func (p *clusterPhase) scrape(ctx context.Context) promSample {
	sum := promSample{}
	for _, proc := range p.procs {
		admin := proc.adminURL()
		if admin == "" {
			return nil
		}
		s, err := scrape(ctx, admin+"/metrics")
		if err != nil {
			p.r.logf("cluster: metrics of %s: %v", proc.name, err)
			return nil
		}
		for k, v := range s {
			sum[k] += v
		}
	}
	return sum
}

// leaseOwner reads the run's lease owner; "" when none or unreadable.
func (p *clusterPhase) leaseOwner(ctx context.Context, runID string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var owner sql.NullString
	if err := p.leases.QueryRowContext(ctx, `SELECT lease_owner FROM runs WHERE run_id = $1`,
		runID).Scan(&owner); err != nil {
		if ctx.Err() == nil {
			p.env.errs.add("lease_read", err.Error())
		}
		return ""
	}
	return owner.String
}

// deadlocks is PostgreSQL's count of deadlocks detected in the database
// so far (pg_stat_database: every user of the database, not only this
// scenario's schema); -1 when unreadable.
func (p *clusterPhase) deadlocks(ctx context.Context) int64 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int64
	if err := p.leases.QueryRowContext(ctx, `SELECT deadlocks FROM pg_stat_database
		WHERE datname = current_database()`).Scan(&n); err != nil {
		return -1
	}
	return n
}

// pick chooses the cancelling tab of th: one on the instance that does
// not hold the run's lease (toOwner false) or on the one that does. A run
// whose owner is unknown (between leases) is cancelled from any tab and
// not sampled.
func (p *clusterPhase) pick(th *gwThread, rng *mrand.Rand, toOwner bool) cancelTab {
	return func(ctx context.Context, runID string) (int, bool) {
		inst := ownerInstance(p.leaseOwner(ctx, runID), clusterIDs)
		if inst < 0 {
			return rng.IntN(len(th.tabs)), false
		}
		cands := tabsOn(th, inst, !toOwner)
		if len(cands) == 0 {
			return rng.IntN(len(th.tabs)), false
		}
		if th.env.measuring.Load() {
			p.byOwner[inst].Add(1)
		}
		return cands[rng.IntN(len(cands))], true
	}
}

// finish closes the tabs, stops both gateways, and audits the shared
// database; safe to call twice. The schema is dropped by the caller,
// after its figures are read.
func (p *clusterPhase) finish(ctx context.Context, s *ScenarioReport) {
	if p.closed {
		return
	}
	p.closed = true
	p.closeTabs()
	if p.leases != nil {
		p.leases.Close()
	}
	if err := p.stopProcs(); err != nil {
		p.env.errs.add("gateway_exit", err.Error())
	}
	for _, proc := range p.procs {
		e, w := proc.logCounts()
		s.ServerLog.Errors += e
		s.ServerLog.Warnings += w
		if e > 0 {
			s.Notes = append(s.Notes, proc.name+" log tail:\n"+proc.logTail())
		}
	}
	c := runCheck(ctx, p.r.gateway, p.dsn)
	s.Check = &c
	p.r.logf("cluster: gateway check: ok=%v", c.OK)
	s.GatewayErrors = p.env.errs.list()
}

// cluster: ClusterRuns threads with ClusterTabs tabs each, the tabs
// alternating over two gateways that share one PostgreSQL schema and
// NATS; every thread keeps a run streaming and cancels it at a random
// moment from a tab on the instance that does NOT hold the run's lease
// (ClusterCancelTo "other"), then starts the next, until the window ends.
func (r *runner) cluster(ctx context.Context) (s ScenarioReport) {
	c := r.cfg
	maxDelay := c.cancelMaxDelay()
	toOwner := c.ClusterCancelTo == "owner"
	where := "a tab on the instance NOT holding the run's lease"
	if toOwner {
		where = "a tab on the instance holding the run's lease"
	}
	s.Shape = fmt.Sprintf(
		"%d concurrent runs at %s a word on 2 instances (%s; one PostgreSQL schema, NATS), "+
			"%d tabs each alternating over them; each run cancelled at a random moment (0–%s after its first delta) "+
			"from %s, then the next started; %s measured after %s warm-up",
		c.ClusterRuns, c.Pace, strings.Join(clusterIDs, ", "), c.ClusterTabs, maxDelay, where, c.ClusterWindow,
		c.Warmup,
	)
	dsn, schema, drop, err := newSchema(ctx, c.Postgres)
	if err != nil {
		s.Failure = err.Error()
		return s
	}
	r.logf("cluster: schema %s", schema)
	defer func() {
		if err := drop(); err != nil {
			s.Failure = strings.TrimSpace(s.Failure + "; drop schema " + schema + ": " + err.Error())
			return
		}
		r.logf("cluster: schema %s dropped", schema)
	}()
	p, err := r.startCluster(dsn, c.Pace, c.ClusterRuns+16)
	if err != nil {
		s.Failure = err.Error()
		return s
	}
	defer p.finish(ctx, &s)
	if err := p.setup(ctx, c.ClusterRuns, c.ClusterTabs); err != nil {
		s.Failure = err.Error()
		return s
	}
	stats := make([]cancelStats, len(p.threads))
	dl0 := p.deadlocks(ctx)
	stopAt := time.Now().Add(c.Warmup + c.ClusterWindow)
	var drivers sync.WaitGroup
	for i, th := range p.threads {
		rng := mrand.New(mrand.NewPCG(c.Seed, uint64(3000+i)))
		drivers.Go(func() { th.driveCancels(ctx, stopAt, maxDelay, c.Pace, rng, p.pick(th, rng, toOwner), &stats[i]) })
	}
	sleep(ctx, c.Warmup)
	r.logf("cluster: measuring %s", c.ClusterWindow)
	var m cpuMeter
	pw := &promWindow{before: p.scrape(ctx)}
	p.env.measuring.Store(true)
	d0, x0 := p.counts()
	infra0 := commCPU("postgres", "nats-server")
	m.start(p.pids()...)
	w0 := time.Now()
	var profiles []*pprofFetch
	for i, proc := range p.procs {
		profiles = append(profiles, r.startPprof(proc, fmt.Sprintf("cluster-instance%d", i+1), c.ClusterWindow))
	}
	sleep(ctx, c.ClusterWindow)
	m.finish()
	for _, f := range profiles {
		f.wait(r)
	}
	infra1 := commCPU("postgres", "nats-server")
	w1 := time.Now()
	d1, x1 := p.counts()
	p.env.measuring.Store(false)
	pw.after, pw.seconds = p.scrape(ctx), w1.Sub(w0).Seconds()
	drivers.Wait()
	p.env.verifyEnd(ctx, p.threads, 5*time.Second)
	p.closeTabs()
	// PostgreSQL reports a backend's counts within a second or so.
	sleep(ctx, 1500*time.Millisecond)
	deadlocks := nan
	if dl1 := p.deadlocks(ctx); dl0 >= 0 && dl1 >= 0 {
		deadlocks = float64(dl1 - dl0)
	}

	var f fanFigures
	f.fill(&m, w1.Sub(w0), d1-d0, x1-x0)
	f.prom, f.eventsDelivered = pw, d1-d0
	infraCores := float64(commCPUDelta(infra0, infra1)) / (f.window * 1e6)
	f.otherCores = max(0, f.otherCores-infraCores)
	ct, l := mergeCancels(stats), deliveryLatency(p.threads)
	p.finish(ctx, &s)
	st := f.readStore(ctx, dsn, w0, w1)
	gaps := storeGaps(ctx, &s.Notes, "cancel", cancelGaps, dsn, w0, w1)
	slow := 0
	for _, g := range gaps {
		if g > 500_000 {
			slow++
		}
	}
	g := summarize(gaps)
	fd := summarize(storeGaps(ctx, &s.Notes, "first-delta", firstDeltaGaps, dsn, w0, w1))
	target := fmt.Sprintf("≤ %s", (c.Pace + 10*time.Millisecond))
	dir := "cancels measured, run on %s, cancel sent to %s"
	other := func(i int) int {
		if toOwner {
			return i
		}
		return 1 - i
	}
	s.Metrics = slices.Concat(cancelMetrics(ct, pw, g, target, "both instances"), []Metric{
		metric("server: cancel_requested → cancelled max (store ts)", "ms", g.Max, ""),
		metric("server: cancel_requested → cancelled over 500 ms (store ts)", "count", float64(slow), ""),
		metric("server: run.started → first delta p50 (store ts)", "ms", fd.P50, ""),
		metric("server: run.started → first delta p99 (store ts)", "ms", fd.P99, ""),
		metric("PostgreSQL deadlocks detected (whole database, warm-up to end)", "count", deadlocks, ""),
		metric(
			"server metric: threads handed to the other instance before it wrote them (yields)",
			"count",
			pw.delta("gateway_stream_yields_total"),
			"",
		),
		metric(
			"server metric: yield requests unanswered in time",
			"count",
			pw.delta("gateway_stream_yields_unanswered_total"),
			"0",
		),
		metric(
			"server metric: reservations written past (recorded lost)",
			"count",
			pw.delta("gateway_stream_written_past_total"),
			"0",
		),
		metric(
			"server metric: deltas fanned out, then dropped as lost",
			"count",
			pw.delta("gateway_stream_deltas_lost_total"),
			"0",
		),
		metric("cancels measured", "count", float64(ct.ack.N), ""),
		metric(fmt.Sprintf(dir, clusterIDs[0], clusterIDs[other(0)]), "count", float64(p.byOwner[0].Load()), ""),
		metric(fmt.Sprintf(dir, clusterIDs[1], clusterIDs[other(1)]), "count", float64(p.byOwner[1].Load()), ""),
		metric("cancels sent (warm-up included)", "count", float64(ct.sent), ""),
		metric("cancels not measured: no lease owner when read", "count", float64(ct.unsampled), ""),
		metric("runs completed before their cancel", "count", float64(ct.missed), ""),
	}, cancelLoadMetrics(&f, st, l, c.Pace, "both instances"), []Metric{
		metric("server CPU (both instances)", "cores", f.serverCores, ""),
		metric("PostgreSQL + NATS CPU (all their processes)", "cores", infraCores, ""),
		metric("generator CPU", "cores", f.genCores, ""),
		metric("machine busy", "%", 100*f.machineBusy, ""),
		metric("CPU of other processes", "cores", f.otherCores, ""),
	}, singleNodeFigures(r.cancelReport), storeMetrics(&f, &s), serverMetrics(&f, &s))
	return s
}

// singleNodeFigures copies the cancel scenario's headline figures (same
// invocation, one instance on SQLite) next to the cluster's.
func singleNodeFigures(cancel *ScenarioReport) []Metric {
	if cancel == nil || cancel.Failure != "" {
		return nil
	}
	var out []Metric
	for _, name := range []string{"cancel ack p50", "cancel ack p99", "cancel → run.cancelled p50", "cancel → " +
		"run.cancelled p99",
		"cancel → run.cancelled max", "server: cancel_requested → cancelled p50 (store ts)", "server: " +
			"cancel_requested → cancelled p99 (store ts)",
		"CPU of other processes"} {
		for _, m := range cancel.Metrics {
			if m.Name == name {
				m.Name = "single-node (cancel scenario, this run): " + name
				m.Target = ""
				out = append(out, m)
			}
		}
	}
	return out
}
