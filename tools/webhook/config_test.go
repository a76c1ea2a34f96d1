// Webhook configuration: the errors a bad config reports, secrets in
// headers kept out of errors, loading the testdata configs, New, and leaving
// MCP servers to package mcp.

package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/catalog"
)

func TestWebhookConfigErrors(t *testing.T) {
	t.Setenv("WEBHOOK_TEST_TOKEN", "tok")
	base := func(mod func(m map[string]any)) string {
		m := hookConfig("t1", tools.Idempotent, "https://api.example.com/t1")
		mod(m)
		return configFile(t, m)
	}
	for _, tc := range []struct {
		name    string
		content string
		want    []string
	}{
		{"missing name", base(func(m map[string]any) { delete(m, "name") }),
			[]string{`tools[0]: field "name": is required`}},
		{"bad name", base(func(m map[string]any) { m["name"] = "Lookup-Order" }),
			[]string{`tool "Lookup-Order" (tools[0]): field "name": "Lookup-Order" must match ^[a-z][a-z0-9_]{0,63}$`}},
		{"long name", base(func(m map[string]any) { m["name"] = "a" + strings.Repeat("b", 64) }),
			[]string{`field "name"`, "must match"}},
		{"name not a string", base(func(m map[string]any) { m["name"] = 5 }),
			[]string{`tools[0]: field "name" must be a string`}},
		{"missing description", base(func(m map[string]any) { m["description"] = " " }),
			[]string{`tool "t1" (tools[0]): field "description": is required`}},
		{"bad contract", base(func(m map[string]any) { m["contract"] = "maybe" }),
			[]string{`tool "t1" (tools[0]): field "contract": "maybe" is not one of cancellable, idempotent, consequential`}},
		{"missing contract", base(func(m map[string]any) { delete(m, "contract") }),
			[]string{`field "contract": is required`}},
		{"missing parameters", base(func(m map[string]any) { delete(m, "parameters") }),
			[]string{`field "parameters": is required`}},
		{"bad schema type", base(func(m map[string]any) {
			m["parameters"] = json.RawMessage(`{"type":"object","properties":{"a":{"type":"strin"}}}`)
		}), []string{`tool "t1" (tools[0]): field "parameters": schema of "a": unsupported type "strin"`}},
		{"bad schema keyword", base(func(m map[string]any) {
			m["parameters"] = json.RawMessage(`{"type":"object","properties":{"a":{"type":"string","patern":"x"}}}`)
		}), []string{`field "parameters"`, `keyword "patern" is not supported`}},
		{"schema not an object", base(func(m map[string]any) { m["parameters"] = json.RawMessage(`{"type":"array"}`) }),
			[]string{`field "parameters"`, `the root must have "type": "object"`}},
		{"unknown field", base(func(m map[string]any) { m["methd"] = "GET" }),
			[]string{`tool "t1" (tools[0]): unknown field "methd"`}},
		{"unknown top-level field", `{"tools": [], "tool": {}}`,
			[]string{`unknown field "tool" (the file holds "tools" and "mcp_servers")`}},
		{"neither tools nor MCP servers", `{}`,
			[]string{`field "tools" is missing (give "tools", "mcp_servers", or both)`}},
		{"missing url", base(func(m map[string]any) { delete(m, "url") }),
			[]string{`field "url": is required`}},
		{"ftp url", base(func(m map[string]any) { m["url"] = "ftp://files.example.com/x" }),
			[]string{`tool "t1" (tools[0]): field "url": must start with http:// or https:// (scheme "ftp")`}},
		{"relative url", base(func(m map[string]any) { m["url"] = "/hooks/t1" }),
			[]string{`field "url": must start with http:// or https://`}},
		{"no host", base(func(m map[string]any) { m["url"] = "https:///x" }),
			[]string{`field "url": has no host`}},
		{"credentials in url", base(func(m map[string]any) { m["url"] = "https://user:hunter2@api.example.com/" }),
			[]string{`field "url": must not hold credentials`}},
		{"unparsable url", base(func(m map[string]any) { m["url"] = "https://api.example.com/%zz?token=hunter2" }),
			[]string{`field "url": is not a valid URL`}},
		{"duplicate names", configFile(t,
			hookConfig("t1", tools.Idempotent, "https://a.example.com/"),
			hookConfig("t2", tools.Idempotent, "https://a.example.com/"),
			hookConfig("t1", tools.Cancellable, "https://b.example.com/")),
			[]string{`tool "t1" (tools[2]): field "name": "t1" is already the name of tools[0]`}},
		{"status_url without key", base(func(m map[string]any) {
			m["contract"] = tools.Consequential
			m["status_url"] = "https://api.example.com/status"
		}), []string{`field "status_url": must hold the placeholder {key}`}},
		{"status_url with key in host", base(func(m map[string]any) {
			m["contract"] = tools.Consequential
			m["status_url"] = "https://{key}.example.com/status"
		}), []string{`field "status_url": {key} must be in the path or the query`}},
		{"status_url bad scheme", base(func(m map[string]any) {
			m["contract"] = tools.Consequential
			m["status_url"] = "file:///status/{key}"
		}), []string{`field "status_url": must start with http:// or https://`}},
		{"status_url on an idempotent tool", base(func(m map[string]any) { m["status_url"] = "https://api.example.com/s/{key}" }),
			[]string{`field "status_url": is only used by consequential tools (this one is idempotent)`}},
		{"bad timeout", base(func(m map[string]any) { m["timeout"] = "soon" }),
			[]string{`field "timeout": "soon" is not a duration`}},
		{"negative timeout", base(func(m map[string]any) { m["timeout"] = "-1s" }),
			[]string{`field "timeout": "-1s" must be positive`}},
		{"huge timeout", base(func(m map[string]any) { m["timeout"] = "1h" }),
			[]string{`field "timeout": "1h" is longer than the maximum, 10m0s`}},
		{"timeout a number", base(func(m map[string]any) { m["timeout"] = 10 }),
			[]string{`field "timeout" must be a string`}},
		{"unset variable", base(func(m map[string]any) {
			m["headers"] = map[string]string{"Authorization": "Bearer ${WEBHOOK_TEST_UNSET}"}
		}), []string{`tool "t1" (tools[0]): field "headers.Authorization": environment variable WEBHOOK_TEST_UNSET is not set`}},
		{"unclosed reference", base(func(m map[string]any) { m["headers"] = map[string]string{"X-Key": "${WEBHOOK_TEST_TOKEN"} }),
			[]string{`field "headers.X-Key": a "${" has no closing "}"`}},
		{"bad reference", base(func(m map[string]any) { m["headers"] = map[string]string{"X-Key": "${1X}"} }),
			[]string{`field "headers.X-Key": a ${...} reference does not name a variable`}},
		{"reserved header", base(func(m map[string]any) { m["headers"] = map[string]string{"idempotency-key": "fixed"} }),
			[]string{`field "headers.idempotency-key": is set by the gateway`}},
		{"bad header name", base(func(m map[string]any) { m["headers"] = map[string]string{"Bad Header": "x"} }),
			[]string{`field "headers.Bad Header": is not a valid header name`}},
		{"same header twice", base(func(m map[string]any) { m["headers"] = map[string]string{"X-A": "1", "x-a": "2"} }),
			[]string{`field "headers.x-a": is the same header as another entry`}},
		{"header not a string", base(func(m map[string]any) { m["headers"] = map[string]any{"X-A": 1} }),
			[]string{`field "headers" must be an object of strings`}},
		{"duplicate key", `{"tools": [{"name": "a", "name": "b"}]}`,
			[]string{`key "name" appears twice in tools[0]`}},
		{"duplicate top-level key", `{"tools": [], "tools": []}`,
			[]string{`key "tools" appears twice in the top-level object`}},
		{"not JSON", "{\"tools\": [\n  {\"name\": \"a\",}\n]}",
			[]string{"not valid JSON at line 2, column"}},
		{"empty file", "", []string{"the file is empty"}},
		{"trailing data", `{"tools": []} {}`, []string{"there is more after the top-level object"}},
		{"an array", `[]`, []string{`the file must hold one JSON object, {"tools": [...]}`}},
		{"missing tools", `{}`, []string{`field "tools" is missing`}},
		{"tools not an array", `{"tools": {}}`, []string{`field "tools" must be an array of tool objects`}},
		{"entry not an object", `{"tools": [1]}`, []string{`tools[0]: must be a JSON object`}},
		{"several problems", configFile(t,
			map[string]any{"name": "Bad", "contract": "x", "url": "gopher://h", "extra": 1},
			hookConfig("ok", tools.Cancellable, "https://a.example.com/")),
			[]string{`tool "Bad" (tools[0]): unknown field "extra"`, `tool "Bad" (tools[0]): field "name"`, `tool "Bad" (tools[0]): field "description": is required`,
				`tool "Bad" (tools[0]): field "contract"`, `tool "Bad" (tools[0]): field "parameters": is required`,
				`tool "Bad" (tools[0]): field "url"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.content)
			ts, err := Load(path, nil)
			if err == nil {
				t.Fatalf("loaded %d tools, want an error", len(ts))
			}
			if !strings.HasPrefix(err.Error(), "webhook config "+path+": ") {
				t.Errorf("err = %v: does not name the file", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v\nwant it to say %s", err, w)
				}
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("err = %v: shows a secret", err)
			}
		})
	}

	if _, err := Load(filepath.Join(t.TempDir(), "missing.json"), nil); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	ts, err := Load(writeConfig(t, `{"tools": []}`), nil)
	if err != nil || ts == nil || len(ts) != 0 {
		t.Errorf("no tools: %v, %v", ts, err)
	}
}

func TestWebhookHeaderSecretsStayHidden(t *testing.T) {
	t.Setenv("WEBHOOK_TEST_SECRET", "s3cr3t\r\nX-Injected: 1")
	cfg := hookConfig("t1", tools.Cancellable, "https://api.example.com/")
	cfg["headers"] = map[string]string{"X-Api-Key": "${WEBHOOK_TEST_SECRET}"}
	_, err := Load(writeConfig(t, configFile(t, cfg)), nil)
	if err == nil || !strings.Contains(err.Error(), `field "headers.X-Api-Key": the value (after ${NAME} expansion) holds a control character`) {
		t.Fatalf("err = %v", err)
	}
	if strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("err = %v: shows the secret", err)
	}

	t.Setenv("WEBHOOK_TEST_SECRET", "s3cr3t-value")
	t.Setenv("WEBHOOK_TEST_EMPTY", "")
	cfg["headers"] = map[string]string{"X-Api-Key": "${WEBHOOK_TEST_SECRET}", "X-Other": "${WEBHOOK_TEST_EMPTY}"}
	_, err = Load(writeConfig(t, configFile(t, cfg)), nil)
	if err == nil || !strings.Contains(err.Error(), "environment variable WEBHOOK_TEST_EMPTY is not set (or is empty)") {
		t.Fatalf("err = %v", err)
	}

	rec := &recorder{}
	srv := newLocalServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.record(r)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	cfg["url"] = srv.URL + "/hook?token=hunter2"
	cfg["headers"] = map[string]string{"X-Api-Key": "${WEBHOOK_TEST_SECRET}"}
	r := runner(t, srv, cfg)
	_, err = r.Run(context.Background(), "op_1", json.RawMessage(`{"order_id":"A1"}`))
	if err == nil || !strings.Contains(err.Error(), "answered 401 Unauthorized") {
		t.Fatalf("err = %v", err)
	}
	if calls := rec.all(); len(calls) != 1 || calls[0].Header.Get("X-Api-Key") != "s3cr3t-value" || calls[0].Query != "token=hunter2" {
		t.Fatalf("calls %+v", calls)
	}
	shown := fmt.Sprintf("%v %+v %s %v", r, r, r, err)
	if strings.Contains(shown, "s3cr3t") || strings.Contains(shown, "hunter2") {
		t.Fatalf("printed: %s", shown)
	}
}

func TestLoadWebhooksTestdata(t *testing.T) {
	t.Setenv("EXAMPLE_API_TOKEN", "tok")
	ts, err := Load(filepath.Join("testdata", "webhooks.json"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ name, contract string }{
		{"search_orders", tools.Cancellable},
		{"lookup_order", tools.Idempotent},
		{"refund_order", tools.Consequential},
	}
	if len(ts) != len(want) {
		t.Fatalf("%d tools", len(ts))
	}
	for i, w := range want {
		s := ts[i].Spec()
		if s.Name != w.name || s.Contract != w.contract || s.Description == "" || !json.Valid(s.Parameters) {
			t.Errorf("tools[%d]: %+v", i, s)
		}
		_, isRunner := ts[i].(tools.Runner)
		_, isCommitter := ts[i].(tools.Committer)
		if isRunner == (w.contract == tools.Consequential) || isCommitter != (w.contract == tools.Consequential) {
			t.Errorf("%s: tools.Runner %v, tools.Committer %v", w.name, isRunner, isCommitter)
		}
	}
	reg, err := tools.NewRegistry(append(ts, catalog.New(0))...)
	if err != nil || len(reg.Specs()) != 4 {
		t.Fatalf("registry: %v", err)
	}

	os.Unsetenv("EXAMPLE_API_TOKEN") // t.Setenv restores it
	if _, err := Load(filepath.Join("testdata", "webhooks.json"), nil); err == nil || !strings.Contains(err.Error(), "EXAMPLE_API_TOKEN") {
		t.Fatalf("without the token: %v", err)
	}
}

func TestNewWebhook(t *testing.T) {
	tool, err := New(Config{
		Name: "ping", Description: "Ping.", Contract: tools.Cancellable,
		Parameters: json.RawMessage(`{"type":"object"}`), URL: "http://127.0.0.1:1/ping",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tool.(*Runner); !ok {
		t.Fatalf("%T", tool)
	}
	_, err = New(Config{Name: "ping", Contract: "often"}, nil)
	if err == nil || !strings.Contains(err.Error(), `webhook tool "ping": field "description": is required`) || !strings.Contains(err.Error(), `field "contract": "often"`) {
		t.Fatalf("err = %v", err)
	}
}

// A file may hold only MCP servers (package mcp reads them): no webhook
// tools, no error; with "tools" too, both are read.
func TestParseLeavesMCPServersToPackageMCP(t *testing.T) {
	ts, err := Parse([]byte(`{"mcp_servers": [{"name": "files", "command": "node"}]}`), nil)
	if err != nil || len(ts) != 0 {
		t.Fatalf("only MCP servers: %v, %v", ts, err)
	}
	ts, err = Parse([]byte(`{"mcp_servers": [], "tools": []}`), nil)
	if err != nil || len(ts) != 0 {
		t.Fatalf("both, no webhooks: %v, %v", ts, err)
	}
}
