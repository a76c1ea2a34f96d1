package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

// Header values for the model endpoint are often credentials: they come
// from GATEWAY_OPENAI_HEADERS or a file, never a flag (which every user
// of the machine can read in the process list). -openai-header is refused
// whatever the header, on the command line and in the settings file, with
// a message saying where the headers go, and without repeating the value.
func TestCLIOpenAIHeadersNeverFromFlags(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "never.db")
	const secret = "Bearer sk-header-secret"
	badFile := filepath.Join(dir, "bad-headers")
	os.WriteFile(badFile, []byte("# extra headers\nX-Ok: 1\nbroken "+secret+"\n"), 0o600)
	dupFile := filepath.Join(dir, "dup-headers")
	os.WriteFile(dupFile, []byte("x-api-key: 1\nX-Api-Key: "+secret+"\n"), 0o600)
	goodFile := filepath.Join(dir, "headers")
	os.WriteFile(goodFile, []byte("X-Api-Key: k\n"), 0o600)
	settings := writeConfig(t, "model = openai", "openai-model = m", "openai-header = Authorization: "+secret)
	base := []string{"-addr", "127.0.0.1:0", "-db", db, "-model", "openai", "-openai-base-url", "http://127.0.0.1:1/v1", "-openai-model", "m"}
	flagMessage := "Put the headers in GATEWAY_OPENAI_HEADERS (Name: value, comma-separated) or in a file named by -openai-headers-file"
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"Authorization as a flag", nil, []string{"-openai-header", "Authorization: " + secret}, flagMessage},
		{"api-key as a flag", nil, []string{"-openai-header=api-key: " + secret}, flagMessage},
		{"x-api-key as a double-dash flag", nil, []string{"--openai-header", "x-api-key: " + secret}, flagMessage},
		{"any header as a flag", nil, []string{"-openai-header", "X-Title: demo " + secret}, flagMessage},
		{"in the settings file", nil, []string{"-config", settings}, flagMessage},
		{"env and file", []string{"GATEWAY_OPENAI_HEADERS=X-A: 1"}, []string{"-openai-headers-file", goodFile}, "not both"},
		{"bad line in the file", nil, []string{"-openai-headers-file", badFile}, "line 3 of " + badFile + " is not of the form Name: value"},
		{"a header twice in the file", nil, []string{"-openai-headers-file", dupFile}, "sets the header X-Api-Key a second time"},
		{"missing file", nil, []string{"-openai-headers-file", filepath.Join(dir, "nope")}, filepath.Join(dir, "nope")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{}, base...), tc.args...)
			if tc.name == "in the settings file" {
				args = []string{"-addr", "127.0.0.1:0", "-db", db, "-config", settings}
			}
			code, out, errOut := runCLI(t, tc.env, args...)
			if code != 2 || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr %q, stdout %q; want exit 2 and %q", code, errOut, out, tc.want)
			}
			if strings.Contains(errOut+out, "sk-header-secret") {
				t.Errorf("the output repeats the header's value: %q", errOut)
			}
			if _, err := os.Stat(db); err == nil {
				t.Fatalf("a refused configuration created the database %s", db)
			}
		})
	}
}

// The headers of GATEWAY_OPENAI_HEADERS and of -openai-headers-file reach
// the endpoint (a file line may hold commas), and the log shows no value.
func TestBinaryOpenAIHeadersFromEnvAndFile(t *testing.T) {
	dir := t.TempDir()
	headersFile := filepath.Join(dir, "headers")
	if err := os.WriteFile(headersFile, []byte("# for the router\nAuthorization: Bearer from-the-file\n\nX-Route: a, b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		env   []string
		flags []string
		want  map[string]string
	}{
		{"environment", []string{"GATEWAY_OPENAI_HEADERS=X-Api-Key: from-the-env, X-Title: demo"}, nil,
			map[string]string{"X-Api-Key": "from-the-env", "X-Title": "demo"}},
		{"file", nil, []string{"-openai-headers-file", headersFile},
			map[string]string{"Authorization": "Bearer from-the-file", "X-Route": "a, b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := apptest.NewFakeOpenAI(t)
			srv := startServerEnv(t, tc.env, filepath.Join(t.TempDir(), "gw.db"), "0s",
				append([]string{"-model", "openai", "-openai-base-url", fake.URL + "/v1", "-openai-model", "test-model"}, tc.flags...)...)
			th := srv.CreateThread()
			evs := srv.Events(th.ThreadID, th.LastSeq)
			defer evs.Close()
			ack := srv.StartRun(th.ThreadID, th.StateVersion, "hello")
			evs.WaitFor(time.Now().Add(20*time.Second), "run.completed", func(ev client.Event) bool {
				if ev.RunID == ack.RunID && ev.Type == chat.EventRunFailed {
					t.Fatalf("run failed: %s", ev.Raw)
				}
				return ev.Type == chat.EventRunCompleted && ev.RunID == ack.RunID
			})
			seen := fake.Headers()
			if len(seen) == 0 {
				t.Fatal("the endpoint saw no request")
			}
			for name, want := range tc.want {
				if got := seen[0].Get(name); got != want {
					t.Errorf("%s: %q, want %q", name, got, want)
				}
			}
			srv.Stop()
			logs := srv.Stderr()
			for _, v := range tc.want {
				if strings.Contains(logs, v) && v != "demo" {
					t.Errorf("the log shows the header value %q", v)
				}
			}
		})
	}
}
