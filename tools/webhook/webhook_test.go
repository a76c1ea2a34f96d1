package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/tools"
	"github.com/honestcancel/gateway/tools/catalog"
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

type callResult struct {
	res json.RawMessage
	err error
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

func TestWebhookRunSendsKeyHeadersAndArguments(t *testing.T) {
	t.Setenv("WEBHOOK_TEST_TOKEN", "tok-123")
	rec := &recorder{}
	srv := newLocalServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.record(r)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "{ \"order\": \"A1\",\n \"items\": [1, 2], \"note\": \"<b>\" }\n")
	}))
	cfg := hookConfig("lookup_order", tools.Idempotent, srv.URL+"/lookup?tenant=7")
	cfg["headers"] = map[string]string{
		"Authorization": "Bearer ${WEBHOOK_TEST_TOKEN}",
		"x-static":      "plain $value ${WEBHOOK_TEST_TOKEN}!",
	}
	r := runner(t, srv, cfg)

	if s := r.Spec(); s.Name != "lookup_order" || s.Contract != tools.Idempotent || s.Description != "A test webhook." || !json.Valid(s.Parameters) {
		t.Fatalf("spec %+v", s)
	}
	res, err := r.Run(context.Background(), "op_1", json.RawMessage(` {"qty": 5.0, "order_id": "A1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"order":"A1","items":[1,2],"note":"<b>"}`; string(res) != want {
		t.Fatalf("result %s, want %s", res, want)
	}
	calls := rec.all()
	if len(calls) != 1 {
		t.Fatalf("%d calls", len(calls))
	}
	c := calls[0]
	if c.Method != http.MethodPost || c.Path != "/lookup" || c.Query != "tenant=7" {
		t.Errorf("request %s %s?%s", c.Method, c.Path, c.Query)
	}
	for h, want := range map[string]string{
		"Content-Type":    "application/json",
		"Idempotency-Key": "op_1",
		"Authorization":   "Bearer tok-123",
		"X-Static":        "plain $value tok-123!",
		"Accept":          "application/json",
	} {
		if got := c.Header.Get(h); got != want {
			t.Errorf("header %s = %q, want %q", h, got, want)
		}
	}
	if want := `{"arguments":{"order_id":"A1","qty":5}}`; c.Body != want {
		t.Errorf("body %s, want %s", c.Body, want)
	}

	// Arguments the schema refuses never reach the service.
	_, err = r.Run(context.Background(), "op_2", json.RawMessage(`{"qty": 1}`))
	var ia *tools.InvalidArgs
	if !errors.As(err, &ia) || !strings.Contains(err.Error(), `"order_id"`) {
		t.Errorf("Run without order_id: %v", err)
	}
	if _, err := r.Run(context.Background(), "", json.RawMessage(`{"order_id":"A1"}`)); err == nil || !strings.Contains(err.Error(), "empty idempotency key") {
		t.Errorf("Run with an empty key: %v", err)
	}
	if _, err := r.Run(context.Background(), "op\r\nX-Evil: 1", json.RawMessage(`{"order_id":"A1"}`)); err == nil {
		t.Error("Run with a key holding CR LF succeeded")
	}
	if n := len(rec.all()); n != 1 {
		t.Errorf("the service saw %d calls, want 1", n)
	}
}

func TestWebhookRunTimeout(t *testing.T) {
	free := make(chan struct{})
	srv := newLocalServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // sleeps past the timeout, until the client goes away
		case <-r.Context().Done():
		case <-free:
		}
	}))
	releaseAtEnd(t, free)
	cfg := hookConfig("slow", tools.Cancellable, srv.URL)
	cfg["timeout"] = "100ms"
	r := runner(t, srv, cfg)
	start := time.Now()
	_, err := within(t, bound, func() (json.RawMessage, error) {
		return r.Run(context.Background(), "op_1", json.RawMessage(`{"order_id":"A1"}`))
	})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer within 100ms") {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("returned after %s, before the timeout", d)
	}
}

func TestWebhookRunCancelReturnsPromptly(t *testing.T) {
	arrived := make(chan struct{}, 1)
	free := make(chan struct{})
	srv := newLocalServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-free:
		}
	}))
	releaseAtEnd(t, free)
	cfg := hookConfig("search", tools.Cancellable, srv.URL)
	cfg["timeout"] = "10m" // the cancel, not the timeout, must end the call
	r := runner(t, srv, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan callResult, 1)
	go func() {
		res, err := r.Run(ctx, "op_1", json.RawMessage(`{"order_id":"A1"}`))
		done <- callResult{res, err}
	}()
	select {
	case <-arrived:
	case <-time.After(bound):
		t.Fatal("the request never arrived")
	}
	cancel()
	select {
	case got := <-done:
		if !errors.Is(got.err, context.Canceled) || errors.Is(got.err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want context.Canceled", got.err)
		}
	case <-time.After(bound):
		t.Fatal("Run did not return after the cancel")
	}

	// An already cancelled context sends nothing.
	_, err := r.Run(ctx, "op_2", json.RawMessage(`{"order_id":"A1"}`))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run with a cancelled ctx: %v", err)
	}
	select {
	case <-arrived:
		t.Fatal("a request was sent with a cancelled context")
	default:
	}
}

func TestWebhookRunBadAnswers(t *testing.T) {
	long := strings.Repeat("é", 3000) // 2 bytes each: the excerpt must cut on a rune
	big := `"` + strings.Repeat("a", MaxResponseBytes) + `"`
	other := false
	var mu sync.Mutex
	mux := http.NewServeMux()
	mux.HandleFunc("/garbage", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>oops</html>") })
	mux.HandleFunc("/empty", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/trailing", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"a":1} {"b":2}`) })
	mux.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, "\n  database\ton fire: "+long)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(big)))
		io.WriteString(w, big)
	})
	mux.HandleFunc("/big-chunked", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, big[:1000])
		w.(http.Flusher).Flush()
		io.WriteString(w, big[1000:])
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/other", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/other", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		other = true
		mu.Unlock()
		io.WriteString(w, `{}`)
	})
	mux.HandleFunc("/created", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `[1, 2]`)
	})
	srv := newLocalServer(t, mux)

	for _, tc := range []struct {
		path, want string
		status     int
	}{
		{"/garbage", "answered something that is not JSON", 0},
		{"/empty", "answered something that is not JSON", 0},
		{"/trailing", "answered something that is not JSON", 0},
		{"/fail", "answered 500 Internal Server Error: database on fire: éé", 500},
		{"/big", "larger than 1 MiB", 0},
		{"/big-chunked", "larger than 1 MiB", 0},
		{"/redirect", "answered 307", 307},
	} {
		t.Run(tc.path[1:], func(t *testing.T) {
			r := runner(t, srv, hookConfig("hook", tools.Cancellable, srv.URL+tc.path))
			_, err := within(t, bound, func() (json.RawMessage, error) {
				return r.Run(context.Background(), "op_1", json.RawMessage(`{"order_id":"A1"}`))
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to say %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "webhook hook: POST http://127.0.0.1:") {
				t.Errorf("err = %v: does not name the tool and the call", err)
			}
			var se *StatusError
			if tc.status != 0 {
				if !errors.As(err, &se) || se.StatusCode != tc.status || se.Rejected {
					t.Fatalf("err = %#v", err)
				}
				if len(se.Excerpt) > 200 || !strings.HasSuffix(se.Excerpt, "...") && tc.path == "/fail" {
					t.Errorf("excerpt of %d bytes: %q", len(se.Excerpt), se.Excerpt)
				}
			}
			if len(err.Error()) > 400 {
				t.Errorf("error of %d bytes", len(err.Error()))
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if other {
		t.Error("a redirect was followed")
	}

	r := runner(t, srv, hookConfig("hook", tools.Cancellable, srv.URL+"/created"))
	res, err := r.Run(context.Background(), "op_1", json.RawMessage(`{"order_id":"A1"}`))
	if err != nil || string(res) != `[1,2]` {
		t.Fatalf("201: %s, %v", res, err)
	}
}

func TestWebhookNetworkError(t *testing.T) {
	srv := newLocalServer(t, http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more
	r := runner(t, srv, hookConfig("gone", tools.Idempotent, url))
	_, err := within(t, bound, func() (json.RawMessage, error) {
		return r.Run(context.Background(), "op_1", json.RawMessage(`{"order_id":"A1"}`))
	})
	if err == nil || !strings.Contains(err.Error(), "webhook gone: POST "+url) {
		t.Fatalf("err = %v", err)
	}
	c := committer(t, srv, hookConfig("gone_commit", tools.Consequential, url))
	_, err = within(t, bound, func() (json.RawMessage, error) {
		return c.Commit(context.Background(), "k1", json.RawMessage(`{"order_id":"A1"}`))
	})
	if err == nil || errors.Is(err, tools.ErrRejected) {
		t.Fatalf("Commit on a dead service: %v, want an unknown outcome (not tools.ErrRejected)", err)
	}
}

func TestWebhookCommitterPrepare(t *testing.T) {
	srv := newLocalServer(t, http.NotFoundHandler())
	c := committer(t, srv, hookConfig("book_room", tools.Consequential, srv.URL))
	preview, key, err := c.Prepare("thr_1", json.RawMessage(`{ "qty": 2, "order_id": "A<1>" }`))
	if err != nil {
		t.Fatal(err)
	}
	norm := `{"order_id":"A<1>","qty":2}`
	if string(preview) != norm {
		t.Fatalf("preview %s, want %s", preview, norm)
	}
	sum := sha256.Sum256([]byte(norm))
	if want := "book_room:thr_1:" + hex.EncodeToString(sum[:])[:16] + ":commit"; key != want {
		t.Fatalf("key %q, want %q", key, want)
	}
	if !regexp.MustCompile(`^book_room:thr_1:[0-9a-f]{16}:commit$`).MatchString(key) || Key("book_room", "thr_1", json.RawMessage(norm)) != key {
		t.Fatalf("key %q", key)
	}
	_, key2, err := c.Prepare("thr_1", json.RawMessage(`{"order_id":"A\u003c1>","qty":2.0}`))
	if err != nil || key2 != key {
		t.Fatalf("same arguments written differently: %q, %v", key2, err)
	}
	_, key3, _ := c.Prepare("thr_2", json.RawMessage(norm))
	_, key4, _ := c.Prepare("thr_1", json.RawMessage(`{"order_id":"A<1>","qty":3}`))
	if key3 == key || key4 == key || key3 == "" || key4 == "" {
		t.Fatalf("keys not distinct: %q %q %q", key, key3, key4)
	}
	var ia *tools.InvalidArgs
	if _, _, err := c.Prepare("thr_1", json.RawMessage(`{"order_id":""}`)); !errors.As(err, &ia) {
		t.Fatalf("Prepare with invalid arguments: %v", err)
	}
	if _, _, err := c.Prepare("", json.RawMessage(norm)); err == nil {
		t.Fatal("Prepare with an empty scope succeeded")
	}
}

// fakeService acts at most once per Idempotency-Key, as a real payment or
// booking API does, and records every key it receives.
type fakeService struct {
	mu      sync.Mutex
	keys    []string
	bodies  []string
	results map[string]string
	actions int
}

func (f *fakeService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, key)
	f.bodies = append(f.bodies, string(body))
	if key == "" {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":"Idempotency-Key required"}`)
		return
	}
	res, ok := f.results[key]
	if !ok {
		f.actions++
		res = fmt.Sprintf(`{"booking": "b%d", "key": %q}`, f.actions, key)
		f.results[key] = res
	}
	io.WriteString(w, res)
}

func TestWebhookCommitSendsTheSameKeyTwice(t *testing.T) {
	svc := &fakeService{results: map[string]string{}}
	srv := newLocalServer(t, svc)
	c := committer(t, srv, hookConfig("book_room", tools.Consequential, srv.URL))
	args := json.RawMessage(`{"qty":2,"order_id":"A1"}`)
	_, key, err := c.Prepare("thr_1", args)
	if err != nil {
		t.Fatal(err)
	}
	first, err := c.Commit(context.Background(), key, args)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Commit(context.Background(), key, args)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`{"booking":"b1","key":%q}`, key); string(first) != want || string(again) != want {
		t.Fatalf("results %s and %s, want %s", first, again, want)
	}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if len(svc.keys) != 2 || svc.keys[0] != key || svc.keys[1] != key {
		t.Fatalf("the service saw keys %q, want %q twice", svc.keys, key)
	}
	if svc.actions != 1 {
		t.Fatalf("%d actions", svc.actions)
	}
	for _, b := range svc.bodies {
		if b != `{"arguments":{"order_id":"A1","qty":2}}` {
			t.Fatalf("body %s", b)
		}
	}
}

func TestWebhookCommitOutcomes(t *testing.T) {
	free := make(chan struct{})
	srv := newLocalServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/garbage":
			io.WriteString(w, "OK, booked!")
		case "/hang":
			select {
			case <-r.Context().Done():
			case <-free:
			}
		default:
			var code int
			fmt.Sscanf(r.URL.Path, "/%d", &code)
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"error":"status %d"}`, code)
		}
	}))
	releaseAtEnd(t, free)
	for _, tc := range []struct {
		path     string
		rejected bool
	}{
		{"/400", true}, {"/401", true}, {"/403", true}, {"/404", true}, {"/422", true},
		{"/408", false}, {"/409", false}, {"/429", false}, {"/500", false}, {"/502", false}, {"/503", false},
		{"/302", false}, {"/garbage", false}, {"/hang", false},
	} {
		t.Run(tc.path[1:], func(t *testing.T) {
			cfg := hookConfig("pay", tools.Consequential, srv.URL+tc.path)
			cfg["timeout"] = "100ms"
			c := committer(t, srv, cfg)
			_, err := within(t, bound, func() (json.RawMessage, error) {
				return c.Commit(context.Background(), "pay:thr_1:0123456789abcdef:commit", json.RawMessage(`{"order_id":"A1"}`))
			})
			if err == nil {
				t.Fatal("no error")
			}
			if errors.Is(err, tools.ErrRejected) != tc.rejected {
				t.Fatalf("err = %v: rejected %v, want %v", err, !tc.rejected, tc.rejected)
			}
			var se *StatusError
			if strings.HasPrefix(tc.path, "/4") && (!errors.As(err, &se) || fmt.Sprint("/", se.StatusCode) != tc.path || se.Rejected != tc.rejected) {
				t.Fatalf("err = %#v", err)
			}
			switch tc.path {
			case "/garbage":
				if !strings.Contains(err.Error(), "answered something that is not JSON") || !strings.Contains(err.Error(), "unknown") {
					t.Fatalf("err = %v", err)
				}
			case "/hang":
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("err = %v", err)
				}
			}
		})
	}

	// Invalid arguments and an empty key are refused before anything is
	// sent, for good.
	c := committer(t, srv, hookConfig("pay", tools.Consequential, srv.URL+"/500"))
	_, err := c.Commit(context.Background(), "k", json.RawMessage(`{"order_id":1}`))
	var ia *tools.InvalidArgs
	if !errors.Is(err, tools.ErrRejected) || !errors.As(err, &ia) {
		t.Fatalf("invalid arguments: %v", err)
	}
	if _, err := c.Commit(context.Background(), "", json.RawMessage(`{"order_id":"A1"}`)); !errors.Is(err, tools.ErrRejected) {
		t.Fatalf("empty key: %v", err)
	}
}

func TestWebhookStatus(t *testing.T) {
	rec := &recorder{}
	lookup := func(key string) (int, string) {
		switch key {
		case "pay:thr 1/x:0123456789abcdef:commit", "a&b=c+d?e":
			return 200, fmt.Sprintf(`{ "status": "paid", "key": %q }`, key)
		case "broken":
			return 500, `{"error":"lookup failed"}`
		case "garbage":
			return 200, `paid`
		case "later":
			return 202, `{}`
		}
		return 404, `{"error":"no such key"}`
	}
	srv := newLocalServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.record(r)
		if r.Method != http.MethodGet {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		key := strings.TrimPrefix(r.URL.Path, "/status/")
		if r.URL.Path == "/status" {
			key = r.URL.Query().Get("key")
		}
		code, body := lookup(key)
		w.WriteHeader(code)
		io.WriteString(w, body)
	}))
	t.Setenv("WEBHOOK_TEST_TOKEN", "tok-9")
	cfg := hookConfig("pay", tools.Consequential, srv.URL+"/pay")
	cfg["status_url"] = srv.URL + "/status/{key}"
	cfg["headers"] = map[string]string{"Authorization": "Bearer ${WEBHOOK_TEST_TOKEN}"}
	c := committer(t, srv, cfg)
	ctx := context.Background()

	key := "pay:thr 1/x:0123456789abcdef:commit"
	st, err := c.Status(ctx, key)
	if err != nil || !st.Known || string(st.Result) != fmt.Sprintf(`{"status":"paid","key":%q}`, key) {
		t.Fatalf("known key: %+v (%s), %v", st, st.Result, err)
	}
	calls := rec.all()
	if len(calls) != 1 || calls[0].Header.Get("Authorization") != "Bearer tok-9" || calls[0].Method != http.MethodGet {
		t.Fatalf("calls %+v", calls)
	}
	st, err = c.Status(ctx, "pay:thr_1:ffffffffffffffff:commit")
	if err != nil || st.Known || st.Result != nil {
		t.Fatalf("unknown key: %+v, %v", st, err)
	}
	for key, want := range map[string]string{
		"broken":  "answered 500 Internal Server Error",
		"garbage": "answered something that is not JSON",
		"later":   "answered 202 Accepted",
	} {
		if _, err := c.Status(ctx, key); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("tools.Status(%q): %v, want %q", key, err, want)
		}
	}

	// The placeholder in the query is escaped for the query.
	cfg["name"] = "pay_q"
	cfg["status_url"] = srv.URL + "/status?key={key}&v=1"
	c = committer(t, srv, cfg)
	st, err = c.Status(ctx, "a&b=c+d?e")
	if err != nil || !st.Known {
		t.Fatalf("key in the query: %+v, %v", st, err)
	}

	// Without status_url nothing can be reconciled.
	delete(cfg, "status_url")
	c = committer(t, srv, cfg)
	if _, err := c.Status(ctx, key); err == nil || !strings.Contains(err.Error(), "no status_url") || !strings.Contains(err.Error(), "stays unknown") {
		t.Fatalf("tools.Status without status_url: %v", err)
	}
}

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
