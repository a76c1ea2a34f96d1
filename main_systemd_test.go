package main

// deploy/gateway.service checked by systemd's own tools, which need no
// running systemd: `systemd-analyze verify` (every directive known and
// valid, the executable present) and `systemd-analyze security
// --offline=yes` (the exposure score docs/operations.md gives).

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/auth"
)

// TestSystemdUnit: the unit alone, with the drop-in deploy/credentials.conf,
// and with every directive the drop-in has commented out enabled too,
// passes `systemd-analyze verify` without a word; a misspelt directive
// does not (verify only warns about one, and exits 0: the test fails on
// any output).
func TestSystemdUnit(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed, so deploy/gateway.service is not checked: apt-get install -y systemd (it needs no running systemd)")
	}
	// verify checks that ExecStart's program exists: point it at a build.
	const shipped = "ExecStart=/usr/local/bin/gateway serve\n"
	unit := readDoc(t, "deploy/gateway.service")
	if n := strings.Count(unit, shipped); n != 1 {
		t.Fatalf("deploy/gateway.service has %q %d times, want once", shipped, n)
	}
	unit = strings.Replace(unit, shipped, "ExecStart="+gatewayBinary(t)+" serve\n", 1)
	dropIn := readDoc(t, "deploy/credentials.conf")
	everyCredential := regexp.MustCompile(`(?m)^#((LoadCredential|Environment)=)`).ReplaceAllString(dropIn, "$1")
	if everyCredential == dropIn {
		t.Fatal("deploy/credentials.conf has no commented-out LoadCredential= or Environment= line; update this test")
	}

	for _, tc := range []struct {
		name, unit, dropIn string
		ok                 bool
	}{
		{"as shipped", unit, "", true},
		{"with the credentials drop-in", unit, dropIn, true},
		{"with every credential", unit, everyCredential, true},
		{"a misspelt directive", strings.Replace(unit, "NoNewPrivileges=yes", "NoNewPrivilegez=yes", 1), "", false},
		{"a misspelt directive in the drop-in", unit, strings.Replace(dropIn, "LoadCredential=", "LoadCredentials=", 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeUnit(t, tc.unit, tc.dropIn)
			out, err := systemdAnalyze(t, analyze, "verify", "--man=no", path)
			switch {
			case tc.ok && (err != nil || out != ""):
				t.Errorf("systemd-analyze verify: %v\n%s", err, out)
			case !tc.ok && err == nil && out == "":
				t.Error("systemd-analyze verify said nothing about a misspelt directive: this test would not catch one")
			}
		})
	}

	t.Run("security", func(t *testing.T) {
		out, err := systemdAnalyze(t, analyze, "security", "--offline=yes", writeUnit(t, unit, ""))
		m := regexp.MustCompile(`Overall exposure level for gateway\.service: (\d+\.\d)`).FindStringSubmatch(out)
		if err != nil || m == nil {
			t.Fatalf("systemd-analyze security --offline=yes: %v\n%s", err, out)
		}
		ops := strings.Join(strings.Fields(readDoc(t, "docs/operations.md")), " ")
		if doc := "`systemd-analyze security --offline=yes` rates its exposure " + m[1]; !strings.Contains(ops, doc) {
			t.Errorf("docs/operations.md does not say %q: the unit's exposure is %s now\n%s", doc, m[1], out)
		}
	})
}

// TestSystemdUnitSettings: the settings the unit gives in Environment=
// lines, with the GATEWAY_ALLOWED_HOSTS line docs/operations.md puts in
// /etc/gateway/gateway.env, are a configuration the server accepts: -auth
// password on 127.0.0.1:8080, the database in the state directory, the
// proxy on the same machine trusted.
func TestSystemdUnitSettings(t *testing.T) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "GATEWAY_") {
			t.Setenv(name, "") // the unit's settings, not this machine's
		}
	}
	t.Setenv("GATEWAY_ALLOWED_HOSTS", "chat.example.com")
	n := 0
	for _, line := range strings.Split(readDoc(t, "deploy/gateway.service"), "\n") {
		if kv, ok := strings.CutPrefix(line, "Environment="); ok {
			name, value, _ := strings.Cut(kv, "=")
			t.Setenv(name, value)
			n++
		}
	}
	c, err := parseServe(nil, io.Discard)
	if err != nil || n == 0 {
		t.Fatalf("the unit's %d settings: %v", n, err)
	}
	if c.Addr != "127.0.0.1:8080" || c.DB != "/var/lib/gateway/gateway.db" || c.AuthMode != auth.ModePassword || len(c.TrustedProxies) != 2 {
		t.Errorf("the unit's settings give -addr %s -db %s -auth %s -trusted-proxies %v; want 127.0.0.1:8080, /var/lib/gateway/gateway.db, password and 127.0.0.1 and ::1",
			c.Addr, c.DB, c.AuthMode, c.TrustedProxies)
	}

	// Every variable the credentials drop-in sets, used or commented out,
	// is one the server reads.
	var help strings.Builder
	parseServe([]string{"-h"}, &help)
	vars := regexp.MustCompile(`(?m)^#?Environment=(GATEWAY_[A-Z_]+)=`).FindAllStringSubmatch(readDoc(t, "deploy/credentials.conf"), -1)
	if len(vars) == 0 {
		t.Fatal("deploy/credentials.conf sets no GATEWAY_ variable")
	}
	for _, m := range vars {
		if !strings.Contains(help.String(), "("+m[1]+")") {
			t.Errorf("deploy/credentials.conf sets %s, which serve -h does not name", m[1])
		}
	}
}

// writeUnit writes unit as gateway.service to a folder of the test's, with
// dropIn (if any) as its drop-in gateway.service.d/credentials.conf, and
// returns the unit's path.
func writeUnit(t *testing.T, unit, dropIn string) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.service")
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	if dropIn != "" {
		if err := os.Mkdir(path+".d", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(path+".d", "credentials.conf"), []byte(dropIn), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// systemdAnalyze runs systemd-analyze with args (bounded) and returns what
// it wrote, stdout and stderr together, and its error.
func systemdAnalyze(t *testing.T, analyze string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, analyze, args...)
	cmd.Env = append(os.Environ(), "SYSTEMD_COLORS=0", "SYSTEMD_PAGER=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("systemd-analyze %s did not end within 30s", strings.Join(args, " "))
	}
	return out.String(), err
}
