package gateway

// The edge: what every request meets before any route (API, WebSocket,
// event stream, page, static file) sees it. It refuses a Host the server
// does not answer to, marks HTTPS answers Strict-Transport-Security, and
// puts a deadline on reading a request body.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// Hosts is the set of host names a server answers to (its Host allowlist).
// A browser sends the name it resolved in Host: a web page on a name of
// its own that it re-resolves to this server's address (DNS rebinding)
// reaches the server as a "same-origin" page of that name, passing every
// Origin check, and only a Host allowlist refuses it.
//
// Names are compared case-insensitively, without the port and without a
// trailing dot; IP literals (IPv6 in brackets in a Host header) by their
// address. An entry "*.example.com" matches every name under example.com
// (not example.com itself); "*" matches every name. The zero Hosts matches
// nothing. A Hosts is immutable and safe for concurrent use.
type Hosts struct {
	any      bool
	names    map[string]bool // lower-case names and canonical IP addresses
	suffixes []string        // ".example.com" of "*.example.com"
}

// ParseHosts reads a comma-separated list of host names, IP addresses and
// "*.NAME" patterns, or the single entry "*". Blank entries are skipped.
func ParseHosts(list string) (Hosts, error) {
	h := Hosts{names: map[string]bool{}}
	entries := 0
	for _, e := range strings.Split(list, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		entries++
		if e == "*" {
			h.any = true
			continue
		}
		if strings.Contains(e, "://") || strings.Contains(e, "/") {
			return Hosts{}, fmt.Errorf("%q is a URL: give the host name alone (chat.example.com)", e)
		}
		if rest, ok := strings.CutPrefix(e, "*."); ok {
			name, ok := canonicalName(rest)
			if !ok {
				return Hosts{}, fmt.Errorf("%q: after \"*.\" comes a host name, as in *.example.com", e)
			}
			if _, err := netip.ParseAddr(name); err == nil {
				return Hosts{}, fmt.Errorf("%q: a pattern covers the names under a domain; an address is given alone", e)
			}
			h.suffixes = append(h.suffixes, "."+name)
			continue
		}
		if strings.Contains(e, "*") {
			return Hosts{}, fmt.Errorf("%q: a pattern is \"*.\" and a domain (*.example.com), or \"*\" alone for every name", e)
		}
		literal := e
		if strings.HasPrefix(e, "[") && strings.HasSuffix(e, "]") {
			literal = e[1 : len(e)-1]
		}
		if a, err := netip.ParseAddr(literal); err == nil && (literal == e || a.Is6()) {
			h.names[canonicalAddr(a)] = true
			continue
		}
		if name, port, err := splitHostPort(e); err == nil && port != "" {
			return Hosts{}, fmt.Errorf("%q: host names are matched without their port: give %s", e, name)
		}
		name, ok := canonicalName(e)
		if !ok {
			return Hosts{}, fmt.Errorf("%q is not a host name (letters, digits, '-' and '_' in dot-separated labels; write an international name in its xn-- form)", e)
		}
		h.names[name] = true
	}
	if h.any && entries > 1 {
		return Hosts{}, errors.New(`"*" answers to every name: give it alone, not with other names`)
	}
	return h, nil
}

// LoopbackHosts are the names of this machine's loopback interface:
// localhost, 127.0.0.1 and ::1.
func LoopbackHosts() Hosts {
	h, _ := ParseHosts("localhost,127.0.0.1,::1")
	return h
}

// Union is the set of names either h or o answers to.
func (h Hosts) Union(o Hosts) Hosts {
	u := Hosts{any: h.any || o.any, names: map[string]bool{}}
	for _, s := range []Hosts{h, o} {
		for n := range s.names {
			u.names[n] = true
		}
		u.suffixes = append(u.suffixes, s.suffixes...)
	}
	return u
}

// IsZero reports whether h answers to no name at all.
func (h Hosts) IsZero() bool { return !h.any && len(h.names) == 0 && len(h.suffixes) == 0 }

// Any reports whether h answers to every name ("*").
func (h Hosts) Any() bool { return h.any }

// String lists the entries, for logs: "*", or names and patterns sorted.
func (h Hosts) String() string {
	if h.any {
		return "*"
	}
	var out []string
	for n := range h.names {
		if strings.Contains(n, ":") {
			n = "[" + n + "]"
		}
		out = append(out, n)
	}
	for _, s := range h.suffixes {
		out = append(out, "*"+s)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// Allows reports whether a request's Host (name or address, optionally
// with a port) is one h answers to. An empty or malformed Host is not.
func (h Hosts) Allows(host string) bool {
	name, ok := hostName(host)
	if !ok {
		return false
	}
	if h.any || h.names[name] {
		return true
	}
	for _, s := range h.suffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// hostName is the name in a Host header value in the form Hosts keeps:
// lower-case, without the port, the IPv6 brackets or a trailing dot; an IP
// address canonical. ok is false for an empty or malformed value.
func hostName(hostport string) (string, bool) {
	host, _, err := splitHostPort(hostport)
	if err != nil || host == "" {
		return "", false
	}
	if strings.HasPrefix(hostport, "[") {
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() {
			return "", false
		}
		return canonicalAddr(a), true
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(host, ".")); err == nil && a.Is4() {
		return canonicalAddr(a), true
	}
	return canonicalName(host)
}

// errMalformedHost is splitHostPort's refusal; its callers only test it.
var errMalformedHost = errors.New("malformed host")

// splitHostPort splits "host", "host:port", "[v6]" or "[v6]:port"; an
// IPv6 address without brackets is an error (it is not a valid Host). It
// runs for every request, so its error is a value, not built per call.
func splitHostPort(s string) (host, port string, err error) {
	malformed := errMalformedHost
	rest := s
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", "", malformed
		}
		host, rest = s[1:end], s[end+1:]
		if rest == "" {
			return host, "", nil
		}
		if rest[0] != ':' {
			return "", "", malformed
		}
		port = rest[1:]
	} else {
		i := strings.LastIndexByte(s, ':')
		if i < 0 {
			return s, "", nil
		}
		if strings.IndexByte(s[:i], ':') >= 0 {
			return "", "", malformed
		}
		host, port = s[:i], s[i+1:]
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return "", "", malformed
		}
	}
	return host, port, nil
}

// canonicalName lower-cases a host name and drops one trailing dot; ok is
// false unless it is dot-separated labels of ASCII letters, digits, '-'
// and '_', each 1 to 63 bytes, 253 at most in all.
func canonicalName(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSuffix(s, "."))
	if s == "" || len(s) > 253 {
		return "", false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return "", false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", false
			}
		}
	}
	return s, true
}

func canonicalAddr(a netip.Addr) string { return a.WithZone("").Unmap().String() }

// EdgeConfig configures Edge.
type EdgeConfig struct {
	// Hosts the server answers to; every other Host is refused (403
	// forbidden) before anything else happens. The zero Hosts refuses all.
	Hosts Hosts
	// Unchecked paths answer whatever the Host: health probes that load
	// balancers send to an address, not a name (e.g. /livez, /readyz).
	// Edge marks such a request whose Host is allowed (AllowedHost), so
	// that its handler tells a foreign Host its status only.
	Unchecked []string
	// HTTPS reports whether a request reached the user over HTTPS (TLS
	// here, or a trusted proxy that says so); such answers carry
	// Strict-Transport-Security. Nil: only TLS on this connection.
	HTTPS func(*http.Request) bool
	// BodyTimeout bounds reading a request's body, from the moment its
	// headers were read (default 30s). Requests without a body get no
	// deadline, so a WebSocket or an event stream (a GET) is never cut.
	BodyTimeout time.Duration
	Log         *slog.Logger
}

// DefaultBodyTimeout is EdgeConfig.BodyTimeout's default: the largest body
// the API takes (1 MiB) arrives in it at about 35 KiB/s.
const DefaultBodyTimeout = 30 * time.Second

// hstsValue is one year, for this name only (a gateway on
// chat.example.com has no say over the rest of example.com).
const hstsValue = "max-age=31536000"

// Edge wraps next with the Host allowlist, Strict-Transport-Security and
// the body read deadline.
func Edge(cfg EdgeConfig, next http.Handler) http.Handler {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.HTTPS == nil {
		cfg.HTTPS = func(r *http.Request) bool { return r.TLS != nil }
	}
	unchecked := map[string]bool{}
	for _, p := range cfg.Unchecked {
		unchecked[p] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch allowed := cfg.Hosts.Allows(r.Host); {
		case !unchecked[r.URL.Path] && !allowed:
			refuseHost(w, r, cfg.Log)
			return
		case unchecked[r.URL.Path] && allowed:
			// Only such a request may be told more than its status.
			r = r.WithContext(context.WithValue(r.Context(), allowedHostKey{}, true))
		}
		if cfg.HTTPS(r) {
			w.Header().Set("Strict-Transport-Security", hstsValue)
		}
		// Only a request with a body gets the deadline. Once the body is
		// read to its end, the server lifts it itself (it starts watching
		// the connection for the client going away, without a deadline);
		// a request without one is watched from the start, and a deadline
		// set now would end its context when it passed: an event stream
		// would be cut. A WebSocket's upgrade clears the connection's
		// deadlines anyway.
		if r.Body != nil && r.Body != http.NoBody {
			if err := http.NewResponseController(w).SetReadDeadline(time.Now().Add(cfg.BodyTimeout)); err == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, timeout: cfg.BodyTimeout}
			}
		}
		next.ServeHTTP(w, r)
	})
}

type allowedHostKey struct{}

// AllowedHost reports whether Edge found r, a request for one of its
// Unchecked paths, to name a Host the server answers to. A request that
// did not pass through Edge is not.
func AllowedHost(r *http.Request) bool {
	ok, _ := r.Context().Value(allowedHostKey{}).(bool)
	return ok
}

// refuseHost answers a request for a Host the server does not answer to:
// the protocol's forbidden error under /api and on /ws, a short plain text
// elsewhere (a browser shows it as the page). The connection closes after
// it, so no byte of a body is read.
func refuseHost(w http.ResponseWriter, r *http.Request, log *slog.Logger) {
	msg := "this server does not answer to the host name " + quoteShort(r.Host) +
		": open it by one of its own names (its operator lists them with -allowed-hosts)"
	if r.Host == "" {
		msg = "the request names no host (Host header): send the server's name"
	}
	log.Debug("host refused", "host", quoteShort(r.Host), "path", quoteShort(r.URL.Path))
	w.Header().Set("Connection", "close")
	if p := r.URL.Path; p == "/api" || strings.HasPrefix(p, "/api/") || p == "/ws" {
		writeError(w, log, chat.Errorf(chat.CodeForbidden, "%s", msg))
		return
	}
	if strings.HasPrefix(r.URL.Path, "/v1/") { // the OpenAI API's clients read its error shape
		writeOpenAIError(w, log, chat.Errorf(chat.CodeForbidden, "%s", msg))
		return
	}
	h := w.Header()
	securityHeaders(h)
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusForbidden)
	fmt.Fprintf(w, "Forbidden: %s.\n", strings.ToUpper(msg[:1])+msg[1:])
}

// deadlineBody is a request body read under a deadline: when the deadline
// passes before the body arrived, reading it fails with a
// bodyTimeoutError, which the API answers as invalid_request.
type deadlineBody struct {
	io.ReadCloser
	timeout time.Duration
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		err = bodyTimeoutError{b.timeout}
	}
	return n, err
}

// bodyTimeoutError is a request body that did not arrive in time.
type bodyTimeoutError struct{ after time.Duration }

func (e bodyTimeoutError) Error() string {
	return fmt.Sprintf("it did not arrive within %s", e.after)
}
func (bodyTimeoutError) Timeout() bool        { return true }
func (bodyTimeoutError) Is(target error) bool { return target == os.ErrDeadlineExceeded }
