package main

// The configuration story against the real binary: a settings file, its
// precedence below environment variables and flags, its errors, the
// version command, JSON logs and the admin listener's address; and that
// apptest.CommandConfig stays what serve builds.

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/internal/apptest"
)

func writeConfig(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gateway.conf")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConfigFilePrecedence(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	for _, tc := range []struct {
		name    string
		env     []string
		args    []string
		lines   []string
		want    string // in stderr
		notWant string
	}{
		{"the file applies", nil, nil,
			[]string{"# a comment", "", "workers = 0"}, "-workers must be 1 or more", ""},
		{"the environment beats the file", []string{"GATEWAY_WORKERS=4"}, nil,
			[]string{"workers = 0", "log-format = yaml"}, `-log-format "yaml"`, "-workers"},
		{"a flag beats the file", nil, []string{"-log-format", "text"},
			[]string{"log-format = yaml", "admin-addr = 0.0.0.0:1"}, "-admin-addr 0.0.0.0:1 is not a loopback", "log-format"},
		{"GATEWAY_CONFIG names the file", []string{"GATEWAY_CONFIG="}, nil,
			[]string{"workers = 0"}, "-workers must be 1 or more", ""},
		{"an unknown setting", nil, nil,
			[]string{"addr = 127.0.0.1:0", "colour = blue"}, `line 2: no setting "colour"`, ""},
		{"a setting twice", nil, nil,
			[]string{"workers = 2", "workers = 3"}, "line 2: workers is already set on line 1", ""},
		{"a bad value", nil, nil,
			[]string{"demo-pace = fast"}, "line 1: demo-pace", ""},
		{"no equals sign", nil, nil,
			[]string{"workers 3"}, `line 1: want "name = value"`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.lines...)
			args := append([]string{"serve", "-db", db, "-addr", "127.0.0.1:0"}, tc.args...)
			env := tc.env
			if len(env) > 0 && env[0] == "GATEWAY_CONFIG=" {
				env = []string{"GATEWAY_CONFIG=" + path}
			} else {
				args = append(args, "-config", path)
			}
			code, _, stderr := runCLI(t, env, args...)
			if code != 2 || !strings.Contains(stderr, tc.want) || (tc.notWant != "" && strings.Contains(stderr, tc.notWant)) {
				t.Fatalf("exit %d, stderr %q; want 2 with %q (and without %q)", code, stderr, tc.want, tc.notWant)
			}
		})
	}
	if code, _, stderr := runCLI(t, nil, "serve", "-config", filepath.Join(t.TempDir(), "missing.conf")); code != 2 || !strings.Contains(stderr, "no such file") {
		t.Fatalf("missing file: exit %d, %q", code, stderr)
	}
	if _, err := os.Stat(db); err == nil {
		t.Fatal("a refused configuration created the database")
	}
}

// A server started from a file runs with its settings.
func TestConfigFileRunsTheServer(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	path := writeConfig(t, "auth = password", "session-ttl = 1h")
	srv := startServerWith(t, db, "5ms", "-config", path)
	resp, err := http.Get(srv.base + "/api/threads")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /api/threads under auth = password from the file: %d %s, want 401", resp.StatusCode, body)
	}
	srv.Stop()
}

func TestVersionAndJSONLogs(t *testing.T) {
	code, out, _ := runCLI(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "gateway ") || !strings.Contains(out, "go1.") {
		t.Fatalf("version: exit %d, %q", code, out)
	}
	// JSON logs: every line one object; the refusal below is logged
	// before exit, so one run suffices.
	db := filepath.Join(t.TempDir(), "gw.db")
	code, _, stderr := runCLI(t, nil, "serve", "-db", db, "-addr", "127.0.0.1:0", "-log-format", "json", "-tools-config", filepath.Join(t.TempDir(), "none.json"))
	if code == 0 {
		t.Fatalf("serve with a missing tools config exited 0")
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for _, l := range lines {
		var obj map[string]any
		if err := json.Unmarshal([]byte(l), &obj); err != nil || obj["level"] == nil || obj["msg"] == nil {
			t.Fatalf("log line is not a JSON record with level and msg: %q", l)
		}
	}
}

// Every setting names its environment variable in its help, in the form
// the settings file reads to keep the variable above the file.
func TestEverySettingNamesItsVariable(t *testing.T) {
	_, _, help := runCLI(t, nil, "serve", "-h")
	var flagName string
	usage := map[string]string{}
	for _, line := range strings.Split(help, "\n") {
		if strings.HasPrefix(line, "  -") {
			flagName = strings.Fields(line)[0]
			continue
		}
		if flagName != "" {
			usage[flagName] += line
		}
	}
	if len(usage) < 30 {
		t.Fatalf("read %d settings from serve -h, want them all:\n%s", len(usage), help)
	}
	for name, u := range usage {
		if !envOfFlag.MatchString(u) {
			t.Errorf("%s does not name its variable as \"(GATEWAY_…\": %q", name, u)
		}
	}
}

// The scenario tests of package app start from apptest.CommandConfig: it
// must stay what the serve command builds from -addr, -db and -demo-pace
// alone, or those tests would run a gateway the command never does.
func TestCommandConfigIsWhatServeBuilds(t *testing.T) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "GATEWAY_") && !strings.HasPrefix(name, "GATEWAY_TEST_") {
			t.Setenv(name, "")
		}
	}
	db := filepath.Join(t.TempDir(), "gw.db")
	cfg, err := parseServe([]string{"-addr", "127.0.0.1:0", "-db", db, "-demo-pace", "7ms"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := apptest.CommandConfig(db, 7*time.Millisecond); !reflect.DeepEqual(cfg.Config, want) {
		t.Errorf("serve -addr 127.0.0.1:0 -db DB -demo-pace 7ms builds\n%+v\napptest.CommandConfig is\n%+v", cfg.Config, want)
	}
}

// A public -admin-addr is refused at start: profiles show the process's
// memory. (What the admin listener serves is tested in-process:
// app/scenario_edge_test.go's TestAdminListener.)
func TestAdminAddrMustBeLoopback(t *testing.T) {
	if code, _, stderr := runCLI(t, nil, "serve", "-admin-addr", "0.0.0.0:0"); code != 2 || !strings.Contains(stderr, "not a loopback address") {
		t.Fatalf("public admin address: exit %d, %q", code, stderr)
	}
}
