package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// The optional configuration file (-config FILE or GATEWAY_CONFIG): one
// setting per line, named like its flag without the dash,
//
//	# comments and blank lines are ignored
//	addr = 0.0.0.0:8080
//	auth = password
//
// Precedence, highest first: a flag on the command line, its environment
// variable, the file, the built-in default. Secrets have no flag (the
// OpenAI key is read from GATEWAY_OPENAI_API_KEY or a key file, its extra
// headers from GATEWAY_OPENAI_HEADERS or a headers file), so they cannot
// end up in it either.

// envOfFlag reads a flag's environment variable from its usage text, where
// every flag names it: "... (GATEWAY_ADDR)".
var envOfFlag = regexp.MustCompile(`\((GATEWAY_[A-Z0-9_]+)`)

// applyConfigFile sets, from the file at path, every flag that neither the
// command line (set) nor its environment variable gave a value.
func applyConfigFile(fs *flag.FlagSet, path string, set map[string]bool) error {
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("-config %s: %v", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	seen := map[string]int{}
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		name, value = strings.TrimSpace(name), strings.Trim(strings.TrimSpace(value), `"`)
		if !ok || name == "" {
			return fmt.Errorf("%s line %d: want \"name = value\", for example \"addr = 127.0.0.1:8080\"", path, n)
		}
		if err, gone := removedSettings[name]; gone {
			return fmt.Errorf("%s line %d: %w", path, n, err)
		}
		fl := fs.Lookup(name)
		if fl == nil || name == "config" {
			return fmt.Errorf("%s line %d: no setting %q (the settings are the flags of gateway serve -h, without the dash)", path, n, name)
		}
		if prev, dup := seen[name]; dup {
			return fmt.Errorf("%s line %d: %s is already set on line %d", path, n, name, prev)
		}
		seen[name] = n
		if set[name] {
			continue // the command line wins
		}
		if m := envOfFlag.FindStringSubmatch(fl.Usage); m != nil && env(m[1], "") != "" {
			continue // so does the environment
		}
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("%s line %d: %s: %v", path, n, name, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("-config %s: %w", path, err)
	}
	return nil
}
