package main

// The flags of sign-in through an OpenID Connect provider (-oidc-…), and
// how they combine with -auth: a provider needs accounts, so it works with
// -auth oidc (the provider only) or -auth password (passwords and the
// provider, side by side); -auth none and header refuse it.

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	"github.com/honestcancel/gateway/auth"
)

// oidcSettings are the -oidc-… flags as given. The client secret has no
// flag: it comes from GATEWAY_OIDC_CLIENT_SECRET or the file
// -oidc-client-secret-file names (secretSetting).
type oidcSettings struct {
	issuer, clientID, secretFile, redirectURL, scopes string
	domains, groupsClaim, groups, providerName        string
}

func oidcFlags(fs *flag.FlagSet) *oidcSettings {
	o := &oidcSettings{}
	fs.StringVar(&o.issuer, "oidc-issuer", env("GATEWAY_OIDC_ISSUER", ""), "sign in through this OpenID Connect provider: its issuer URL, exactly as its discovery document names it (https://keycloak.example.com/realms/NAME); needs -auth oidc or password; empty: no provider (GATEWAY_OIDC_ISSUER)")
	fs.StringVar(&o.clientID, "oidc-client-id", env("GATEWAY_OIDC_CLIENT_ID", ""), "-oidc-issuer: the client id registered at the provider for this server (GATEWAY_OIDC_CLIENT_ID)")
	fs.StringVar(&o.secretFile, "oidc-client-secret-file", env("GATEWAY_OIDC_CLIENT_SECRET_FILE", ""), "-oidc-issuer: file holding the client's secret (GATEWAY_OIDC_CLIENT_SECRET_FILE); or set GATEWAY_OIDC_CLIENT_SECRET. Never a flag")
	fs.StringVar(&o.redirectURL, "oidc-redirect-url", env("GATEWAY_OIDC_REDIRECT_URL", ""), "-oidc-issuer: this server's callback as registered at the provider, https://HOST/auth/oidc/callback (GATEWAY_OIDC_REDIRECT_URL)")
	fs.StringVar(&o.scopes, "oidc-scopes", env("GATEWAY_OIDC_SCOPES", "openid email profile"), "-oidc-issuer: the scopes asked for, separated by spaces; must hold openid (GATEWAY_OIDC_SCOPES)")
	fs.StringVar(&o.domains, "oidc-allowed-domains", env("GATEWAY_OIDC_ALLOWED_DOMAINS", ""), "-oidc-issuer: admit only users whose e-mail address, verified by the provider, is in one of these domains, comma-separated (example.com); empty: any (GATEWAY_OIDC_ALLOWED_DOMAINS)")
	fs.StringVar(&o.groupsClaim, "oidc-groups-claim", env("GATEWAY_OIDC_GROUPS_CLAIM", "groups"), "-oidc-allowed-groups: the ID token claim listing the user's groups; a dotted path reaches into objects (realm_access.roles) (GATEWAY_OIDC_GROUPS_CLAIM)")
	fs.StringVar(&o.groups, "oidc-allowed-groups", env("GATEWAY_OIDC_ALLOWED_GROUPS", ""), "-oidc-issuer: admit only users in one of these groups (of -oidc-groups-claim), comma-separated; empty: any (GATEWAY_OIDC_ALLOWED_GROUPS)")
	fs.StringVar(&o.providerName, "oidc-provider-name", env("GATEWAY_OIDC_PROVIDER_NAME", ""), "-oidc-issuer: the provider's name on the sign-in button, \"Sign in with NAME\"; empty: the issuer's host name (GATEWAY_OIDC_PROVIDER_NAME)")
	return o
}

// settings checks the -oidc-… flags against the rest of c (its -auth and
// the host names it answers to) and returns the provider's configuration
// (zero without -oidc-issuer). It makes no request: the provider is read
// when the server starts.
func (o *oidcSettings) settings(c *config) (auth.OIDCConfig, error) {
	issuer := strings.TrimSpace(o.issuer)
	if issuer == "" {
		if c.AuthMode == auth.ModeOIDC {
			return auth.OIDCConfig{}, errors.New("-auth oidc needs a provider: set -oidc-issuer, -oidc-client-id, -oidc-redirect-url and the client secret (GATEWAY_OIDC_CLIENT_SECRET or -oidc-client-secret-file); see docs/accounts.md")
		}
		if o.clientID != "" || o.secretFile != "" || o.redirectURL != "" || o.domains != "" || o.groups != "" || o.providerName != "" {
			return auth.OIDCConfig{}, errors.New("-oidc-… settings are given but -oidc-issuer is not: set it to the provider's issuer URL, or remove them")
		}
		return auth.OIDCConfig{}, nil
	}
	switch c.AuthMode {
	case auth.ModeOIDC, auth.ModePassword:
	case auth.ModeHeader:
		return auth.OIDCConfig{}, errors.New("-oidc-issuer does not work with -auth header, where the proxy names the user: use -auth oidc (or password, to keep passwords too), or let the proxy sign users in through the provider")
	default:
		return auth.OIDCConfig{}, fmt.Errorf("-oidc-issuer needs accounts, which -auth %s does not have: use -auth oidc (sign in through the provider only) or -auth password (passwords and the provider)", c.AuthMode)
	}
	u, err := url.Parse(issuer)
	if err != nil || u.Host == "" || (u.Scheme != "https" && !(u.Scheme == "http" && loopback(net.JoinHostPort(u.Hostname(), "0")))) ||
		u.RawQuery != "" || u.Fragment != "" {
		return auth.OIDCConfig{}, fmt.Errorf("-oidc-issuer %q: use the provider's https:// issuer URL, without query or fragment (plain http only on a loopback address)", issuer)
	}
	cfg := auth.OIDCConfig{Issuer: issuer, ClientID: strings.TrimSpace(o.clientID), ProviderName: strings.TrimSpace(o.providerName),
		GroupsClaim: strings.TrimSpace(o.groupsClaim)}
	if cfg.ClientID == "" {
		return cfg, errors.New("-oidc-issuer needs -oidc-client-id (GATEWAY_OIDC_CLIENT_ID): the id of the client registered at the provider for this server")
	}
	if cfg.ClientSecret, err = secretSetting("the OIDC client secret", "GATEWAY_OIDC_CLIENT_SECRET", "oidc-client-secret-file", o.secretFile); err != nil {
		return cfg, err
	}
	if cfg.ClientSecret == "" {
		return cfg, errors.New("-oidc-issuer needs the client's secret: set GATEWAY_OIDC_CLIENT_SECRET or -oidc-client-secret-file (never a flag: flags show in process lists)")
	}
	if cfg.RedirectURL, err = oidcRedirectURL(o.redirectURL, c); err != nil {
		return cfg, err
	}
	cfg.Scopes = strings.FieldsFunc(o.scopes, func(r rune) bool { return r == ' ' || r == ',' })
	if !slices.Contains(cfg.Scopes, "openid") {
		return cfg, fmt.Errorf("-oidc-scopes %q must hold openid: without it the provider sends no ID token", o.scopes)
	}
	for _, d := range oidcList(o.domains) {
		d = strings.ToLower(strings.TrimPrefix(d, "@"))
		if strings.ContainsAny(d, "@/: ") || !strings.Contains(d, ".") {
			return cfg, fmt.Errorf("-oidc-allowed-domains: %q is not an e-mail domain (like example.com)", d)
		}
		cfg.AllowedDomains = append(cfg.AllowedDomains, d)
	}
	cfg.AllowedGroups = oidcList(o.groups)
	if len(cfg.AllowedGroups) > 0 && cfg.GroupsClaim == "" {
		return cfg, errors.New("-oidc-allowed-groups needs -oidc-groups-claim: the claim that lists the user's groups")
	}
	if len([]rune(cfg.ProviderName)) > 40 {
		return cfg, fmt.Errorf("-oidc-provider-name %q is longer than 40 characters: it is a button's label", cfg.ProviderName)
	}
	return cfg, nil
}

// oidcRedirectURL checks -oidc-redirect-url: an absolute http(s) URL of this
// server's callback (path /auth/oidc/callback) on a host name it answers
// to, or the provider would send browsers where nothing finishes the
// sign-in.
func oidcRedirectURL(raw string, c *config) (string, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return "", errors.New("-oidc-issuer needs -oidc-redirect-url (GATEWAY_OIDC_REDIRECT_URL): this server's address as browsers reach it, ending in /auth/oidc/callback (https://chat.example.com/auth/oidc/callback), registered at the provider as the client's redirect URI")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Path != "/auth/oidc/callback" ||
		u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("-oidc-redirect-url %q: use this server's address as browsers reach it, ending in /auth/oidc/callback (https://chat.example.com/auth/oidc/callback), without query", raw)
	}
	if !c.Hosts.Allows(u.Host) {
		return "", fmt.Errorf("-oidc-redirect-url %q names the host %s, which this server does not answer to: add it to -allowed-hosts, or use the name browsers reach the server by", raw, u.Hostname())
	}
	return raw, nil
}

// oidcList splits a comma-separated setting, dropping blanks.
func oidcList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}
