package main

// The Host allowlist's flags against the real binary: a non-loopback
// -addr needs -allowed-hosts, malformed entries are refused. What the
// allowlist does once set (DNS rebinding refused, the security headers)
// is tested in-process: app/scenario_edge_test.go.

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// dbFingerprint is every table's row count and each thread's version,
// last seq, title and update time, read from the SQLite file (read-only) while the server runs:
// if a request changed anything a user could see, it changes.
func dbFingerprint(t *testing.T, path string) string {
	t.Helper()
	db := auditDB(t, path)
	defer db.Close()
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	var b strings.Builder
	for _, name := range tables {
		fmt.Fprintf(&b, "%s=%d ", name, queryValue[int](t, db, `SELECT count(*) FROM "`+name+`"`))
	}
	threads := queryValue[string](t, db, `SELECT coalesce(group_concat(v, ','), '') FROM (SELECT thread_id || ':' || state_version || ':' || last_seq || ':' || title || ':' || updated_at AS v FROM threads ORDER BY thread_id)`)
	if len(tables) < 5 || !strings.Contains(b.String(), "threads=") {
		t.Fatalf("the database %s has tables %v: not the gateway's?", path, tables)
	}
	return b.String() + "threads: " + threads
}

// A non-loopback -addr needs -allowed-hosts (flag, variable or settings
// file line), or '*' said explicitly; malformed entries are refused. A
// test never listens on a public address: refusals exit before opening
// anything, and acceptance is shown on 192.0.2.1 (TEST-NET-1, held by no
// interface), where the configuration passes and the listen then fails.
func TestAllowedHostsFlags(t *testing.T) {
	t.Run("required on a non-loopback address", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "gw.db")
		for _, tc := range []struct {
			env  []string
			args []string
		}{
			{nil, []string{"-addr", "0.0.0.0:0", "-auth", "password"}},
			{nil, []string{"-addr", ":0", "-auth", "password", "-allowed-hosts", " , "}},
			{[]string{"GATEWAY_ADDR=[::]:0", "GATEWAY_AUTH=password"}, nil},
			{nil, []string{"-addr", "0.0.0.0:0", "-insecure-remote"}},
		} {
			code, _, errOut := runCLI(t, tc.env, append([]string{"-db", db}, tc.args...)...)
			if code != 2 || !strings.Contains(errOut, "is not a loopback address: say which host names the server answers to with -allowed-hosts") ||
				!strings.Contains(errOut, "GATEWAY_ALLOWED_HOSTS") || !strings.Contains(errOut, "DNS rebinding") || !strings.Contains(errOut, "'*'") {
				t.Errorf("%v gateway %s: exit %d, stderr %q; want exit 2 asking for -allowed-hosts", tc.env, strings.Join(tc.args, " "), code, errOut)
			}
		}
		if exists(db) {
			t.Error("a refused start created the database")
		}
	})

	t.Run("bad entries", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "gw.db")
		for list, want := range map[string]string{
			"*.":                        `"*.": after "*." comes a host name`,
			"foo.*.example.com":         `"foo.*.example.com": a pattern is "*." and a domain`,
			"*example.com":              `"*example.com": a pattern is`,
			"https://chat.example.com":  `"https://chat.example.com" is a URL`,
			"chat.example.com:443":      `"chat.example.com:443": host names are matched without their port: give chat.example.com`,
			"chat..example.com":         `"chat..example.com" is not a host name`,
			"bücher.example":            `xn-- form`,
			"chat example.com":          `"chat example.com" is not a host name`,
			"*, chat.example.com":       `"*" answers to every name: give it alone`,
			"*.192.168.1.1":             `an address is given alone`,
			"chat.example.com,[::1":     `"[::1" is not a host name`,
			"chat.example.com,\x01oops": `is not a host name`,
		} {
			for _, addr := range []string{"127.0.0.1:0", "192.0.2.1:0"} {
				code, _, errOut := runCLI(t, nil, "-db", db, "-auth", "password", "-addr", addr, "-allowed-hosts", list)
				if code != 2 || !strings.Contains(errOut, "-allowed-hosts: ") || !strings.Contains(errOut, want) {
					t.Errorf("-addr %s -allowed-hosts %q: exit %d, stderr %q; want exit 2 saying %q", addr, list, code, errOut, want)
				}
			}
		}
		if exists(db) {
			t.Error("a refused start created the database")
		}
	})

	t.Run("accepted on a non-loopback address that is never reachable", func(t *testing.T) {
		unreachable := unreachableAddr(t)
		conf := writeConfig(t, "allowed-hosts = chat.example.test")
		for _, tc := range []struct {
			name string
			env  []string
			args []string
		}{
			{"-allowed-hosts NAME", nil, []string{"-allowed-hosts", "chat.example.test"}},
			{"-allowed-hosts PATTERN,ADDRESS", nil, []string{"-allowed-hosts", "*.example.test,192.0.2.1,[2001:db8::1]"}},
			{"GATEWAY_ALLOWED_HOSTS", []string{"GATEWAY_ALLOWED_HOSTS=chat.example.test"}, nil},
			{"settings file", nil, []string{"-config", conf}},
			{"'*'", nil, []string{"-allowed-hosts", "*"}},
		} {
			db := filepath.Join(t.TempDir(), "gw.db")
			code, errOut, served := startOrRefuse(t, tc.env, append([]string{"-addr", unreachable, "-db", db, "-auth", "password"}, tc.args...)...)
			if strings.Contains(errOut, "allowed-hosts") && !strings.Contains(errOut, "answering to every host name") {
				t.Errorf("%s on %s was refused: %s", tc.name, unreachable, errOut)
				continue
			}
			if !served && (code != 1 || !strings.Contains(errOut, "listen on "+unreachable)) {
				t.Errorf("%s on %s: exit %d, stderr %q; want the configuration accepted and the listen to fail", tc.name, unreachable, code, errOut)
			}
		}
	})
}
