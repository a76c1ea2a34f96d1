package main

// gateway health: asks a running gateway whether it is ready (GET
// /readyz), for container and orchestrator health checks and scripts.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// health is the health subcommand. It exits 0 when the server's /readyz
// answers 200 with status "ready"; 1 when it answers anything else, does
// not answer within -timeout or cannot be reached, with one line on
// stderr saying what was wrong and what to do; 2 for bad flags.
//
// The server is named by -addr, whose default is the server's own
// (GATEWAY_ADDR, else 127.0.0.1:8080), so that `gateway health` run with
// the service's environment probes the service; or by -url, its base URL
// (through a proxy, say). /readyz answers whatever the Host, so the probe
// passes the server's Host allowlist.
func health(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: gateway health [-addr HOST:PORT | -url URL] [-timeout 5s]\n\nExit 0 when the server's /readyz answers ready, 1 when not (the reason on stderr), 2 for bad flags.")
		fs.PrintDefaults()
	}
	addr := fs.String("addr", env("GATEWAY_ADDR", "127.0.0.1:8080"), "the server's listen address, as given to it (GATEWAY_ADDR); 0.0.0.0, [::] or no host are probed on 127.0.0.1 or [::1]")
	base := fs.String("url", "", "the server's base URL instead of -addr, e.g. https://chat.example.com to probe through a proxy")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	addrGiven := false
	fs.Visit(func(f *flag.Flag) { addrGiven = addrGiven || f.Name == "addr" })
	var target string
	var err error
	switch {
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected argument %q: the server is named by -addr or -url", fs.Arg(0))
	case *timeout <= 0:
		err = errors.New("-timeout must be more than 0")
	case addrGiven && *base != "":
		err = errors.New("-addr and -url both name the server: give one")
	case *base != "":
		target, err = readyzOfURL(*base)
	default:
		target, err = readyzOfAddr(*addr)
	}
	if err != nil {
		fmt.Fprintln(stderr, "gateway health:", err)
		return 2
	}
	verdict, ready := probeReadyz(target, *timeout)
	if !ready {
		fmt.Fprintln(stderr, "gateway health:", verdict)
		return 1
	}
	fmt.Fprintln(stdout, "gateway health:", verdict)
	return 0
}

// readyzOfAddr is the /readyz URL of a server listening on addr (its
// -addr): an address that listens on every interface (0.0.0.0, [::], no
// host) is probed on the loopback address of its family.
func readyzOfAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("-addr %q is not HOST:PORT (e.g. 127.0.0.1:8080)", addr)
	}
	if port == "" || port == "0" {
		return "", fmt.Errorf("-addr %s: name the port the server listens on", addr)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz", nil
}

// readyzOfURL is the /readyz URL of the server at base (a base URL, or
// its /readyz URL itself).
func readyzOfURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("-url %q is not an http:// or https:// URL with a host (e.g. https://chat.example.com)", base)
	}
	if !strings.HasSuffix(u.Path, "/readyz") {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/readyz"
	}
	u.RawQuery, u.Fragment = "", ""
	return u.String(), nil
}

// probeReadyz asks target once, within timeout, without a proxy and
// without following redirects, and says what it found: ready, or why not
// and what to do.
func probeReadyz(target string, timeout time.Duration) (verdict string, ready bool) {
	shown := target
	if u, err := url.Parse(target); err == nil {
		shown = u.Redacted()
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.Proxy = nil // the server itself, not whatever HTTP_PROXY says
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Sprintf("cannot ask %s: %v", shown, err), false
	}
	resp, err := client.Do(req)
	if err == nil {
		defer resp.Body.Close()
		var body []byte
		body, err = io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if err == nil {
			return readyzVerdict(shown, resp.StatusCode, body)
		}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // the URL is said once, redacted
	}
	switch {
	case ctx.Err() != nil:
		return fmt.Sprintf("no answer from %s within %v: the server is stuck or overloaded, or something between drops the connection; see the server's log, or allow more with -timeout", shown, timeout), false
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Sprintf("nothing answers at %s (connection refused): is the gateway running? If it listens elsewhere, name it with -addr HOST:PORT (or GATEWAY_ADDR, as for the server) or -url", shown), false
	default:
		return fmt.Sprintf("cannot reach %s: %v: is the gateway running, and is this its address (-addr, GATEWAY_ADDR, or -url)?", shown, err), false
	}
}

// readyzVerdict reads the answer of /readyz: 200 with status "ready" is
// ready; 503 carries the server's status ("starting", or "stopping": it
// drains before a stop); anything else is not a gateway's answer.
func readyzVerdict(shown string, code int, body []byte) (string, bool) {
	var answer struct {
		Status string `json:"status"`
	}
	isJSON := json.Unmarshal(body, &answer) == nil && answer.Status != ""
	switch {
	case code == http.StatusOK && isJSON && answer.Status == "ready":
		return "ready (" + shown + ")", true
	case code == http.StatusServiceUnavailable && isJSON:
		why := "the server is starting; probe again in a moment, and if it stays so see the server's log"
		if answer.Status == "stopping" {
			why = "the server is draining before it stops (it was sent SIGTERM or SIGINT); if it should keep running, see the server's log and its service manager's"
		}
		return fmt.Sprintf("not ready: %s answered %d with status %q: %s", shown, code, answer.Status, why), false
	case isJSON:
		return fmt.Sprintf("not ready: %s answered %d with status %q", shown, code, answer.Status), false
	default:
		return fmt.Sprintf("not ready: %s answered %d %s, not a gateway's readiness: is a gateway listening there? (-url is the server's base URL, e.g. https://chat.example.com)", shown, code, http.StatusText(code)), false
	}
}
