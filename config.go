package main

// The server's configuration: flags, with environment variables as their
// defaults, checked before anything starts.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/honestcancel/gateway/app"
	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
	"github.com/honestcancel/gateway/model/openai"
	"github.com/honestcancel/gateway/store"
)

// config is the server's configuration: flags, with environment variables
// as defaults.
type config struct {
	app.Config
	logLevel, logFormat string
	// insecureRemote allows auth mode none on a non-loopback address.
	insecureRemote bool
}

func parseServe(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ef := envFlags{fs: fs}
	fs.StringVar(&c.Addr, "addr", env("GATEWAY_ADDR", "127.0.0.1:8080"), "listen address (GATEWAY_ADDR)")
	allowedHosts := fs.String("allowed-hosts", env("GATEWAY_ALLOWED_HOSTS", ""), "host names the server answers to (the Host of a request), comma-separated, *.example.com patterns allowed, '*' for any; required on a non-loopback -addr; on a loopback one localhost, 127.0.0.1 and [::1] are always answered (GATEWAY_ALLOWED_HOSTS)")
	fs.StringVar(&c.DB, "db", env("GATEWAY_DB", "data/gateway.db"), "SQLite database file, or a PostgreSQL URL (postgres://USER@HOST:5432/DB) shared by several instances (GATEWAY_DB)")
	fs.StringVar(&c.SQLiteSynchronous, "sqlite-synchronous", env("GATEWAY_SQLITE_SYNCHRONOUS", store.DefaultSynchronous), "SQLite -db: full (an acknowledged write survives an OS crash or power loss: each commit is synced to disk first) or normal (it survives a crash of the process only); refused with a PostgreSQL -db (GATEWAY_SQLITE_SYNCHRONOUS)")
	fs.StringVar(&c.NATS, "nats", env("GATEWAY_NATS", ""), "NATS URL (nats://HOST:4222) carrying events and cancel wake-ups between instances on one PostgreSQL -db; empty: one instance (GATEWAY_NATS)")
	dbFile := fs.String("db-file", env("GATEWAY_DB_FILE", ""), "file holding -db instead: for a PostgreSQL URL with a password, which -db would show in process lists (GATEWAY_DB_FILE)")
	natsFile := fs.String("nats-file", env("GATEWAY_NATS_FILE", ""), "file holding -nats instead: for a NATS URL with a user and password or a token (GATEWAY_NATS_FILE)")
	hideSecretDefaults(fs, "db", "nats")
	fs.StringVar(&c.NATSSubject, "nats-subject", env("GATEWAY_NATS_SUBJECT", "gateway"), "prefix of this deployment's NATS subjects: instances of one deployment share it, another deployment on the same NATS needs its own (GATEWAY_NATS_SUBJECT)")
	fs.StringVar(&c.InstanceID, "instance-id", env("GATEWAY_INSTANCE_ID", ""), "this instance's name in run leases and logs; empty: a new random one per start (GATEWAY_INSTANCE_ID)")
	ef.duration(&c.LeaseTTL, "lease-ttl", "GATEWAY_LEASE_TTL", 15*time.Second, "how long a run stays with an instance that stopped renewing its lease before another takes it over")
	ef.duration(&c.ReconcileHorizon, "reconcile-horizon", "GATEWAY_RECONCILE_HORIZON", 24*time.Hour, "how long the outcome of a tool call nobody saw (a lost answer, a crash) is looked up by its key at the provider before the gateway stops asking and says so")
	fs.StringVar(&c.Model, "model", env("GATEWAY_MODEL", "demo"), "model backend: demo or openai (GATEWAY_MODEL)")
	ef.duration(&c.DemoPace, "demo-pace", "GATEWAY_DEMO_PACE", 30*time.Millisecond, "demo model: time per streamed word")
	ef.int(&c.MaxReplyBytes, "max-reply-bytes", "GATEWAY_MAX_REPLY_BYTES", chat.DefaultReplyBytes, fmt.Sprintf("size limit of one model reply, in bytes of text (UTF-8), from %d to %d: a reply that reaches it is stopped there (the model call ends, as on a cancel) and kept up to it, marked as cut at the size limit", chat.MinReplyBytes, chat.MaxReplyBytes))
	fs.BoolVar(&c.NoModelTitles, "no-model-titles", env("GATEWAY_NO_MODEL_TITLES", "") == "1", "name a new conversation after the start of its first request instead of asking the model for a title (with -model openai the title is one short extra request per new conversation) (GATEWAY_NO_MODEL_TITLES=1)")
	ef.duration(&c.StreamTTL, "stream-ttl", "GATEWAY_STREAM_TTL", 10*time.Minute, "how long streamed deltas stay buffered")
	ef.duration(&c.EventTTL, "event-ttl", "GATEWAY_EVENT_TTL", 30*24*time.Hour, "how long the event log keeps events of finished work; an older position is answered with a snapshot; 0 keeps them forever")
	ef.duration(&c.AuditTTL, "audit-ttl", "GATEWAY_AUDIT_TTL", 365*24*time.Hour, "how long the cancel audit journal keeps rows of finished runs; 0 keeps them forever")
	ef.duration(&c.DraftTTL, "draft-ttl", "GATEWAY_DRAFT_TTL", 7*24*time.Hour, "how long the text of a deleted draft or a deleted conversation is kept (for audit) before it is erased; 0 keeps it forever")
	ef.int(&c.Workers, "workers", "GATEWAY_WORKERS", 64, "capacity: runs executed at once by this instance; more runs wait queued, with their place in line (see docs/configuration.md, Admission)")
	ef.int(&c.MaxRunsPerUser, "max-runs-per-user", "GATEWAY_MAX_RUNS_PER_USER", 0, "one user's share of the workers: runs of one user executing at once, on every instance together (0: half of -workers, at least 1)")
	ef.duration(&c.SearchLatency, "search-latency", "GATEWAY_SEARCH_LATENCY", 1500*time.Millisecond, "catalog_search: how long a search takes")
	ef.duration(&c.OutboxLatency, "outbox-latency", "GATEWAY_OUTBOX_LATENCY", 500*time.Millisecond, "send_email: how long the embedded email provider takes to accept")
	fs.StringVar(&c.OutboxFault, "outbox-fault", env("GATEWAY_OUTBOX_FAULT", ""), "send_email: make the embedded provider misbehave: reject, accept-then-timeout, record-late or crash (GATEWAY_OUTBOX_FAULT)")
	ef.duration(&c.OutboxRecordDelay, "outbox-record-delay", "GATEWAY_OUTBOX_RECORD_DELAY", 10*time.Second, "send_email with -outbox-fault record-late: how long after taking a call the embedded provider records its key (answers lookups for it)")
	mode := fs.String("auth", env("GATEWAY_AUTH", "none"), "who may use the server: none (one local user, loopback only), password (accounts: gateway user add; with -oidc-issuer also the provider's sign-in), oidc (accounts signed in through the -oidc-issuer provider only) or header (a trusted proxy names the user) (GATEWAY_AUTH)")
	fs.StringVar(&c.AuthHeader, "auth-header", env("GATEWAY_AUTH_HEADER", "X-Forwarded-User"), "-auth header: the request header that names the user (GATEWAY_AUTH_HEADER)")
	proxies := fs.String("trusted-proxies", env("GATEWAY_TRUSTED_PROXIES", ""), "addresses or CIDRs of reverse proxies whose -auth-header, X-Forwarded-For and X-Forwarded-Proto are believed, comma-separated (GATEWAY_TRUSTED_PROXIES)")
	ef.duration(&c.SessionTTL, "session-ttl", "GATEWAY_SESSION_TTL", 7*24*time.Hour, "-auth password or oidc: how long a sign-in lasts")
	fs.BoolVar(&c.SecureCookies, "secure-cookies", env("GATEWAY_SECURE_COOKIES", "") == "1", "always mark the session cookie Secure (it is anyway over TLS or when a trusted proxy says https) (GATEWAY_SECURE_COOKIES=1)")
	fs.BoolVar(&c.insecureRemote, "insecure-remote", env("GATEWAY_INSECURE_REMOTE", "") == "1", "allow -auth none on a non-loopback address: anyone who can reach it acts as the local user (GATEWAY_INSECURE_REMOTE=1)")
	fs.StringVar(&c.ToolsConfig, "tools-config", env("GATEWAY_TOOLS_CONFIG", ""), "JSON file of HTTP webhook tools to offer the model (GATEWAY_TOOLS_CONFIG)")
	origins := fs.String("ws-origins", env("GATEWAY_WS_ORIGINS", ""), "extra page origins allowed to open /ws, comma-separated hosts (GATEWAY_WS_ORIGINS)")
	ef.duration(&c.WSPing, "ws-ping-interval", "GATEWAY_WS_PING_INTERVAL", 20*time.Second, "WebSocket ping and event-stream keep-alive period; a WebSocket or event stream whose sign-in was ended (signed out, token revoked, password changed, account deleted) ends within it")
	ef.duration(&c.MaxConnAge, "max-conn-age", "GATEWAY_MAX_CONN_AGE", time.Hour, "end every WebSocket connection and event stream this long after it opened; the client reconnects and is authenticated again (what bounds a connection under -auth header, whose credential only the proxy can check); 0: never")
	ef.int(&c.UserConns, "max-conns-per-user", "GATEWAY_MAX_CONNS_PER_USER", 32, "WebSocket connections and event streams one user may hold open")
	ef.int(&c.UserSubs, "max-subscriptions-per-user", "GATEWAY_MAX_SUBSCRIPTIONS_PER_USER", 500, "threads one user may watch over all its WebSocket connections")
	ef.float(&c.UserRate, "user-command-rate", "GATEWAY_USER_COMMAND_RATE", 60, "commands per second one user may send over WebSocket and state-changing HTTP together, burst twice that; cancels have their own reserve")
	fs.StringVar(&c.logLevel, "log-level", env("GATEWAY_LOG_LEVEL", "info"), "debug, info, warn or error (GATEWAY_LOG_LEVEL)")
	fs.StringVar(&c.logFormat, "log-format", env("GATEWAY_LOG_FORMAT", "text"), "log lines as text (key=value) or json (GATEWAY_LOG_FORMAT)")
	fs.StringVar(&c.AdminAddr, "admin-addr", env("GATEWAY_ADMIN_ADDR", ""), "loopback address of the admin listener serving Go's profiles under /debug/pprof/ and the metrics on /metrics, e.g. 127.0.0.1:6060; empty: off (GATEWAY_ADMIN_ADDR)")
	fs.BoolVar(&c.MetricsPublic, "metrics-public", env("GATEWAY_METRICS_PUBLIC", "") == "1", "serve /metrics on the main listener without sign-in also under -auth password or header (it always is under -auth none, and always on -admin-addr) (GATEWAY_METRICS_PUBLIC=1)")
	configPath := fs.String("config", env("GATEWAY_CONFIG", ""), "optional settings file: one \"name = value\" per line, names as these flags (GATEWAY_CONFIG)")
	oa := openaiFlags(fs)
	oc := oidcFlags(fs)
	if ef.err != nil {
		return c, ef.err
	}
	if err := removedFlag(args); err != nil {
		return c, err
	}
	err := fs.Parse(args)
	if err != nil {
		return c, err
	}
	if path := *configPath; path != "" {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if err := applyConfigFile(fs, path, set); err != nil {
			return c, err
		}
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := urlFromFile(fs, "db", "GATEWAY_DB", "the database (-db)", *dbFile, &c.DB); err != nil {
		return c, err
	}
	if err := urlFromFile(fs, "nats", "GATEWAY_NATS", "the NATS URL (-nats)", *natsFile, &c.NATS); err != nil {
		return c, err
	}
	if store.IsPostgres(c.DB) {
		if err := checkURLs("-db", "postgres", c.DB); err != nil {
			return c, err
		}
	}
	if err := c.checkSynchronous(fs); err != nil {
		return c, err
	}
	if c.AuthMode, err = auth.ParseMode(*mode); err != nil {
		return c, err
	}
	if c.TrustedProxies, err = auth.ParsePrefixes(*proxies); err != nil {
		return c, err
	}
	if c.AuthMode == auth.ModeNone && !c.insecureRemote && !loopback(c.Addr) {
		return c, fmt.Errorf("-addr %s is not a loopback address and -auth is none: anyone who can reach it could read and drive every conversation. Use -auth password (create accounts with gateway user add) or -auth header behind an authenticating proxy, listen on 127.0.0.1, or pass -insecure-remote to accept that", c.Addr)
	}
	if c.Hosts, err = answeredHosts(c.Addr, *allowedHosts); err != nil {
		return c, err
	}
	if c.AuthMode == auth.ModeHeader && len(c.TrustedProxies) == 0 {
		return c, fmt.Errorf("-auth header needs -trusted-proxies: the addresses of the proxy that sets %s (anyone else could set it too)", c.AuthHeader)
	}
	if c.OIDC, err = oc.settings(&c); err != nil {
		return c, err
	}
	if c.SessionTTL <= 0 {
		return c, errors.New("-session-ttl must be more than 0")
	}
	if c.UserConns < 1 || c.UserSubs < 1 || c.UserRate <= 0 {
		return c, errors.New("-max-conns-per-user, -max-subscriptions-per-user and -user-command-rate must be more than 0")
	}
	if c.WSPing < 100*time.Millisecond {
		return c, errors.New("-ws-ping-interval must be at least 100ms")
	}
	if c.MaxConnAge != 0 && c.MaxConnAge < time.Second {
		return c, errors.New("-max-conn-age must be at least 1s, or 0 for no limit")
	}
	for _, o := range strings.Split(*origins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			c.Origins = append(c.Origins, o)
		}
	}
	switch c.Model {
	case "demo":
	case "openai":
		if c.OpenAI, err = oa.settings(); err != nil {
			return c, err
		}
	default:
		return c, fmt.Errorf("-model %q is not available: use demo or openai", c.Model)
	}
	if c.DemoPace < 0 || c.StreamTTL <= 0 {
		return c, errors.New("-demo-pace must be 0 or more and -stream-ttl more than 0")
	}
	if c.Workers < 1 {
		return c, errors.New("-workers must be 1 or more")
	}
	switch {
	case c.MaxRunsPerUser < 0:
		return c, fmt.Errorf("-max-runs-per-user %d: use 1 or more, or 0 for half of -workers", c.MaxRunsPerUser)
	case c.MaxRunsPerUser == 0:
		c.MaxRunsPerUser = max(1, c.Workers/2)
	}
	if c.MaxReplyBytes < chat.MinReplyBytes || c.MaxReplyBytes > chat.MaxReplyBytes {
		return c, fmt.Errorf("-max-reply-bytes %d is out of range: use %d to %d (the default is %d, 256 KiB); a larger reply would make its conversation page too heavy to load", c.MaxReplyBytes, chat.MinReplyBytes, chat.MaxReplyBytes, chat.DefaultReplyBytes)
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		return c, fmt.Errorf("-log-format %q: use text or json", c.logFormat)
	}
	if c.AdminAddr != "" && !loopback(c.AdminAddr) {
		return c, fmt.Errorf("-admin-addr %s is not a loopback address: profiles show the process's memory and are for the machine itself; use 127.0.0.1:PORT", c.AdminAddr)
	}
	if c.AdminAddr != "" {
		if c.AdminHosts, err = answeredHosts(c.AdminAddr, ""); err != nil {
			return c, err
		}
	}
	c.BodyTimeout, c.IdleTimeout = gateway.DefaultBodyTimeout, 2*time.Minute
	if c.NATS != "" && !store.IsPostgres(c.DB) {
		return c, fmt.Errorf("-nats %s needs a PostgreSQL -db (postgres://…): instances can share only a PostgreSQL database; one instance on SQLite needs no NATS", app.RedactedURL(c.NATS))
	}
	if c.NATS != "" && !strings.HasPrefix(c.NATS, "nats://") && !strings.HasPrefix(c.NATS, "tls://") {
		return c, fmt.Errorf("-nats %q: use a URL like nats://127.0.0.1:4222", app.RedactedURL(c.NATS))
	}
	if c.NATS != "" {
		if err := checkURLs("-nats", "nats", c.NATS); err != nil {
			return c, err
		}
	}
	if !natsToken.MatchString(c.NATSSubject) {
		return c, fmt.Errorf("-nats-subject %q: use letters, digits, '-' and '_', optionally in dot-separated parts (e.g. gateway or acme.chat)", c.NATSSubject)
	}
	if c.LeaseTTL < 300*time.Millisecond {
		return c, errors.New("-lease-ttl must be at least 300ms (leases are renewed every third of it)")
	}
	if c.ReconcileHorizon < time.Second {
		return c, errors.New("-reconcile-horizon must be at least 1s: it is how long an unknown outcome is looked up at its provider")
	}
	if c.OutboxRecordDelay <= 0 {
		return c, errors.New("-outbox-record-delay must be more than 0")
	}
	if c.EventTTL < 0 || c.AuditTTL < 0 || c.DraftTTL < 0 {
		return c, errors.New("-event-ttl, -audit-ttl and -draft-ttl must be 0 (keep forever) or more")
	}
	return c, nil
}

// checkSynchronous checks -sqlite-synchronous and keeps it in the form the
// store takes. With a PostgreSQL -db a value given on the command line, in
// the environment or in the settings file is refused rather than ignored:
// it would not make PostgreSQL's commits any more or less durable.
func (c *config) checkSynchronous(fs *flag.FlagSet) error {
	if store.IsPostgres(c.DB) {
		given := env("GATEWAY_SQLITE_SYNCHRONOUS", "") != ""
		fs.Visit(func(f *flag.Flag) { given = given || f.Name == "sqlite-synchronous" })
		if given {
			return errors.New("-sqlite-synchronous (GATEWAY_SQLITE_SYNCHRONOUS) applies to a SQLite -db only: with PostgreSQL an acknowledged write is as durable as PostgreSQL's synchronous_commit makes it (on by default); remove the setting")
		}
		c.SQLiteSynchronous = ""
		return nil
	}
	if _, err := store.SQLiteSynchronous(c.SQLiteSynchronous); err != nil || strings.TrimSpace(c.SQLiteSynchronous) == "" {
		return fmt.Errorf("-sqlite-synchronous (GATEWAY_SQLITE_SYNCHRONOUS) %q: use full (an acknowledged write survives an OS crash or power loss) or normal (it survives a crash of the process only)", c.SQLiteSynchronous)
	}
	c.SQLiteSynchronous = strings.ToLower(strings.TrimSpace(c.SQLiteSynchronous))
	return nil
}

// natsToken is a valid -nats-subject: NATS subject tokens without
// wildcards.
var natsToken = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`)

// openaiSettings are the flags of -model openai. The API key and the extra
// request headers are read from the environment or from files, never from
// a flag value: flags show in process lists (ps, /proc/PID/cmdline, which
// every user of the machine can read) and in shell history, and a header
// sent to a model endpoint is often a credential (Authorization, api-key,
// x-api-key, a router's or gateway's own key) that no rule on its name
// could recognise reliably.
type openaiSettings struct {
	baseURL, model, keyFile, headersFile, temperature, maxTokens string
}

func openaiFlags(fs *flag.FlagSet) *openaiSettings {
	o := &openaiSettings{}
	fs.StringVar(&o.baseURL, "openai-base-url", env("GATEWAY_OPENAI_BASE_URL", "https://api.openai.com/v1"), "-model openai: the API's base URL, for example http://127.0.0.1:11434/v1 (GATEWAY_OPENAI_BASE_URL)")
	fs.StringVar(&o.model, "openai-model", env("GATEWAY_OPENAI_MODEL", ""), "-model openai: the model name, required (GATEWAY_OPENAI_MODEL)")
	fs.StringVar(&o.keyFile, "openai-api-key-file", env("GATEWAY_OPENAI_API_KEY_FILE", ""), "-model openai: file holding the API key (GATEWAY_OPENAI_API_KEY_FILE); or set GATEWAY_OPENAI_API_KEY")
	fs.StringVar(&o.headersFile, "openai-headers-file", env("GATEWAY_OPENAI_HEADERS_FILE", ""), "-model openai: file of extra request headers, one `Name: value` per line, # comments (GATEWAY_OPENAI_HEADERS_FILE); or set GATEWAY_OPENAI_HEADERS, comma-separated. Never a flag: header values are often credentials")
	fs.StringVar(&o.temperature, "openai-temperature", env("GATEWAY_OPENAI_TEMPERATURE", ""), "-model openai: sampling temperature from 0 to 2; unset leaves the endpoint's default (GATEWAY_OPENAI_TEMPERATURE)")
	fs.StringVar(&o.maxTokens, "openai-max-completion-tokens", env("GATEWAY_OPENAI_MAX_COMPLETION_TOKENS", ""), fmt.Sprintf("-model openai: max_completion_tokens sent with every reply request; unset: a quarter of -max-reply-bytes, at most %d (what common chat models accept; raise it for a model that may write more, such as a reasoning model) (GATEWAY_OPENAI_MAX_COMPLETION_TOKENS)", openai.MaxDerivedCompletionTokens))
	return o
}

// errHeaderFlag refuses the removed -openai-header flag (and its settings
// file line) without repeating its value.
var errHeaderFlag = errors.New("-openai-header is not accepted: a header sent to the model endpoint often carries a credential (Authorization, api-key, x-api-key, …), and a flag shows in process lists and shell history. Put the headers in GATEWAY_OPENAI_HEADERS (Name: value, comma-separated) or in a file named by -openai-headers-file (one Name: value per line)")

// removedSettings are flags that no longer exist, each with the error that
// says what to use instead; refused on the command line and in the
// settings file alike, before the flag package could echo their values.
var removedSettings = map[string]error{"openai-header": errHeaderFlag}

// removedFlag returns the error of the first removed flag among args
// (-name, --name, -name=value), up to a "--".
func removedFlag(args []string) error {
	for _, a := range args {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if err, gone := removedSettings[name]; gone {
			return err
		}
	}
	return nil
}

// headers reads the extra request headers from GATEWAY_OPENAI_HEADERS
// (comma-separated) or the -openai-headers-file (one per line, blank
// lines and # comments skipped), not both. No error repeats a value.
func (o *openaiSettings) headers() (map[string]string, error) {
	fromEnv := env("GATEWAY_OPENAI_HEADERS", "")
	var entries []string
	where := func(int) string { return "a GATEWAY_OPENAI_HEADERS entry" }
	switch {
	case fromEnv != "" && o.headersFile != "":
		return nil, errors.New("the extra OpenAI headers are set twice: use GATEWAY_OPENAI_HEADERS or -openai-headers-file (GATEWAY_OPENAI_HEADERS_FILE), not both")
	case fromEnv != "":
		entries = strings.Split(fromEnv, ",")
	case o.headersFile != "":
		data, err := os.ReadFile(o.headersFile)
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return nil, fmt.Errorf("-openai-headers-file: cannot read %s: %v", o.headersFile, err)
		}
		entries = strings.Split(string(data), "\n")
		where = func(i int) string { return fmt.Sprintf("line %d of %s", i+1, o.headersFile) }
	}
	var out map[string]string
	for i, h := range entries {
		h = strings.TrimSpace(h)
		if h == "" || (o.headersFile != "" && strings.HasPrefix(h, "#")) {
			continue
		}
		name, value, ok := strings.Cut(h, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" {
			// The entry is not echoed: header values can be secrets.
			return nil, fmt.Errorf("%s is not of the form Name: value", where(i))
		}
		if out == nil {
			out = make(map[string]string)
		}
		if _, dup := out[http.CanonicalHeaderKey(name)]; dup {
			return nil, fmt.Errorf("%s sets the header %s a second time", where(i), http.CanonicalHeaderKey(name))
		}
		out[http.CanonicalHeaderKey(name)] = value
	}
	return out, nil
}

// settings reads and checks the settings of -model openai; it makes no
// request.
func (o *openaiSettings) settings() (openai.Config, error) {
	if strings.TrimSpace(o.model) == "" {
		return openai.Config{}, errors.New("-model openai needs a model name: set GATEWAY_OPENAI_MODEL or -openai-model (for example gpt-4o-mini)")
	}
	cfg := openai.Config{BaseURL: strings.TrimSpace(o.baseURL), Model: strings.TrimSpace(o.model)}
	key, err := secretSetting("the OpenAI API key", "GATEWAY_OPENAI_API_KEY", "openai-api-key-file", o.keyFile)
	if err != nil {
		return openai.Config{}, err
	}
	cfg.APIKey = key
	if cfg.APIKey == "" && strings.Contains(cfg.BaseURL, "api.openai.com") {
		return openai.Config{}, errors.New("the OpenAI API needs an API key: set GATEWAY_OPENAI_API_KEY or -openai-api-key-file (a local server needs no key: set GATEWAY_OPENAI_BASE_URL to it)")
	}
	headers, err := o.headers()
	if err != nil {
		return openai.Config{}, err
	}
	cfg.Headers = headers
	if o.temperature != "" {
		t, err := strconv.ParseFloat(o.temperature, 64)
		if err != nil || t < 0 || t > 2 {
			return openai.Config{}, fmt.Errorf("-openai-temperature (GATEWAY_OPENAI_TEMPERATURE) %q is not a number from 0 to 2", o.temperature)
		}
		cfg.Temperature = &t
	}
	if o.maxTokens != "" {
		n, err := strconv.ParseInt(o.maxTokens, 10, 64)
		if err != nil || n < 1 {
			return openai.Config{}, fmt.Errorf("-openai-max-completion-tokens (GATEWAY_OPENAI_MAX_COMPLETION_TOKENS) %q is not a whole number of tokens of 1 or more: leave it unset to derive it from -max-reply-bytes", o.maxTokens)
		}
		cfg.MaxCompletionTokens = n
	}
	if err := cfg.Validate(); err != nil {
		return openai.Config{}, fmt.Errorf("-model openai: %w (settings: -openai-base-url, -openai-model, -openai-headers-file, or their GATEWAY_OPENAI_* variables)", err)
	}
	return cfg, nil
}

// answeredHosts are the Host names a listener on addr answers to: on a
// loopback address the loopback names (and the address itself, as for
// 127.0.0.2) plus the list; on any other the list, which must then be
// given — '*' (any name) only when said.
func answeredHosts(addr, list string) (gateway.Hosts, error) {
	hosts, err := gateway.ParseHosts(list)
	if err != nil {
		return hosts, fmt.Errorf("-allowed-hosts: %w", err)
	}
	if loopback(addr) {
		hosts = hosts.Union(gateway.LoopbackHosts())
		if host, _, err := net.SplitHostPort(addr); err == nil {
			if ip, err := gateway.ParseHosts(host); err == nil {
				hosts = hosts.Union(ip)
			}
		}
		return hosts, nil
	}
	if hosts.IsZero() {
		return hosts, fmt.Errorf("-addr %s is not a loopback address: say which host names the server answers to with -allowed-hosts (GATEWAY_ALLOWED_HOSTS), e.g. -allowed-hosts chat.example.com or '*.example.com' — the names browsers and your proxy use to reach it (behind a proxy, have it pass the Host: proxy_set_header Host $host). A request for any other name is refused, so that a web page cannot reach the server by pointing a name of its own at this address (DNS rebinding); -allowed-hosts '*' answers to every name and gives up that protection", addr)
	}
	return hosts, nil
}

// loopback reports whether addr (host:port) listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func env(key, fallback string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return fallback
}

// envFlags defines flags whose defaults come from environment variables
// (the variable's name ends the usage, as every setting's does); the first
// variable that does not parse is kept in err and stops the start.
type envFlags struct {
	fs  *flag.FlagSet
	err error
}

func (e *envFlags) keep(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *envFlags) duration(dst *time.Duration, name, key string, def time.Duration, usage string) {
	v, err := envValue(key, def, time.ParseDuration, "a duration (for example 30ms or 10m)")
	e.keep(err)
	e.fs.DurationVar(dst, name, v, usage+" ("+key+")")
}

func (e *envFlags) int(dst *int, name, key string, def int, usage string) {
	v, err := envValue(key, def, strconv.Atoi, "a whole number")
	e.keep(err)
	e.fs.IntVar(dst, name, v, usage+" ("+key+")")
}

func (e *envFlags) float(dst *float64, name, key string, def float64, usage string) {
	v, err := envValue(key, def, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) }, "a number")
	e.keep(err)
	e.fs.Float64Var(dst, name, v, usage+" ("+key+")")
}

// envValue is the environment variable key parsed with parse, or fallback
// when it is unset or empty; a value parse refuses is an error saying the
// variable is not what.
func envValue[T any](key string, fallback T, parse func(string) (T, error), what string) (T, error) {
	v := env(key, "")
	if v == "" {
		return fallback, nil
	}
	x, err := parse(v)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s=%q is not %s", key, v, what)
	}
	return x, nil
}
