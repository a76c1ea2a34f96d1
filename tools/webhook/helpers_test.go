// Shared helpers for the webhook tests: local test services, webhook
// configurations and config files, loading them as tools, bounded waits, and
// a recorder of the requests a service received.

package webhook

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/tools"
)

const webhookSchema = `{
  "type": "object",
  "properties": {
    "order_id": {"type": "string", "minLength": 1},
    "qty": {"type": "integer", "minimum": 1}
  },
  "required": ["order_id"],
  "additionalProperties": false
}`

// bound is how long a test waits for a call that must return promptly.
const bound = 10 * time.Second

// newLocalServer starts h on 127.0.0.1 and closes it when the test ends.
func newLocalServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// releaseAtEnd closes free when the test ends, before the servers started
// earlier are closed (cleanups run last first), so that blocked handlers
// return.
func releaseAtEnd(t *testing.T, free chan struct{}) {
	t.Cleanup(func() { close(free) })
}

func hookConfig(name, contract, url string) map[string]any {
	return map[string]any{
		"name":        name,
		"description": "A test webhook.",
		"contract":    contract,
		"parameters":  json.RawMessage(webhookSchema),
		"url":         url,
	}
}

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "webhooks.json")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func configFile(t *testing.T, cfgs ...map[string]any) string {
	t.Helper()
	if cfgs == nil {
		cfgs = []map[string]any{}
	}
	data, err := json.MarshalIndent(map[string]any{"tools": cfgs}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func loadTools(t *testing.T, client *http.Client, cfgs ...map[string]any) []tools.Tool {
	t.Helper()
	ts, err := Load(writeConfig(t, configFile(t, cfgs...)), client)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != len(cfgs) {
		t.Fatalf("%d tools, want %d", len(ts), len(cfgs))
	}
	return ts
}

// loadOnlyAs loads cfg as the one tool and checks that it is a T and not
// also an Other (a Runner is not a Committer, nor the other way round).
func loadOnlyAs[T, Other any](t *testing.T, srv *httptest.Server, cfg map[string]any) T {
	t.Helper()
	tool := loadTools(t, srv.Client(), cfg)[0]
	v, ok := tool.(T)
	if !ok {
		t.Fatalf("%s is not a %v", cfg["name"], reflect.TypeFor[T]())
	}
	if _, ok := tool.(Other); ok {
		t.Fatalf("%s is a %v too", cfg["name"], reflect.TypeFor[Other]())
	}
	return v
}

func runner(t *testing.T, srv *httptest.Server, cfg map[string]any) tools.Runner {
	t.Helper()
	return loadOnlyAs[tools.Runner, tools.Committer](t, srv, cfg)
}

func committer(t *testing.T, srv *httptest.Server, cfg map[string]any) tools.Committer {
	t.Helper()
	return loadOnlyAs[tools.Committer, tools.Runner](t, srv, cfg)
}

// within runs f and fails the test if it has not returned after d.
func within(t *testing.T, d time.Duration, f func() (json.RawMessage, error)) (json.RawMessage, error) {
	t.Helper()
	ch := make(chan callResult, 1)
	go func() {
		res, err := f()
		ch <- callResult{res, err}
	}()
	select {
	case r := <-ch:
		return r.res, r.err
	case <-time.After(d):
		t.Fatalf("the call has not returned after %s", d)
		return nil, nil
	}
}

// seen is what a server received.
type seen struct {
	Method, Path, Query, Body string
	Header                    http.Header
}

type recorder struct {
	mu    sync.Mutex
	calls []seen
}

func (r *recorder) record(req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, seen{Method: req.Method, Path: req.URL.Path, Query: req.URL.RawQuery, Body: string(body), Header: req.Header.Clone()})
}

func (r *recorder) all() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.calls...)
}
