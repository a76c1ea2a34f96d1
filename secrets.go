package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/honestcancel/gateway/app"
)

// secretSetting resolves one secret setting (what names it in errors, "the
// OpenAI API key") that may come from the environment (envName) or from a file named by a -…-file flag (fileFlag,
// whose value is path): never from a flag holding the secret itself, which
// every user of the machine could read in the process list. It answers ""
// when neither is set. The secret's value never appears in an error.
//
// The file's content is trimmed of surrounding white space (a trailing
// newline is what editors and `echo` leave); an empty or unreadable file is
// an error that names the flag and the file.
func secretSetting(what, envName, fileFlag, path string) (string, error) {
	fromEnv := os.Getenv(envName)
	if path == "" {
		return strings.TrimSpace(fromEnv), nil
	}
	if fromEnv != "" {
		return "", fmt.Errorf("%s is set twice: use %s or -%s (%s_FILE), not both", what, envName, fileFlag, envName)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return "", fmt.Errorf("-%s: cannot read %s (%s): %v", fileFlag, path, what, err)
	}
	secret := strings.TrimSpace(string(data))
	if secret == "" {
		return "", fmt.Errorf("-%s: %s is empty: put %s in it", fileFlag, path, what)
	}
	return secret, nil
}

// urlFromFile gives the setting name (-db, -nats: a URL that may hold a
// password, what names it in errors) the content of the file its
// -name-file flag names (path; "" leaves *value as it is). The URL must
// then come from that file only: one also given by -name, by envName or
// by the settings file is an error naming both, since which of the two
// was meant cannot be known. An empty -name counts as not given.
func urlFromFile(fs *flag.FlagSet, name, envName, what, path string, value *string) error {
	if path == "" {
		return nil
	}
	given := os.Getenv(envName) != ""
	fs.Visit(func(f *flag.Flag) { given = given || (f.Name == name && f.Value.String() != "") })
	if given {
		return fmt.Errorf("%s is set twice: by -%s (%s, or %q in the settings file) and by -%s-file (%s_FILE); keep one: -%s-file for a URL with a password, which -%s would show in process lists", what, name, envName, name, name, envName, name, name)
	}
	v, err := secretSetting(what, envName, name+"-file", path)
	if err != nil {
		return err
	}
	*value = v
	return nil
}

// hideSecretDefaults keeps the defaults of the named flags, which come
// from their environment variables (GATEWAY_DB, GATEWAY_NATS) and may hold
// a password, out of -h: it prints them redacted (app.RedactedURL).
func hideSecretDefaults(fs *flag.FlagSet, names ...string) {
	for _, name := range names {
		if f := fs.Lookup(name); f != nil {
			f.DefValue = app.RedactedURL(f.DefValue)
		}
	}
}

// checkURLs refuses a PostgreSQL -db (kind "postgres") or a -nats list
// (kind "nats") that does not parse as URLs, before the store or the NATS
// client could: their errors would quote it, password and all. The
// message says what is wrong with the form, never the value.
func checkURLs(flagName, kind, raw string) error {
	parts := []string{raw}
	if kind == "nats" {
		parts = strings.Split(raw, ",")
	}
	for _, p := range parts {
		if _, err := url.Parse(strings.TrimSpace(p)); err != nil {
			example, special := "postgres://USER:PASSWORD@HOST:5432/DB", "% : / ? # [ ] @"
			if kind == "nats" {
				example, special = "nats://USER:PASSWORD@HOST:4222 (several servers: comma-separated)", "% : / ? # [ ] @ ,"
			}
			return fmt.Errorf("%s does not parse as a URL (it is not shown: it may hold a password): write it as %s, with any of %s in the user name or password percent-encoded (@ as %%40, %% as %%25)", flagName, example, special)
		}
	}
	return nil
}
