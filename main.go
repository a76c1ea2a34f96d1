// Command gateway serves a browser chat UI and an API for LLM agents where
// cancel is an honest protocol. `gateway` (or `gateway serve`) runs the
// server; `gateway check -db PATH` audits a database's invariants.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/gateway"
	"github.com/honestcancel/gateway/metrics"
	"github.com/honestcancel/gateway/model"
	"github.com/honestcancel/gateway/model/demo"
	"github.com/honestcancel/gateway/store"
	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/email"
	"github.com/honestcancel/gateway/web"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(args, stderr)
	case "check":
		return check(args, stdout, stderr)
	case "backup":
		return backup(args, stdout, stderr)
	case "user":
		return userCmd(args, stdin, stdout, stderr)
	case "token":
		return tokenCmd(args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, version())
		return 0
	case "help":
		fmt.Fprintln(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "gateway: unknown command %q\n\n%s\n", cmd, usage)
		return 2
	}
}

const usage = `Usage:
  gateway [serve] [flags]   run the server (flags: gateway serve -h)
  gateway check -db PATH    audit the protocol's invariants on a database
  gateway backup -db PATH OUT
                            write a consistent copy of a database, also while it serves
  gateway user add|passwd|del|list ...
                            manage the accounts of -auth password (gateway user help)
  gateway token create|revoke|list ...
                            manage API tokens for programs (gateway token help)
  gateway version           print the build's version, commit and Go version`

// buildVersion is set by `make build` (-ldflags -X main.buildVersion=…)
// from git describe; otherwise the toolchain's build information is used.
var buildVersion string

// version describes the build from what the Go toolchain recorded in it.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "gateway " + buildVersion + " (no build information)"
	}
	v, rev, at, dirty := info.Main.Version, "", "", ""
	if buildVersion != "" {
		v = buildVersion
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = " (modified)"
			}
		}
	}
	out := "gateway " + v
	if rev != "" {
		out += " commit " + rev[:min(12, len(rev))] + dirty
	}
	if at != "" {
		out += " " + at
	}
	return out + " " + info.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH
}

func serve(args []string, stderr io.Writer) int {
	cfg, err := parseServe(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.logLevel)); err != nil {
		fmt.Fprintln(stderr, "gateway: -log-level:", err)
		return 2
	}
	opts := &slog.HandlerOptions{Level: level}
	var handler slog.Handler = slog.NewTextHandler(stderr, opts)
	if cfg.logFormat == "json" {
		handler = slog.NewJSONHandler(stderr, opts)
	}
	log := slog.New(handler)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serveUntilDone(ctx, cfg, log); err != nil {
		log.Error("gateway stopped", "err", err)
		return 1
	}
	return 0
}

// feed fans committed events out to this instance's tabs: bus.Memory for
// one instance, bus.NATS between several.
type feed interface {
	Publish(events []*chat.Event)
	Add(threadID string, sink chat.EventSink)
	Remove(threadID string, sink chat.EventSink)
}

// serveUntilDone wires the parts, serves until ctx ends, and shuts down in
// order: stop accepting, end streams, hand runs back, close the store.
func serveUntilDone(ctx context.Context, cfg config, log *slog.Logger) error {
	m := metrics.New()
	instanceID := cfg.instanceID
	if instanceID == "" {
		instanceID = chat.NewID("ins_")
	}
	// Leases name this process, not just the instance: an instance
	// restarted under the same -instance-id must not renew (and so keep
	// forever) the leases its previous process left behind; they expire
	// and are taken over like any dead instance's.
	leaseOwner := instanceID + "." + chat.NewID("p")
	// fd is set right after the store opens, before anything can commit
	// (opening only migrates; the engine's first write comes later).
	var fd feed
	// What this instance commits is counted before it is fanned out, so on
	// one instance a client that saw an event finds it counted. (With
	// several, each counts its own commits, and a tab may see an event
	// recovered from the log before its committer counted it.)
	committed := func(events []*chat.Event) {
		m.Committed(events)
		fd.Publish(events)
	}
	st, err := store.Open(ctx, cfg.db, store.Options{OnCommit: committed, Metrics: m, Exclusive: true, StreamBuffer: true,
		ReconcileHorizon: cfg.reconcileHorizon, Synchronous: cfg.sqliteSync})
	if err != nil {
		if store.IsPostgres(cfg.db) {
			return fmt.Errorf("%w (is PostgreSQL running, and does -db %s name a database this user may use?)", err, redactedURL(cfg.db))
		}
		return err
	}
	defer st.Close()
	warnExposed(cfg.db, log)
	// The engine, once it exists, for the bus's cancel wake-ups.
	var woken atomic.Pointer[engine.Engine]
	var wakeups engine.CancelWakeups
	var holders engine.CancelForwarder
	switch {
	case cfg.nats != "":
		nb, err := bus.DialNATS(cfg.nats, bus.NATSConfig{
			Log: st, Name: instanceID, Logger: log, Subject: cfg.natsSubject,
			// Other instances ask this process for the threads it streams
			// on, and this process asks them, before writing to one.
			Holder: leaseOwner, OnYield: st.YieldStream,
			// and hand cancels to the process executing the run.
			OnCancelRun: func(ctx context.Context, p chat.CancelRun) (chat.CancelAck, error) {
				e := woken.Load()
				if e == nil {
					return chat.CancelAck{}, errors.New("this instance is still starting")
				}
				return e.CancelRunHere(ctx, p)
			},
			OnCancel: func(string) {
				if e := woken.Load(); e != nil {
					e.WakeCancels()
				}
			},
		})
		if err != nil {
			return fmt.Errorf("connect to NATS at %s: %w (is nats-server running? check -nats)", redactedURL(cfg.nats), err)
		}
		defer nb.Close()
		st.SetStreamPeers(nb)
		fd, wakeups, holders = nb, nb, nb
		m.WatchBus(func() metrics.BusCounts {
			s, ss := nb.Stats(), st.StreamStats()
			return metrics.BusCounts{Recoveries: s.Recoveries, Recovered: s.Recovered, Skipped: s.Skipped, Unsent: s.Unsent,
				Yields: ss.Yields, Unanswered: ss.Unanswered, WrittenPast: ss.WrittenPast, DeltasLost: ss.DeltasLost}
		})
	case st.Postgres():
		log.Warn("-db is PostgreSQL but -nats is not set: run only this one instance, or give every instance -nats so tabs see the events other instances commit")
		fd = bus.NewMemory()
	default:
		fd = bus.NewMemory()
	}

	outbox, err := email.OpenOutbox(cfg.db, email.OutboxConfig{Latency: cfg.outboxLatency, Fault: cfg.outboxFault,
		RecordDelay: cfg.outboxRecordDelay, Synchronous: cfg.sqliteSync,
		// -outbox-fault crash: the process dies right after the provider
		// accepted, as a gateway killed before it heard the answer.
		CrashFunc: func() { os.Exit(3) }})
	if err != nil {
		return fmt.Errorf("open the embedded email provider: %w", err)
	}
	defer outbox.Close()
	all := []tools.Tool{tools.NewCatalogSearch(cfg.searchLatency), email.NewSendEmail(outbox)}
	if cfg.toolsConfig != "" {
		hooks, err := tools.LoadWebhooks(cfg.toolsConfig, nil)
		if err != nil {
			return err
		}
		all = append(all, hooks...)
	}
	registry, err := tools.NewRegistry(all...)
	if err != nil {
		return fmt.Errorf("tools: %w", err)
	}
	demoModel := demo.New(cfg.demoPace)
	var backend model.Backend = demoModel
	var titler engine.Titler = demoModel
	modelName := "demo"
	if cfg.openai != nil {
		backend, titler, modelName = cfg.openai, cfg.openai, cfg.openai.ModelName()
	}
	if cfg.noModelTitles {
		titler = nil
	}
	eng := engine.New(engine.Config{
		Store: st, Model: backend, ModelName: modelName, Titler: titler, Tools: registry, Log: log,
		InstanceID: leaseOwner, SingleInstance: !st.Postgres(), LeaseTTL: cfg.leaseTTL, Wakeups: wakeups, Holders: holders,
		Workers: cfg.workers, ClaimBatch: st.ClaimsPerTransaction(), StreamTTL: cfg.streamTTL,
		EventTTL: cfg.eventTTL, AuditTTL: cfg.auditTTL, DraftTTL: cfg.draftTTL,
		Metrics: m,
	})
	woken.Store(eng)
	if err := eng.Start(ctx); err != nil {
		return err
	}
	defer eng.Close()

	authn, err := auth.New(auth.Config{Mode: cfg.authMode, Store: st, ProxyHeader: cfg.authHeader,
		TrustedProxies: cfg.trustedProxies, SessionTTL: cfg.sessionTTL, SecureCookies: cfg.secureCookies, Log: log,
		CredentialCache: auth.DefaultCredentialCache})
	if err != nil {
		return err
	}
	if cfg.authMode == auth.ModePassword {
		users, err := st.Users(ctx)
		switch {
		case err != nil:
			log.Warn("list accounts", "err", err)
		case !hasPassword(users):
			log.Warn("no account can sign in yet: create one with `gateway user add NAME`")
		}
	}
	api := gateway.New(gateway.Config{
		Auth: authn, Store: st, Runs: eng, Log: log,
		Feed:    fd,
		Metrics: m,
		// Event streams re-check their credential at each keep-alive, as
		// the WebSocket does at each ping: one interval for both.
		KeepAlive: cfg.wsPing,
		WS: gateway.WSConfig{OriginPatterns: cfg.origins, PingInterval: cfg.wsPing, MaxConnAge: cfg.maxConnAge,
			MaxConnsPerUser: cfg.userConns, MaxSubscriptionsPerUser: cfg.userSubs,
			UserCommandRate: cfg.userRate, UserCommandBurst: max(1, int(2*cfg.userRate))},
	})
	mux := http.NewServeMux()
	api.Routes(mux)
	// The page forms draw from the same per-user command budget as the API.
	web.New(st, authn, api, log).Routes(mux)
	// Metrics hold no user content, but they are the server's own business:
	// on the main listener only when everyone who reaches it is trusted
	// anyway (-auth none) or when asked for (-metrics-public); always on the
	// loopback admin listener.
	publicMetrics := cfg.authMode == auth.ModeNone || cfg.metricsPublic
	if publicMetrics {
		mux.Handle("GET /metrics", m.Handler())
	}

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("listen on %s: %w (is another gateway running? pick another -addr)", cfg.addr, err)
		}
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	if cfg.adminAddr != "" {
		stopAdmin, err := serveAdmin(cfg.adminAddr, cfg.adminHosts, m.Handler(), log)
		if err != nil {
			ln.Close()
			return err
		}
		defer stopAdmin()
	}
	streams, endStreams := context.WithCancel(context.Background())
	defer endStreams()
	// Before any route: the Host allowlist (DNS rebinding), HSTS, and the
	// body read deadline. /livez and /readyz answer whatever the Host:
	// load balancers probe them by address, and they tell nothing.
	edge := gateway.Edge(gateway.EdgeConfig{Hosts: cfg.hosts, Unchecked: []string{"/livez", "/readyz"},
		HTTPS: authn.HTTPS, BodyTimeout: cfg.bodyTimeout, Log: log}, mux)
	srv := &http.Server{
		Handler:           edge,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       cfg.idleTimeout,
		BaseContext:       func(net.Listener) context.Context { return streams },
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	// Where the metrics are is said before "gateway serving", the line
	// scripts wait for, so it is already there when they look.
	if publicMetrics {
		log.Info("metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	} else {
		log.Info("metrics are served on the admin listener (-admin-addr) only under this -auth mode; -metrics-public serves them here too")
	}
	if cfg.hosts.Any() {
		log.Warn("-allowed-hosts '*': answering to every host name, so a web page can reach this server through DNS rebinding")
	} else {
		log.Info("answering to host names", "hosts", cfg.hosts.String())
	}
	api.SetReady(true)
	serving := []any{"addr", "http://" + ln.Addr().String(), "db", redactedURL(cfg.db), "model", cfg.model, "auth", cfg.authMode, "instance", instanceID}
	if cfg.sqliteSync != "" {
		serving = append(serving, "sqlite_synchronous", cfg.sqliteSync)
	}
	log.Info("gateway serving", serving...)

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	api.SetReady(false)
	endStreams()
	closing, cancelClosing := context.WithTimeout(context.Background(), 5*time.Second)
	api.CloseWebSockets(closing)
	cancelClosing()
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	<-served
	return nil
}

// warnExposed warns when other users of the machine may read the SQLite
// database's files (every conversation, the password and token hashes) or
// list its folder: the store creates them private but leaves existing ones
// as they are. The warning names the chmod that closes them.
func warnExposed(db string, log *slog.Logger) {
	e, err := store.Exposed(db)
	if err != nil {
		log.Warn("cannot check who may read the database files", "err", err)
		return
	}
	if len(e.Files) > 0 {
		log.Warn("other users of this machine may read the database, which holds every conversation and the password and token hashes: make it yours alone",
			"files", strings.Join(e.Files, " "), "run", "chmod 600 "+shellQuote(e.Files...))
	}
	if e.Dir != "" {
		log.Warn("other users of this machine may list the database's folder: make it yours alone (or move the database into a folder of its own)",
			"dir", e.Dir, "run", "chmod 700 "+shellQuote(e.Dir))
	}
}

// shellQuote joins paths for a command to paste into a shell.
func shellQuote(paths ...string) string {
	q := make([]string, len(paths))
	for i, p := range paths {
		if p != "" && strings.Trim(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./") == "" {
			q[i] = p
		} else {
			q[i] = "'" + strings.ReplaceAll(p, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

func hasPassword(users []chat.User) bool {
	for _, u := range users {
		if u.HasPassword {
			return true
		}
	}
	return false
}

// serveAdmin runs the admin listener (Go's profiles and the metrics) on a
// loopback address, answering to the loopback names (hosts) only, until
// the returned stop is called; stop waits for it.
func serveAdmin(addr string, hosts gateway.Hosts, metrics http.Handler, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listener on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("GET /metrics", metrics)
	srv := &http.Server{Handler: gateway.Edge(gateway.EdgeConfig{Hosts: hosts, Log: log}, mux),
		ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin listener", "err", err)
		}
	}()
	log.Info("admin listener", "addr", "http://"+ln.Addr().String()+"/debug/pprof/")
	log.Info("metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() {
		srv.Close()
		<-done
	}, nil
}
