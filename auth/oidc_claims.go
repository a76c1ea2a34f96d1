package auth

// What a verified ID token says about the person, the rules that admit
// them (e-mail domain, groups), and the name a new account gets.

import (
	"crypto/rand"
	"fmt"
	"slices"
	"strings"

	"github.com/honestcancel/gateway/chat"
)

// person is what the gateway reads of a verified ID token.
type person struct {
	subject           string
	email             string // as given, "" when none
	emailVerified     bool
	preferredUsername string
}

// personOf reads the standard claims of a verified ID token.
func personOf(subject string, claims map[string]any) person {
	p := person{subject: subject}
	p.email, _ = claims["email"].(string)
	p.email = strings.TrimSpace(p.email)
	switch v := claims["email_verified"].(type) {
	case bool:
		p.emailVerified = v
	case string: // (some providers send it as a string)
		p.emailVerified = strings.EqualFold(v, "true")
	}
	p.preferredUsername, _ = claims["preferred_username"].(string)
	return p
}

// domain is the lower-case domain of the person's e-mail ("" without
// one).
func (p person) domain() string {
	at := strings.LastIndexByte(p.email, '@')
	if at < 0 {
		return ""
	}
	return strings.ToLower(p.email[at+1:])
}

// admit applies the configured rules to a verified sign-in: nil, or the
// refusal (a *chat.Error saying what to do) with its audit reason.
func (o *OIDC) admit(p person, claims map[string]any) (string, error) {
	name := o.cfg.ProviderName
	if len(o.cfg.AllowedDomains) > 0 {
		switch {
		case p.email == "" || p.domain() == "":
			return "no_email", chat.Errorf(chat.CodeForbidden, "%s did not give your e-mail address, which this server "+
				"needs to admit you: allow it to share it (the email scope), or ask your administrator", name)
		case !p.emailVerified:
			return "email_unverified", chat.Errorf(chat.CodeForbidden, "Your e-mail address is not verified at %s: "+
				"verify it there and sign in again", name)
		case !slices.Contains(o.cfg.AllowedDomains, p.domain()):
			return "domain_refused", chat.Errorf(chat.CodeForbidden, "Accounts of the e-mail domain %s may not sign in "+
				"here: sign in at %s with an address of %s, or ask your administrator", p.domain(), name,
				strings.Join(o.cfg.AllowedDomains, ", "))
		}
	}
	if len(o.cfg.AllowedGroups) > 0 {
		groups, found := claimStrings(claims, o.cfg.GroupsClaim)
		if !found {
			return "no_groups", chat.Errorf(chat.CodeForbidden, "%s's answer holds no %q claim, which lists the groups "+
				"this server admits: your administrator must have %s send it", name, o.cfg.GroupsClaim, name)
		}
		if !slices.ContainsFunc(groups, func(g string) bool { return slices.Contains(o.cfg.AllowedGroups, g) }) {
			return "group_refused", chat.Errorf(chat.CodeForbidden, "Your account at %s is in none of the groups "+
				"allowed to sign in here: ask your administrator to add you to one", name)
		}
	}
	return "", nil
}

// claimStrings reads the claim at path (dot-separated: realm_access.roles)
// as a list of strings: an array of strings, or one string. found is false
// when the claim is absent.
func claimStrings(claims map[string]any, path string) (values []string, found bool) {
	var v any = claims
	for _, part := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[part]; !ok {
			return nil, false
		}
	}
	switch v := v.(type) {
	case string:
		return []string{v}, true
	case []any:
		for _, e := range v {
			if s, ok := e.(string); ok {
				values = append(values, s)
			}
		}
		return values, true
	}
	return nil, true
}

// maxBaseName leaves a new account's name room for a suffix within the
// 64 characters NormalizeName allows.
const maxBaseName = 56

// names are the user names a new account of p is offered, best first:
// its preferred_username made a valid name, else the local part of its
// verified e-mail, else "user"; then the same with -2 … -9 and three random
// suffixes. The name never decides who the person is (issuer and subject
// do), so a taken name only moves the new account to the next one.
func (p person) names() []string {
	base := nameFrom(p.preferredUsername)
	if base == "" && p.emailVerified {
		if at := strings.LastIndexByte(p.email, '@'); at > 0 {
			base = nameFrom(p.email[:at])
		}
	}
	if base == "" {
		base = "user"
	}
	var out []string
	if !Reserved(base) {
		out = append(out, base)
	}
	for i := 2; i <= 9; i++ {
		out = append(out, fmt.Sprintf("%s-%d", base, i))
	}
	for range 3 {
		out = append(out, base+"-"+strings.ToLower(rand.Text()[:6]))
	}
	return out
}

// nameFrom makes s a valid user name (NormalizeName): lower case, every
// run of other characters one '-', no separator at either end, at most
// maxBaseName characters; "" when nothing is left.
func nameFrom(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("._@", r):
			b.WriteRune(r)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
		if b.Len() >= maxBaseName {
			break
		}
	}
	n := strings.Trim(b.String(), "-._@")
	if _, err := NormalizeName(n); err != nil {
		return ""
	}
	return n
}
