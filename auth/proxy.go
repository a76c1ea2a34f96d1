package auth

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ParsePrefixes reads a comma-separated list of addresses and CIDR
// prefixes ("127.0.0.1, 10.0.0.0/8").
func ParsePrefixes(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("-trusted-proxies: %q is neither an address nor a CIDR prefix", f)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

func remoteAddr(r *http.Request) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, err := netip.ParseAddr(host)
	return a.Unmap(), err == nil
}

func (a *Authenticator) trusted(addr netip.Addr) bool {
	for _, p := range a.cfg.TrustedProxies {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

func (a *Authenticator) fromTrustedProxy(r *http.Request) bool {
	addr, ok := remoteAddr(r)
	return ok && a.trusted(addr)
}

// ClientIP is the address the request came from: the peer, or, when the
// peer is a trusted proxy, the nearest untrusted address of
// X-Forwarded-For.
func (a *Authenticator) ClientIP(r *http.Request) string {
	addr, ok := remoteAddr(r)
	if !ok {
		return r.RemoteAddr
	}
	if !a.trusted(addr) {
		return addr.String()
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		h, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break
		}
		if h = h.Unmap(); !a.trusted(h) {
			return h.String()
		}
	}
	return addr.String()
}

// secure says whether cookies must carry Secure: forced, or the request
// came over HTTPS.
func (a *Authenticator) secure(r *http.Request) bool {
	return a.cfg.SecureCookies || a.HTTPS(r)
}

// HTTPS reports whether r reached the server over HTTPS: TLS on this
// connection, or a trusted proxy that terminated TLS and says so in
// X-Forwarded-Proto.
func (a *Authenticator) HTTPS(r *http.Request) bool {
	return r.TLS != nil ||
		(a.fromTrustedProxy(r) && strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https"))
}
