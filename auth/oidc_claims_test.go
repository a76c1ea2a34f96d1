package auth

import (
	"slices"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/chat"
)

// A new account's name comes from preferred_username, else the local part
// of a verified e-mail, else "user", made a valid name; "local" (the user
// of -auth none) is never offered as it is.
func TestOIDCNames(t *testing.T) {
	long := strings.Repeat("a", 80)
	for _, tc := range []struct {
		p    person
		want string
	}{
		{person{preferredUsername: "Jane.Doe"}, "jane.doe"},
		{person{preferredUsername: "José García", email: "jg@example.com", emailVerified: true}, "jos-garc-a"},
		{person{preferredUsername: "  ", email: "Jane@Example.com", emailVerified: true}, "jane"},
		{person{email: "mallory@example.com"}, "user"}, // an unverified address names nobody
		{person{preferredUsername: "!!!"}, "user"},
		{person{preferredUsername: "-._jane_.-"}, "jane"},
		{person{preferredUsername: long}, long[:maxBaseName]},
		{person{preferredUsername: "LOCAL"}, "local-2"},
	} {
		names := tc.p.names()
		if len(names) == 0 || names[0] != tc.want {
			t.Errorf("names of %+v = %v, want %q first", tc.p, names, tc.want)
		}
		for _, n := range names {
			if norm, err := NormalizeName(n); err != nil || norm != n || Reserved(n) {
				t.Errorf("names of %+v offers %q: %v", tc.p, n, err)
			}
		}
		if len(names) < 10 || len(slices.Compact(slices.Clone(names))) != len(names) {
			t.Errorf("names of %+v = %v: want at least 10 distinct", tc.p, names)
		}
	}
}

// The groups claim is read at a dotted path, as a list or one string.
func TestOIDCClaimStrings(t *testing.T) {
	claims := map[string]any{
		"groups":       []any{"staff", 7, "ops"},
		"role":         "admin",
		"realm_access": map[string]any{"roles": []any{"chat-users"}},
	}
	for path, want := range map[string][]string{
		"groups": {"staff", "ops"}, "role": {"admin"}, "realm_access.roles": {"chat-users"},
	} {
		if got, found := claimStrings(claims, path); !found || !slices.Equal(got, want) {
			t.Errorf("claimStrings(%q) = %v %v, want %v", path, got, found, want)
		}
	}
	for _, path := range []string{"missing", "realm_access.missing", "role.sub"} {
		if _, found := claimStrings(claims, path); found {
			t.Errorf("claimStrings(%q) found a claim", path)
		}
	}
}

// The rules refuse with a message that says what to do: an unverified or
// missing e-mail and a foreign domain under -oidc-allowed-domains, a
// missing claim or no allowed group under -oidc-allowed-groups.
func TestOIDCAdmit(t *testing.T) {
	o := &OIDC{cfg: OIDCConfig{ProviderName: "Keycloak", AllowedDomains: []string{"example.com"},
		GroupsClaim: "groups", AllowedGroups: []string{"chat"}}}
	in := map[string]any{"groups": []any{"chat", "other"}}
	for _, tc := range []struct {
		p      person
		claims map[string]any
		reason string
		says   string
	}{
		{person{email: "jane@Example.COM", emailVerified: true}, in, "", ""},
		{person{}, in, "no_email", "did not give your e-mail address"},
		{person{email: "jane@example.com"}, in, "email_unverified", "Your e-mail address is not verified at Keycloak: verify it there and sign in again"},
		{person{email: "jane@example.org", emailVerified: true}, in, "domain_refused", "Accounts of the e-mail domain example.org may not sign in here"},
		{person{email: "jane@example.com", emailVerified: true}, map[string]any{}, "no_groups", `no "groups" claim`},
		{person{email: "jane@example.com", emailVerified: true}, map[string]any{"groups": []any{"other"}}, "group_refused", "in none of the groups"},
	} {
		reason, err := o.admit(tc.p, tc.claims)
		if reason != tc.reason || (tc.says == "") != (err == nil) ||
			err != nil && (chat.ErrorCode(err) != chat.CodeForbidden || !strings.Contains(err.Error(), tc.says)) {
			t.Errorf("admit %+v %v: %q %v; want %q saying %q", tc.p, tc.claims, reason, err, tc.reason, tc.says)
		}
	}
}
