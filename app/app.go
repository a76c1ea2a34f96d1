// Package app is the gateway's composition root: from a plain Config it
// builds the parts (store, event bus, tools, model, engine, auth, gateway,
// page), connects the ones that call each other once all exist, serves,
// and shuts them down in order. The command (package main) only parses
// flags into a Config; tests can run an App in their own process.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
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
	"github.com/honestcancel/gateway/model/openai"
	"github.com/honestcancel/gateway/store"
	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/catalog"
	"github.com/honestcancel/gateway/tools/email"
	"github.com/honestcancel/gateway/tools/mcp"
	"github.com/honestcancel/gateway/tools/webhook"
	"github.com/honestcancel/gateway/web"
)

// Config is everything an App is built from: plain data, checked by the
// command that filled it (package main's flags say what each means).
type Config struct {
	Addr string
	DB   string
	// SQLiteSynchronous is SQLite's synchronous setting
	// (store.SynchronousFull or store.SynchronousNormal) for the store and
	// the embedded email provider; "" on PostgreSQL.
	SQLiteSynchronous string
	// Scale-out: the NATS bus (empty: one instance) and its subject
	// prefix, this instance's name in run leases (empty: a random one),
	// how long a lease outlives a silent instance.
	NATS, NATSSubject, InstanceID string
	LeaseTTL                      time.Duration
	ReconcileHorizon              time.Duration
	// Model is "demo" or "openai"; OpenAI configures the latter.
	Model         string
	OpenAI        openai.Config
	DemoPace      time.Duration
	NoModelTitles bool
	// MaxReplyBytes is the size limit of one reply's text
	// (engine.Config.MaxReplyBytes; 0: chat.DefaultReplyBytes).
	MaxReplyBytes int
	// Retention; 0 keeps forever (StreamTTL must be more than 0).
	StreamTTL, EventTTL, AuditTTL, DraftTTL time.Duration
	Workers                                 int
	MaxRunsPerUser                          int // a user's share of the workers (store.Options.MaxRunsPerUser)
	// Tools: the catalog search's and the embedded email provider's
	// behaviour, and the webhook tools' file.
	SearchLatency, OutboxLatency time.Duration
	OutboxFault                  string
	OutboxRecordDelay            time.Duration
	// OutboxCrash is what -outbox-fault crash does once the provider
	// accepted (the command exits the process; nil: Send returns
	// email.ErrSimulatedCrash).
	OutboxCrash func()
	ToolsConfig string
	// Auth.
	AuthMode       auth.Mode
	AuthHeader     string
	TrustedProxies []netip.Prefix
	SessionTTL     time.Duration
	SecureCookies  bool
	// OIDC is the OpenID Connect provider users sign in through (auth
	// mode oidc, or beside passwords); a zero Issuer: none.
	OIDC auth.OIDCConfig
	// WebSocket and event streams: extra page origins, ping period,
	// maximum age; per-user limits.
	Origins             []string
	WSPing, MaxConnAge  time.Duration
	UserConns, UserSubs int
	UserRate            float64
	// MetricsPublic serves /metrics on the main listener in every auth
	// mode (under none it always is). AdminAddr is the loopback admin
	// listener (profiles, metrics); empty: none.
	MetricsPublic bool
	AdminAddr     string
	// Hosts are the Host names the main listener answers to, AdminHosts
	// the admin listener's.
	Hosts, AdminHosts gateway.Hosts
	// BodyTimeout bounds reading a request body; IdleTimeout how long an
	// idle keep-alive connection stays open.
	BodyTimeout, IdleTimeout time.Duration
}

// App is one running gateway. New builds and starts it, Run serves until
// its context ends, Close releases what New built. Not safe for concurrent
// use: one goroutine calls New, Run, then Close.
type App struct {
	cfg        Config
	log        *slog.Logger
	instanceID string

	metrics *metrics.Metrics
	store   *store.Store
	nats    *bus.NATS // nil without -nats
	outbox  *email.Outbox
	mcp     []*mcp.Server // the tools config's MCP servers, kept connected until Close
	engine  *engine.Engine
	api     *gateway.Server
	ln      net.Listener
	srv     *http.Server
	// endStreams ends every request's context (BaseContext): event
	// streams and WebSockets end at shutdown.
	endStreams context.CancelFunc
	stopAdmin  func()
	// closers run in reverse order at Close: what New built, last first.
	closers []func()
}

// eventFeed fans committed events out to this instance's tabs: bus.Memory
// for one instance, bus.NATS between several.
type eventFeed interface {
	Publish(events []*chat.Event)
	Add(threadID string, sink chat.EventSink)
	Remove(threadID string, sink chat.EventSink)
}

// New builds the parts in two phases: construct each on what it reads
// (the bus on the store's log, the engine on the store, the bus and the
// tools), then connect the ones that call back (the store's commits to the
// bus, the bus's requests from other instances to the store and the
// engine), then start the engine and listen. The HTTP server answers once
// Run is called. On error everything built so far is closed.
func New(ctx context.Context, cfg Config, log *slog.Logger) (_ *App, err error) {
	a := &App{cfg: cfg, log: log, metrics: metrics.New(), instanceID: cfg.InstanceID}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if a.instanceID == "" {
		a.instanceID = chat.NewID("ins_")
	}
	// Leases name this process, not just the instance: an instance
	// restarted under the same -instance-id must not renew (and so keep
	// forever) the leases its previous process left behind; they expire
	// and are taken over like any dead instance's.
	leaseOwner := a.instanceID + "." + chat.NewID("p")

	// Construct.
	st, err := store.Open(ctx, cfg.DB, store.Options{Metrics: a.metrics, Exclusive: true, StreamBuffer: true,
		ReconcileHorizon: cfg.ReconcileHorizon, Synchronous: cfg.SQLiteSynchronous, MaxRunsPerUser: cfg.MaxRunsPerUser})
	if err != nil {
		if store.IsPostgres(cfg.DB) {
			return nil, fmt.Errorf("%w (is PostgreSQL running, and does -db %s name a database this user may use?)", err, RedactedURL(cfg.DB))
		}
		return nil, err
	}
	a.store = st
	a.closers = append(a.closers, func() { closeStore(st, log) })
	warnExposed(cfg.DB, log)

	var feed eventFeed
	switch {
	case cfg.NATS != "":
		nb, err := bus.DialNATS(cfg.NATS, bus.NATSConfig{Log: st, Name: a.instanceID, Logger: log,
			Subject: cfg.NATSSubject, Holder: leaseOwner})
		if err != nil {
			return nil, fmt.Errorf("connect to NATS at %s: %w (is nats-server running? check -nats)", RedactedURL(cfg.NATS), err)
		}
		a.nats, feed = nb, nb
		a.closers = append(a.closers, nb.Close)
	case st.Postgres():
		log.Warn("-db is PostgreSQL but -nats is not set: run only this one instance, or give every instance -nats so tabs see the events other instances commit")
		feed = bus.NewMemory()
	default:
		feed = bus.NewMemory()
	}

	a.outbox, err = email.NewOutbox(st.ServiceDB(), email.OutboxConfig{Latency: cfg.OutboxLatency, Fault: cfg.OutboxFault,
		RecordDelay: cfg.OutboxRecordDelay, CrashFunc: cfg.OutboxCrash})
	if err != nil {
		return nil, fmt.Errorf("the embedded email provider: %w", err)
	}
	registry, err := a.tools(ctx)
	if err != nil {
		return nil, err
	}
	backend, titler, modelName, err := a.model()
	if err != nil {
		return nil, err
	}
	engCfg := engine.Config{
		Store: st, Retention: st.Retention(), Model: backend, ModelName: modelName, MaxReplyBytes: cfg.MaxReplyBytes,
		Titler: titler, Tools: registry, Log: log,
		InstanceID: leaseOwner, SingleInstance: !st.Postgres(), LeaseTTL: cfg.LeaseTTL,
		Workers: cfg.Workers, ClaimBatch: st.ClaimsPerTransaction(), StreamTTL: cfg.StreamTTL,
		EventTTL: cfg.EventTTL, AuditTTL: cfg.AuditTTL, DraftTTL: cfg.DraftTTL,
		Metrics: a.metrics,
	}
	if a.nats != nil {
		engCfg.Wakeups, engCfg.Holders = a.nats, a.nats
	}
	a.engine = engine.New(engCfg)

	// Connect. What this instance commits is counted before it is fanned
	// out, so on one instance a client that saw an event finds it
	// counted. (With several, each counts its own commits, and a tab may
	// see an event recovered from the log before its committer counted
	// it.) Nothing has committed yet: opening only migrates, and the
	// engine's first write comes at Start.
	m := a.metrics
	st.SetOnCommit(func(events []*chat.Event) {
		m.Committed(events)
		feed.Publish(events)
	})
	if nb := a.nats; nb != nil {
		// Other instances ask this process for the threads it streams on
		// and hand it cancels of the runs it executes; this process asks
		// them before writing to one of theirs.
		nb.SetHandlers(bus.Handlers{OnYield: st.YieldStream, OnCancelRun: a.engine.CancelRunHere, OnCancel: func(string) { a.engine.WakeCancels() }})
		st.SetStreamPeers(nb)
		m.WatchBus(func() metrics.BusCounts {
			s, ss := nb.Stats(), st.StreamStats()
			return metrics.BusCounts{Recoveries: s.Recoveries, Recovered: s.Recovered, Skipped: s.Skipped, Unsent: s.Unsent,
				Yields: ss.Yields, Unanswered: ss.Unanswered, WrittenPast: ss.WrittenPast, DeltasLost: ss.DeltasLost}
		})
	}

	if err := a.engine.Start(ctx); err != nil {
		return nil, err
	}
	a.closers = append(a.closers, a.engine.Close)

	handler, err := a.routes(ctx, feed)
	if err != nil {
		return nil, err
	}
	if a.ln, err = net.Listen("tcp", cfg.Addr); err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("listen on %s: %w (is another gateway running? pick another -addr)", cfg.Addr, err)
		}
		return nil, fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	a.closers = append(a.closers, func() { a.ln.Close() })
	if cfg.AdminAddr != "" {
		if a.stopAdmin, err = serveAdmin(cfg.AdminAddr, cfg.AdminHosts, m.Handler(), log); err != nil {
			return nil, err
		}
	}
	streams, endStreams := context.WithCancel(context.Background())
	a.endStreams = endStreams
	a.srv = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       cfg.IdleTimeout,
		BaseContext:       func(net.Listener) context.Context { return streams },
	}
	return a, nil
}

// tools builds the registry: the built-in tools, the webhook tools of
// Config.ToolsConfig, then the tools of its MCP servers, which it connects
// (all at once, each bounded by its timeout; one that fails is logged and
// retried in the background) and keeps connected until Close.
func (a *App) tools(ctx context.Context) (*tools.Registry, error) {
	all := []tools.Tool{catalog.New(a.cfg.SearchLatency), email.NewSendEmail(a.outbox)}
	var servers []mcp.ServerConfig
	if path := a.cfg.ToolsConfig; path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("tools config: %w", err)
		}
		hooks, err := webhook.Parse(data, nil)
		if err != nil {
			return nil, fmt.Errorf("tools config %s: %w", path, err)
		}
		if servers, err = mcp.ParseFile(data); err != nil {
			return nil, fmt.Errorf("tools config %s: %w", path, err)
		}
		all = append(all, hooks...)
	}
	registry, err := tools.NewRegistry(all...)
	if err != nil {
		return nil, fmt.Errorf("tools: %w", err)
	}
	for _, cfg := range servers {
		a.mcp = append(a.mcp, mcp.NewServer(cfg, a.log))
	}
	if len(a.mcp) == 0 {
		return registry, nil
	}
	sources := make([]tools.Source, len(a.mcp))
	var first sync.WaitGroup
	for i, s := range a.mcp {
		sources[i] = s
		first.Go(func() {
			if err := s.Connect(ctx); err != nil {
				a.log.Warn("MCP server unavailable at start; its tools are offered once it connects", "mcp_server", s.Name(), "err", err)
			}
		})
	}
	first.Wait()
	keep, stop := context.WithCancel(context.Background())
	var running sync.WaitGroup
	for _, s := range a.mcp {
		running.Go(func() { s.Run(keep) })
	}
	a.closers = append(a.closers, func() { stop(); running.Wait() })
	return registry.WithSources(sources...), nil
}

// toolServers reports the MCP servers' states for /readyz.
func (a *App) toolServers() []gateway.ToolServer {
	out := make([]gateway.ToolServer, len(a.mcp))
	for i, s := range a.mcp {
		st := s.State()
		out[i] = gateway.ToolServer{Name: st.Name, Connected: st.Connected, Tools: st.Tools, Since: st.Since}
	}
	return out
}

// model builds the backend of Config.Model and what names new threads
// (nil under NoModelTitles).
func (a *App) model() (model.Backend, engine.Titler, string, error) {
	var backend model.Backend
	var titler engine.Titler
	var name string
	switch a.cfg.Model {
	case "openai":
		b, err := openai.New(a.cfg.OpenAI)
		if err != nil {
			return nil, nil, "", fmt.Errorf("-model openai: %w", err)
		}
		backend, titler, name = b, b, b.ModelName()
	default:
		d := demo.New(a.cfg.DemoPace)
		backend, titler, name = d, d, "demo"
	}
	if a.cfg.NoModelTitles {
		titler = nil
	}
	return backend, titler, name, nil
}

// routes builds auth, the API and the page on one mux, behind the edge
// checks.
func (a *App) routes(ctx context.Context, feed eventFeed) (http.Handler, error) {
	cfg, log := a.cfg, a.log
	authn, err := auth.New(auth.Config{Mode: cfg.AuthMode, Store: a.store.Accounts(), ProxyHeader: cfg.AuthHeader,
		TrustedProxies: cfg.TrustedProxies, SessionTTL: cfg.SessionTTL, SecureCookies: cfg.SecureCookies, Log: log,
		CredentialCache: auth.DefaultCredentialCache})
	if err != nil {
		return nil, err
	}
	var provider web.OIDC
	if cfg.OIDC.Issuer != "" {
		o, err := auth.NewOIDC(ctx, cfg.OIDC, authn, a.store.Accounts())
		if err != nil {
			return nil, err
		}
		provider = o
		log.Info("signing in through an OpenID Connect provider", "issuer", cfg.OIDC.Issuer, "redirect_url", cfg.OIDC.RedirectURL)
	}
	if cfg.AuthMode == auth.ModePassword && provider == nil {
		users, err := a.store.Accounts().Users(ctx)
		switch {
		case err != nil:
			log.Warn("list accounts", "err", err)
		case !hasPassword(users):
			log.Warn("no account can sign in yet: create one with `gateway user add NAME`")
		}
	}
	reads := queueAware{Store: a.store, engine: a.engine, log: log}
	a.api = gateway.New(gateway.Config{
		Auth: authn, Store: reads, Runs: a.engine, Log: log,
		Feed:        feed,
		Metrics:     a.metrics,
		ToolServers: a.toolServers,
		Admission:   a.engine.Admission,
		Model:       a.engine.ModelName(),
		// Event streams re-check their credential at each keep-alive, as
		// the WebSocket does at each ping: one interval for both.
		KeepAlive: cfg.WSPing,
		WS: gateway.WSConfig{OriginPatterns: cfg.Origins, PingInterval: cfg.WSPing, MaxConnAge: cfg.MaxConnAge,
			MaxConnsPerUser: cfg.UserConns, MaxSubscriptionsPerUser: cfg.UserSubs,
			UserCommandRate: cfg.UserRate, UserCommandBurst: max(1, int(2*cfg.UserRate))},
	})
	mux := http.NewServeMux()
	a.api.Routes(mux)
	// The page forms draw from the same per-user command budget as the API.
	web.New(reads, authn, a.api, log).With(web.Options{Model: cfg.Model, Runs: a.engine, OIDC: provider}).Routes(mux)
	// Metrics hold no user content, but they are the server's own business:
	// on the main listener only when everyone who reaches it is trusted
	// anyway (-auth none) or when asked for (-metrics-public); always on the
	// loopback admin listener.
	if a.publicMetrics() {
		mux.Handle("GET /metrics", a.metrics.Handler())
	}
	// Before any route: the Host allowlist (DNS rebinding), HSTS, and the
	// body read deadline. /livez and /readyz answer whatever the Host:
	// load balancers probe them by address. A foreign Host is told the
	// status alone (gateway.AllowedHost). Inside it, pages and API answers
	// are compressed (the bundle comes precompressed from package static).
	return gateway.Edge(gateway.EdgeConfig{Hosts: cfg.Hosts, Unchecked: []string{"/livez", "/readyz"},
		HTTPS: authn.HTTPS, BodyTimeout: cfg.BodyTimeout, Log: log}, gateway.Compress(mux)), nil
}

func (a *App) publicMetrics() bool { return a.cfg.AuthMode == auth.ModeNone || a.cfg.MetricsPublic }

// Addr is the address the App listens on (with the port chosen when
// Config.Addr asked for port 0).
func (a *App) Addr() net.Addr { return a.ln.Addr() }

// Run serves until ctx ends or the listener fails, then shuts the HTTP
// side down in order: not ready, event streams and WebSockets ended
// (their clients reconnect elsewhere), requests in flight finished (at
// most 10 s). Runs are left to Close.
func (a *App) Run(ctx context.Context) error {
	cfg, log := a.cfg, a.log
	served := make(chan error, 1)
	go func() { served <- a.srv.Serve(a.ln) }()
	// Where the metrics are is said before "gateway serving", the line
	// scripts wait for, so it is already there when they look.
	if a.publicMetrics() {
		log.Info("metrics", "url", "http://"+a.ln.Addr().String()+"/metrics")
	} else {
		log.Info("metrics are served on the admin listener (-admin-addr) only under this -auth mode; -metrics-public serves them here too")
	}
	if cfg.Hosts.Any() {
		log.Warn("-allowed-hosts '*': answering to every host name, so a web page can reach this server through DNS rebinding")
	} else {
		log.Info("answering to host names", "hosts", cfg.Hosts.String())
	}
	a.api.SetReady()
	serving := []any{"addr", "http://" + a.ln.Addr().String(), "db", RedactedURL(cfg.DB), "model", cfg.Model, "auth", cfg.AuthMode, "instance", a.instanceID}
	if cfg.SQLiteSynchronous != "" {
		serving = append(serving, "sqlite_synchronous", cfg.SQLiteSynchronous)
	}
	log.Info("gateway serving", serving...)

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	a.api.SetStopping()
	a.endStreams()
	closing, cancelClosing := context.WithTimeout(context.Background(), 5*time.Second)
	a.api.CloseWebSockets(closing)
	cancelClosing()
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.srv.Shutdown(shutdown); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	<-served
	return nil
}

// Close stops the admin listener and closes what New built, in reverse:
// the listener, the engine (its runs handed back), the email provider, the
// bus, the store. Safe to call once, after Run returned (or instead of
// Run).
func (a *App) Close() {
	if a.endStreams != nil {
		a.endStreams()
	}
	if a.stopAdmin != nil {
		a.stopAdmin()
	}
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil
}

// streamWriteWait bounds how long a stop waits for a database another
// process keeps locked, to write the streamed text tabs were shown.
const streamWriteWait = 2 * time.Minute

// closeStore writes what only memory holds of the streams (every delta a
// tab was shown, see store.WriteStreams), then closes the store. While
// another process holds the database's write lock it waits, saying so,
// up to streamWriteWait: a stop that gives up (or a crash) leaves those
// deltas recorded lost at the next start, and says that too.
func closeStore(st *store.Store, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), streamWriteWait)
	defer cancel()
	for {
		err := st.WriteStreams(ctx)
		if err == nil {
			break
		}
		if !store.Busy(err) || ctx.Err() != nil {
			log.Error("could not write the streamed text before stopping: what tabs were shown of unfinished replies is lost (recorded as lost at the next start)", "err", err)
			break
		}
		log.Warn("waiting for the database to write the streamed text before stopping", "why", "another process holds its write lock", "err", err)
	}
	if err := st.Close(); err != nil {
		log.Error("close the database", "err", err)
	}
}

// RedactedURL is a -db or -nats setting as logs and errors may show it:
// a URL loses its password (in its user info or a parameter naming one)
// and, for NATS, a token given as the user name, and so does each URL of a
// comma-separated list of NATS servers (a list with a part that is not a
// URL of its own is not shown at all: the comma may be a password's); a
// SQLite path is shown as it is.
func RedactedURL(raw string) string {
	if !strings.Contains(raw, ",") || !(strings.HasPrefix(raw, "nats://") || strings.HasPrefix(raw, "tls://")) {
		return redactedOne(raw)
	}
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil || u.Scheme == "" || u.Host == "" {
			return "(not shown: it does not parse as a list of URLs and may hold a password)"
		}
		parts[i] = redactedOne(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

// redactedOne is RedactedURL of one URL.
func redactedOne(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Host == "" {
		if strings.Contains(raw, "://") || strings.Contains(raw, "@") {
			return "(not shown: it does not parse as a URL and may hold a password)"
		}
		return raw
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		} else if u.Scheme != "postgres" && u.Scheme != "postgresql" {
			u.User = url.User("xxxxx") // nats://TOKEN@host
		}
	}
	q := u.Query()
	for k := range q {
		if lk := strings.ToLower(k); strings.Contains(lk, "password") || strings.Contains(lk, "token") {
			q.Set(k, "xxxxx")
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
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
