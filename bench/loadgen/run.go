// Package loadgen is the gateway's load generator. It builds and starts the
// real gateway binary and the bare-library floor (bench/floor), drives both
// over real WebSocket connections on 127.0.0.1 with the same fan-out shape,
// and reports each figure with its ratio to the floor. See BENCHMARKS.md.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Config is one invocation's shape. Zero values are not defaults: the
// command fills every field from its flags.
type Config struct {
	Repo      string   // module root: where `go build` runs
	Scenarios []string // idle, fanout, cancel, storage, scale, long, cluster
	Auth      string   // header: a user per thread; none: one user for all

	Pace   time.Duration // demo model: time per word (idle, fanout, cancel)
	Warmup time.Duration // before each measured window
	Window time.Duration // fanout's measured window

	IdleThreads, IdleTabs     int
	FanoutThreads, FanoutTabs int     // FanoutTabs per thread
	ReconnectFraction         float64 // of fanout's non-driver tabs, dropped once in the window

	CancelRuns, CancelTabs int
	CancelWindow           time.Duration // measured, after Warmup
	CancelMaxDelay         time.Duration // 0: 60 × Pace

	StorageRuns   int
	StoragePace   time.Duration
	StorageWindow time.Duration

	// scale: ScaleRuns threads with ScaleTabs tabs each, one run streaming
	// per thread at ScalePace; every ScaleCancelEvery-th thread cancels
	// its runs at random moments instead of letting them finish.
	ScaleRuns, ScaleTabs int
	ScalePace            time.Duration
	ScaleWindow          time.Duration
	ScaleCancelEvery     int
	// ScaleCapacity is passed to scale's gateway as -workers (runs
	// executing at once; more wait queued, docs/protocol.md "Admission"); 0
	// passes nothing, so the gateway's default capacity applies.
	ScaleCapacity int

	// long: one thread, one tab, LongExchanges exchanges one after the
	// other (run.start, wait for run.completed, the next), the demo model
	// at LongPace (0: no wait between words).
	LongExchanges int
	LongPace      time.Duration

	// cluster: two gateway processes on one PostgreSQL schema and NATS.
	// Postgres is the base URL (a schema is created in it per run and
	// dropped after); an empty Postgres or NATS skips the scenario.
	Postgres, NATS           string
	ClusterRuns, ClusterTabs int
	ClusterWindow            time.Duration // measured, after Warmup
	// "other": the instance not holding the run's lease; "owner": the one holding it
	ClusterCancelTo string

	// Synchronous is passed to every gateway on SQLite as
	// -sqlite-synchronous (normal or full); "" passes nothing, so the
	// gateway's default applies. Not for cluster (PostgreSQL).
	Synchronous string

	Seed    uint64
	PerfDir string    // if set, `perf record` the servers during fanout's window into it
	Keep    bool      // keep the temporary folder (binaries, databases)
	Log     io.Writer // progress lines
}

// Scenario names, in the order they run. cluster runs only when both
// Postgres and NATS are set (it is skipped with a line saying so
// otherwise).
var AllScenarios = []string{"idle", "fanout", "cancel", "storage", "scale", "long", "cluster"}

func (c Config) summary() map[string]any {
	return map[string]any{
		"scenarios":              c.Scenarios,
		"auth":                   c.Auth,
		"pace":                   c.Pace.String(),
		"warmup":                 c.Warmup.String(),
		"window":                 c.Window.String(),
		"idle_threads":           c.IdleThreads,
		"idle_tabs":              c.IdleTabs,
		"fanout_threads":         c.FanoutThreads,
		"fanout_tabs_per_thread": c.FanoutTabs,
		"reconnect_fraction":     c.ReconnectFraction,
		"cancel_runs":            c.CancelRuns,
		"cancel_tabs_per_run":    c.CancelTabs,
		"cancel_window":          c.CancelWindow.String(),
		"cancel_max_delay":       c.cancelMaxDelay().String(),
		"storage_runs":           c.StorageRuns,
		"storage_pace":           c.StoragePace.String(),
		"storage_window":         c.StorageWindow.String(),
		"scale_runs":             c.ScaleRuns,
		"scale_tabs_per_run":     c.ScaleTabs,
		"scale_pace":             c.ScalePace.String(),
		"scale_window":           c.ScaleWindow.String(),
		"scale_cancel_every":     c.ScaleCancelEvery,
		"scale_capacity":         c.ScaleCapacity,
		"long_exchanges":         c.LongExchanges,
		"long_pace":              c.LongPace.String(),
		"cluster_runs":           c.ClusterRuns,
		"cluster_tabs_per_run":   c.ClusterTabs,
		"cluster_window":         c.ClusterWindow.String(),
		"cluster_cancel_to":      c.ClusterCancelTo,
		"postgres":               redactDB(c.Postgres),
		"nats":                   c.NATS,
		"sqlite_synchronous":     c.Synchronous,
		"seed":                   c.Seed,
		"perf":                   c.PerfDir != "",
	}
}

func (c Config) cancelMaxDelay() time.Duration {
	if c.CancelMaxDelay > 0 {
		return c.CancelMaxDelay
	}
	return 60 * c.Pace
}

// Validate reports the first unusable setting.
func (c Config) Validate() error {
	for _, s := range c.Scenarios {
		if !slices.Contains(AllScenarios, s) {
			return fmt.Errorf("unknown scenario %q (have %s)", s, strings.Join(AllScenarios, ", "))
		}
	}
	switch {
	case c.Auth != "header" && c.Auth != "none":
		return fmt.Errorf("-auth must be header or none")
	case c.Pace <= 0 || c.StoragePace < 0:
		return fmt.Errorf("paces must be positive")
	case c.Window <= 0 || c.StorageWindow <= 0 || c.Warmup < 0:
		return fmt.Errorf("windows must be positive")
	case c.IdleThreads <= 0 || c.IdleTabs < c.IdleThreads:
		return fmt.Errorf("idle needs at least one tab per thread")
	case c.FanoutThreads <= 0 || c.FanoutTabs <= 0:
		return fmt.Errorf("fanout needs threads and tabs")
	case c.CancelRuns <= 0 || c.CancelTabs <= 0 || c.CancelWindow <= 0:
		return fmt.Errorf("cancel needs runs, tabs and a window")
	case c.StorageRuns <= 0:
		return fmt.Errorf("storage needs runs")
	case slices.Contains(c.Scenarios, "scale") &&
		(c.ScaleRuns <= 0 || c.ScaleTabs <= 0 || c.ScalePace <= 0 || c.ScaleWindow <= 0 || c.ScaleCancelEvery <= 0):
		return fmt.Errorf("scale needs runs, tabs, a pace, a window and -scale-cancel-every ≥ 1")
	case slices.Contains(c.Scenarios, "long") && (c.LongExchanges <= 0 || c.LongPace < 0):
		return fmt.Errorf("long needs -long-exchanges ≥ 1 and -long-pace ≥ 0")
	case c.ScaleCapacity < 0:
		return fmt.Errorf("-scale-capacity is 0 (the gateway's default) or more")
	case c.ReconnectFraction < 0 || c.ReconnectFraction > 1:
		return fmt.Errorf("-reconnect-fraction is between 0 and 1")
	case c.Synchronous != "" && c.Synchronous != "normal" && c.Synchronous != "full":
		return fmt.Errorf("-sqlite-synchronous must be normal or full (or empty: the gateway's default)")
	}
	if !slices.Contains(c.Scenarios, "cluster") {
		return nil
	}
	switch {
	case c.ClusterRuns <= 0 || c.ClusterWindow <= 0:
		return fmt.Errorf("cluster needs runs and a window")
	case c.ClusterTabs < 2:
		return fmt.Errorf("-cluster-tabs must be at least 2 (a tab on each instance)")
	case c.ClusterCancelTo != "other" && c.ClusterCancelTo != "owner":
		return fmt.Errorf("-cluster-cancel-to must be other or owner")
	}
	if err := loopbackURL(c.Postgres, "postgres", "postgresql"); err != nil {
		return fmt.Errorf("-postgres: %w", err)
	}
	if err := loopbackURL(c.NATS, "nats"); err != nil {
		return fmt.Errorf("-nats: %w", err)
	}
	return nil
}

// loopbackURL accepts "" (not set) or a URL of one of schemes on
// 127.0.0.1 or localhost: the generator never leaves the machine.
func loopbackURL(raw string, schemes ...string) error {
	if raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if !slices.Contains(schemes, u.Scheme) {
		return fmt.Errorf("%s: want a %s:// URL", u.Redacted(), schemes[0])
	}
	if h := u.Hostname(); h != "127.0.0.1" && h != "localhost" {
		return fmt.Errorf("%s: the generator stays on 127.0.0.1 (host %q)", u.Redacted(), h)
	}
	return nil
}

// clusterSkip says why the cluster scenario cannot run ("" when it can).
func (c Config) clusterSkip() string {
	var missing []string
	if c.Postgres == "" {
		missing = append(
			missing,
			"GATEWAY_TEST_POSTGRES_URL (or -postgres) to a PostgreSQL database the generator may create schemas in",
		)
	}
	if c.NATS == "" {
		missing = append(missing, "GATEWAY_TEST_NATS_URL (or -nats) to a NATS server, e.g. nats://127.0.0.1:4222")
	}
	if len(missing) == 0 {
		return ""
	}
	return "set " + strings.Join(missing, " and ")
}

// runner holds one invocation's state.
type runner struct {
	cfg     Config
	start   time.Time
	dir     string
	gateway string // binary
	floor   string // binary
	seq     int    // databases made so far
	admin   bool   // the gateway has -admin-addr (profiles and metrics)

	// the cancel scenario's report, when it ran: the cluster scenario
	// shows its figures next to its own
	cancelReport *ScenarioReport

	// fan-out shape the floor copies from the gateway's fanout run
	gwDeltaRate float64 // deltas per second per thread
	gwDeltaSize int     // bytes per delta event
}

func (r *runner) logf(format string, args ...any) {
	if r.cfg.Log != nil {
		fmt.Fprintf(r.cfg.Log, "[%6.1fs] %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
	}
}

// Run builds both servers, runs the configured scenarios one after the
// other, and returns the report. It returns an error only when nothing
// could be measured (a build failed); a scenario that fails records its
// failure in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, start: time.Now()}
	rep := &Report{
		Command: strings.Join(os.Args, " "),
		Date:    time.Now().Format(time.RFC3339),
		Machine: describeMachine(),
		Config:  cfg.summary(),
	}
	dir, err := os.MkdirTemp("", "gateway-bench-")
	if err != nil {
		return nil, err
	}
	r.dir = dir
	if cfg.Keep {
		r.logf("keeping %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	r.logf("building the gateway and the floor")
	if r.gateway, err = build(ctx, cfg.Repo, ".", dir, "gateway"); err != nil {
		return nil, err
	}
	if r.floor, err = build(ctx, cfg.Repo, "./bench/floor", dir, "floor"); err != nil {
		return nil, err
	}
	if cfg.Synchronous != "" && !supportsFlag(r.gateway, "sqlite-synchronous") {
		return nil, fmt.Errorf("-sqlite-synchronous %s: this gateway has no -sqlite-synchronous flag", cfg.Synchronous)
	}
	r.admin = supportsFlag(r.gateway, "admin-addr")
	if !r.admin {
		r.logf(
			"this gateway has no -admin-addr: no server metrics or Go profiles, store figures from the database only",
		)
	}
	rep.ChecksOK = true
	scenarios := map[string]func(context.Context) ScenarioReport{ // by AllScenarios' names
		"idle": r.idle, "fanout": r.fanout, "cancel": r.cancel,
		"storage": r.storage, "scale": r.scale, "long": r.long, "cluster": r.cluster,
	}
	for _, name := range AllScenarios {
		if !slices.Contains(cfg.Scenarios, name) || ctx.Err() != nil {
			continue
		}
		began := time.Now()
		if name == "cluster" {
			if why := cfg.clusterSkip(); why != "" {
				r.logf("cluster: skipped: %s", why)
				rep.Scenarios = append(rep.Scenarios, ScenarioReport{Name: name, Skipped: why})
				continue
			}
		}
		r.logf("%s: start", name)
		s := scenarios[name](ctx)
		s.Name = name
		s.Seconds = time.Since(began).Seconds()
		if cfg.Synchronous != "" && name != "cluster" {
			s.Shape += "; SQLite synchronous=" + cfg.Synchronous
		}
		for _, e := range s.GatewayErrors {
			rep.ProtocolErrors += e.Count
		}
		for _, e := range s.FloorErrors {
			rep.ProtocolErrors += e.Count
		}
		if s.Failure != "" || (s.Check != nil && !s.Check.OK) {
			rep.ChecksOK = false
		}
		r.logf("%s: end (%.1fs, %d gateway errors)", name, s.Seconds, countErrors(s.GatewayErrors))
		rep.Scenarios = append(rep.Scenarios, s)
		if name == "cancel" {
			r.cancelReport = &s
		}
	}
	rep.DurationSeconds = time.Since(r.start).Seconds()
	return rep, ctx.Err()
}

func countErrors(list []ErrorCount) int {
	n := 0
	for _, e := range list {
		n += e.Count
	}
	return n
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// gwPhase is one gateway process with its threads and tabs.
type gwPhase struct {
	r       *runner
	proc    *process
	db      string
	env     *gwEnv
	threads []*gwThread

	stopTabs context.CancelFunc
	tabs     sync.WaitGroup
	closed   bool
}

// startGateway starts a gateway for the scenario name with the demo
// model at pace and -workers workers (its capacity: runs executing at
// once); workers 0 passes no -workers, so the gateway's default applies.
func (r *runner) startGateway(name string, pace time.Duration, workers int) (*gwPhase, error) {
	r.seq++
	db := filepath.Join(r.dir, fmt.Sprintf("%02d-%s.db", r.seq, name))
	p, err := startProcess("gateway", r.gateway, r.gatewayArgs(db, pace, workers), 60*time.Second)
	if err != nil {
		return nil, err
	}
	capacity := "the default number of workers"
	if workers > 0 {
		capacity = fmt.Sprintf("%d workers", workers)
	}
	r.logf("%s: gateway pid %d at %s (pace %s, %s)", name, p.pid, p.addr, pace, capacity)
	env := newGWEnv(p.addr, r.cfg.Auth, name)
	env.pace = pace
	return &gwPhase{r: r, proc: p, db: db, env: env}, nil
}

// gatewayArgs are the flags of a gateway on the SQLite database db (see
// startGateway).
func (r *runner) gatewayArgs(db string, pace time.Duration, workers int) []string {
	args := []string{"-addr", "127.0.0.1:0", "-db", db, "-demo-pace", pace.String(), "-auth", r.cfg.Auth,
		"-max-conns-per-user", "100000", "-max-subscriptions-per-user", "100000", "-user-command-rate", "100000"}
	if workers > 0 {
		args = append(args, "-workers", strconv.Itoa(workers))
	}
	if r.cfg.Auth == "header" {
		args = append(args, "-trusted-proxies", "127.0.0.1")
	}
	if r.admin {
		args = append(args, "-admin-addr", "127.0.0.1:0")
	}
	if r.cfg.Synchronous != "" {
		args = append(args, "-sqlite-synchronous", r.cfg.Synchronous)
	}
	return args
}

// createThreads creates the phase's threads over HTTP.
func (p *gwPhase) createThreads(ctx context.Context, n int) error {
	var err error
	p.threads, err = p.env.createThreads(ctx, n)
	return err
}

// connectTabs connects tabsPer tabs to every thread and waits until all
// are subscribed.
func (p *gwPhase) connectTabs(ctx context.Context, tabsPer int, notesAll bool) error {
	tabsCtx, stop := context.WithCancel(ctx)
	p.stopTabs = stop
	began := time.Now()
	if err := p.env.connect(tabsCtx, p.threads, tabsPer, notesAll, &p.tabs, 60*time.Second); err != nil {
		return err
	}
	p.r.logf(
		"%s: %d tabs over %d threads subscribed in %.1fs",
		p.env.scenario, len(p.threads)*tabsPer, len(p.threads), time.Since(began).Seconds(),
	)
	return nil
}

// setup creates the threads and connects and subscribes their tabs.
func (p *gwPhase) setup(ctx context.Context, threads, tabsPer int, notesAll bool) error {
	if err := p.createThreads(ctx, threads); err != nil {
		return err
	}
	return p.connectTabs(ctx, tabsPer, notesAll)
}

// closeTabs ends every tab and waits for their goroutines; after it the
// tabs' samples may be read.
func (p *gwPhase) closeTabs() {
	if p.stopTabs != nil {
		p.stopTabs()
	}
	p.tabs.Wait()
}

// finish closes the tabs, stops the gateway, audits its database and
// records errors, log counts and the check in s. Safe to call twice.
func (p *gwPhase) finish(ctx context.Context, s *ScenarioReport) {
	if !stopOnce(&p.closed, p.closeTabs, p.proc, p.env.errs, "gateway_exit") {
		return
	}
	s.ServerLog.Errors, s.ServerLog.Warnings = p.proc.logCounts()
	if s.ServerLog.Errors > 0 {
		s.Notes = append(s.Notes, "gateway log tail:\n"+p.proc.logTail())
	}
	c := runCheck(ctx, p.r.gateway, p.db)
	s.Check = &c
	p.r.logf("%s: gateway check: ok=%v", p.env.scenario, c.OK)
	s.GatewayErrors = p.env.errs.list()
}

// scrape reads the gateway's metrics from its admin listener; nil when it
// has none or the read failed.
func (p *gwPhase) scrape(ctx context.Context) promSample {
	admin := p.proc.adminURL()
	if admin == "" {
		return nil
	}
	s, err := scrape(ctx, admin+"/metrics")
	if err != nil {
		p.r.logf("%s: metrics: %v", p.env.scenario, err)
		return nil
	}
	return s
}

// pprofFetch is a Go CPU profile being taken from the gateway's admin
// listener; wait ends it.
type pprofFetch struct {
	done sync.WaitGroup
	file string
	err  error
}

// startPprof takes a CPU profile of d from the gateway into the perf
// folder, when both exist.
func (p *gwPhase) startPprof(name string, d time.Duration) *pprofFetch {
	return p.r.startPprof(p.proc, name, d)
}

// startPprof takes a CPU profile of d from proc's admin listener into the
// perf folder, when both exist.
func (r *runner) startPprof(proc *process, name string, d time.Duration) *pprofFetch {
	admin := proc.adminURL()
	if r.cfg.PerfDir == "" || admin == "" {
		return nil
	}
	f := &pprofFetch{file: filepath.Join(r.cfg.PerfDir, name+".pprof")}
	secs := max(1, int(d.Seconds()))
	f.done.Go(func() {
		if err := os.MkdirAll(r.cfg.PerfDir, 0o755); err != nil {
			f.err = err
			return
		}
		resp, err := http.Get(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", admin, secs))
		if err != nil {
			f.err = err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			f.err = fmt.Errorf("profile: %s", resp.Status)
			return
		}
		out, err := os.Create(f.file)
		if err != nil {
			f.err = err
			return
		}
		_, f.err = io.Copy(out, resp.Body)
		if err := out.Close(); f.err == nil {
			f.err = err
		}
	})
	return f
}

func (f *pprofFetch) wait(r *runner) {
	if f == nil {
		return
	}
	f.done.Wait()
	if f.err != nil {
		r.logf("go profile: %v", f.err)
		return
	}
	r.logf("go profile written to %s (go tool pprof -top %s)", f.file, f.file)
}

func (p *gwPhase) tabsOf() []*gwTab {
	var out []*gwTab
	for _, th := range p.threads {
		out = append(out, th.tabs...)
	}
	return out
}

func (p *gwPhase) counts() (deliveries, deltas int64) {
	for _, t := range p.tabsOf() {
		deliveries += t.deliveries.Load()
		deltas += t.deltas.Load()
	}
	return
}

// floorPhase is one floor process with its topics and subscribers.
type floorPhase struct {
	r      *runner
	proc   *process
	env    *floorEnv
	topics []*floorTopic

	stopSubs context.CancelFunc
	subs     sync.WaitGroup
	closed   bool
}

func (r *runner) startFloor(name string) (*floorPhase, error) {
	p, err := startProcess("floor", r.floor, []string{"-addr", "127.0.0.1:0"}, 30*time.Second)
	if err != nil {
		return nil, err
	}
	r.logf("%s: floor pid %d at %s", name, p.pid, p.addr)
	return &floorPhase{r: r, proc: p, env: newFloorEnv(p.addr)}, nil
}

func (p *floorPhase) setup(ctx context.Context, topics, subsPer int) error {
	p.topics = newFloorTopics(p.env, topics, subsPer)
	subsCtx, stop := context.WithCancel(ctx)
	p.stopSubs = stop
	began := time.Now()
	for _, t := range p.topics {
		for _, s := range t.subs {
			p.subs.Go(func() { s.run(subsCtx) })
		}
	}
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	for _, t := range p.topics {
		for _, s := range t.subs {
			select {
			case <-s.ready:
			case <-deadline.C:
				return errors.New("floor subscribers not ready within 60s")
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	p.r.logf("floor: %d subscribers over %d topics ready in %.1fs", topics*subsPer, topics, time.Since(began).Seconds())
	return nil
}

func (p *floorPhase) deliveries() int64 {
	var n int64
	for _, t := range p.topics {
		for _, s := range t.subs {
			n += s.deliveries.Load()
		}
	}
	return n
}

func (p *floorPhase) closeSubs() {
	if p.stopSubs != nil {
		p.stopSubs()
	}
	p.subs.Wait()
}

func (p *floorPhase) finish(s *ScenarioReport) {
	if !stopOnce(&p.closed, p.closeSubs, p.proc, p.env.errs, "floor_exit") {
		return
	}
	s.FloorErrors = p.env.errs.list()
	if s.FloorErrors == nil {
		s.FloorErrors = []ErrorCount{}
	}
}

// stopOnce begins a phase's finish: the first time (closed not set yet)
// it sets closed, ends the phase's clients (closeClients), stops proc,
// recording a failed exit in errs as kind, and reports true; later it
// does nothing and reports false.
func stopOnce(closed *bool, closeClients func(), proc *process, errs *errorLog, kind string) bool {
	if *closed {
		return false
	}
	*closed = true
	closeClients()
	if err := proc.stop(20 * time.Second); err != nil {
		errs.add(kind, err.Error())
	}
	return true
}

// perfRecord samples pid's stacks with `perf record` for d into file, if
// perf is installed; wait ends it.
type perfRecord struct {
	cmd  *exec.Cmd
	file string
}

func (r *runner) startPerf(name string, pid int, d time.Duration) *perfRecord {
	if r.cfg.PerfDir == "" {
		return nil
	}
	bin, err := exec.LookPath("perf")
	if err != nil {
		r.logf("%s: perf not installed: no profile", name)
		return nil
	}
	if err := os.MkdirAll(r.cfg.PerfDir, 0o755); err != nil {
		r.logf("%s: perf: %v", name, err)
		return nil
	}
	file := filepath.Join(r.cfg.PerfDir, name+".perf.data")
	cmd := exec.Command(
		bin,
		"record",
		"-F",
		"499",
		"-g",
		"-p",
		strconv.Itoa(pid),
		"-o",
		file,
		"--",
		"sleep",
		strconv.FormatFloat(d.Seconds(), 'f', 1, 64),
	)
	if err := cmd.Start(); err != nil {
		r.logf("%s: perf: %v", name, err)
		return nil
	}
	return &perfRecord{cmd: cmd, file: file}
}

func (p *perfRecord) wait(r *runner) {
	if p == nil {
		return
	}
	if err := p.cmd.Wait(); err != nil {
		r.logf("perf record: %v", err)
		return
	}
	r.logf("profile written to %s", p.file)
}

// sampleGauges scrapes the gateway's metrics every interval until ctx
// ends and returns, for each of the gauges names that it has, the values
// it read (summed over the gauge's series); nothing when the gateway has
// no admin listener.
func (p *gwPhase) sampleGauges(ctx context.Context, every time.Duration, names ...string) map[string][]float64 {
	admin := p.proc.adminURL()
	if admin == "" {
		return nil
	}
	out := map[string][]float64{}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
			s, err := scrape(ctx, admin+"/metrics")
			if err != nil {
				if ctx.Err() == nil {
					p.r.logf("%s: metrics: %v", p.env.scenario, err)
				}
				continue
			}
			for _, name := range names {
				if v, ok := s.sum(name); ok {
					out[name] = append(out[name], v)
				}
			}
		}
	}
}
