package app_test

// Prometheus metrics of a whole gateway: scrape /metrics, stream,
// complete and cancel runs (over WebSocket and HTTP), call a tool, and check
// that each instrument moved as it should; that no label value is an id and
// no text of a conversation appears; and where /metrics is served in each
// auth mode.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
	"github.com/honestcancel/gateway/model/openai"
)

// metricWant is one expectation: the metric (with labels) moved by at least
// min from the baseline (or, with exact, by exactly delta).
type metricWant struct {
	name   string
	labels []string
	delta  float64
	exact  bool
}

func (w metricWant) String() string {
	op := ">="
	if w.exact {
		op = "=="
	}
	return fmt.Sprintf("%s%v %s %+g", w.name, w.labels, op, w.delta)
}

// waitMetrics scrapes url until every want holds against base (the moves
// are observed right after the events a client sees, so this only waits
// for gauges and for a scrape to land after them), and returns the last
// scrape.
func waitMetrics(t *testing.T, url string, base apptest.Metrics, wants ...metricWant) apptest.Metrics {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		now := apptest.Scrape(t, url)
		var failing []string
		for _, w := range wants {
			was, _ := base.Value(t, w.name, w.labels...) // a vector may have no series yet
			d := now.Get(t, w.name, w.labels...) - was
			if (w.exact && d != w.delta) || (!w.exact && d < w.delta) {
				failing = append(failing, fmt.Sprintf("%s: moved %+g", w, d))
			}
		}
		if len(failing) == 0 {
			return now
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics did not move as expected within 15s:\n  %s", strings.Join(failing, "\n  "))
		}
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
}

var idLike = regexp.MustCompile(`^(thr|run|msg|cp|op|usr|tok|con|ins|aud|ses)_`)

// checkNoIDsOrText fails when a label value looks like an id, or when
// anything of the given ids and texts appears in the exposition.
func checkNoIDsOrText(t *testing.T, s apptest.Metrics, secrets ...string) {
	t.Helper()
	for name, f := range s.Families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if idLike.MatchString(l.GetValue()) {
					t.Errorf("metric %s has label %s=%q, which looks like an id", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
	lower := strings.ToLower(s.Raw)
	for _, secret := range secrets {
		if secret != "" && strings.Contains(lower, strings.ToLower(secret)) {
			t.Errorf("the metrics contain %q", secret)
		}
	}
}

func TestBinaryMetrics(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	cfg := apptest.CommandConfig(db, 20*time.Millisecond)
	cfg.AdminAddr, cfg.AdminHosts = "127.0.0.1:0", cfg.Hosts
	cfg.SearchLatency = 50 * time.Millisecond
	srv := apptest.Start(t, cfg)
	url := srv.Base + "/metrics"

	base := apptest.Scrape(t, url)
	// The registry is the gateway's own, with the Go runtime and the
	// process collectors in it.
	for _, name := range []string{"go_goroutines", "go_memstats_alloc_bytes", "process_cpu_seconds_total", "process_open_fds"} {
		if _, ok := base.Families[name]; !ok {
			t.Errorf("no %s: the Go runtime and process collectors belong in the registry", name)
		}
	}
	// Series of the fixed label sets exist before anything happened.
	for _, series := range []struct {
		name   string
		labels []string
	}{
		{"gateway_runs_finished_total", []string{"status", "cancelled"}},
		{"gateway_cancel_ack_seconds", []string{"transport", "websocket"}},
		{"gateway_websocket_slow_closes_total", []string{"reason", "stuck_write"}},
		{"gateway_sse_slow_closes_total", []string{"reason", "stuck_write"}},
		{"gateway_rate_limited_total", []string{"kind", "cancels"}},
		{"gateway_store_transaction_seconds", []string{"kind", "write"}},
	} {
		f := base.Families[series.name]
		found := false
		for _, m := range f.GetMetric() {
			found = found || apptest.HasLabels(m, series.labels)
		}
		if !found {
			t.Errorf("no series %s%v before any traffic", series.name, series.labels)
		}
	}

	// A WebSocket (counted open) and three conversations.
	ws := srv.Connect("metrics test")
	waitMetrics(t, url, base, metricWant{name: "gateway_websocket_connections", delta: 1, exact: true})
	const secretWord = "Quokkaxylophone"
	threads := make([]chat.Snapshot, 4)
	for i := range threads {
		threads[i] = srv.CreateThread()
	}
	start := func(th chat.Snapshot, text string) chat.RunStartAck {
		return srv.StartRun(th.ThreadID, th.StateVersion, text)
	}
	deadline := time.Now().Add(30 * time.Second)

	// Thread 0: a run that completes, watched over SSE (counted open).
	sse := srv.Events(threads[0].ThreadID, threads[0].LastSeq)
	waitMetrics(t, url, base, metricWant{name: "gateway_sse_streams", delta: 1, exact: true})
	completed := start(threads[0], "Explain goroutines to a "+secretWord)

	// Thread 1: cancelled over the WebSocket once it streams.
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if _, err := ws.Subscribe(ctx, threads[1].ThreadID, threads[1].LastSeq); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	byWS := start(threads[1], "Tell me about channels, "+secretWord)
	ev1 := srv.Events(threads[1].ThreadID, threads[1].LastSeq)
	ev1.WaitDeltas(deadline, byWS.RunID, 3)
	if ack, err := ws.CancelRun(ctx, client.CancelRunRequest{RunID: byWS.RunID}); err != nil || ack.Status != chat.RunCancelRequested {
		t.Fatalf("run.cancel over WebSocket: %+v %v", ack, err)
	}

	// Thread 2: cancelled over HTTP once it streams.
	byHTTP := start(threads[2], "Tell me about mutexes, "+secretWord)
	ev2 := srv.Events(threads[2].ThreadID, threads[2].LastSeq)
	ev2.WaitDeltas(deadline, byHTTP.RunID, 3)
	srv.CancelRun(byHTTP.RunID)

	// Thread 3: a tool call (catalog_search), then the reply.
	withTool := start(threads[3], "search the catalog for a hiking backpack")
	ev3 := srv.Events(threads[3].ThreadID, threads[3].LastSeq)

	if ev := sse.WaitFor(deadline, "run.completed", apptest.IsEnd(completed.RunID)); ev.Type != "run.completed" {
		t.Fatalf("run %s ended %s", completed.RunID, ev.Type)
	}
	if ev := ev1.WaitFor(deadline, "run.cancelled", apptest.IsEnd(byWS.RunID)); ev.Type != "run.cancelled" {
		t.Fatalf("run %s ended %s", byWS.RunID, ev.Type)
	}
	if ev := ev2.WaitFor(deadline, "run.cancelled", apptest.IsEnd(byHTTP.RunID)); ev.Type != "run.cancelled" {
		t.Fatalf("run %s ended %s", byHTTP.RunID, ev.Type)
	}
	if ev := ev3.WaitFor(deadline, "run.completed", apptest.IsEnd(withTool.RunID)); ev.Type != "run.completed" {
		t.Fatalf("run %s ended %s", withTool.RunID, ev.Type)
	}

	after := waitMetrics(t, url, base,
		metricWant{name: "gateway_runs_started_total", delta: 4, exact: true},
		metricWant{name: "gateway_runs_finished_total", labels: []string{"status", "completed"}, delta: 2, exact: true},
		metricWant{name: "gateway_runs_finished_total", labels: []string{"status", "cancelled"}, delta: 2, exact: true},
		metricWant{name: "gateway_runs_finished_total", labels: []string{"status", "failed"}, delta: 0, exact: true},
		metricWant{name: "gateway_runs_executing", delta: 0, exact: true},
		metricWant{name: "gateway_cancel_ack_seconds", labels: []string{"transport", "websocket"}, delta: 1, exact: true},
		metricWant{name: "gateway_cancel_ack_seconds", labels: []string{"transport", "http"}, delta: 1, exact: true},
		metricWant{name: "gateway_cancel_to_cancelled_seconds", delta: 2, exact: true},
		// one claim each; the tool run's second step is in the same claim
		metricWant{name: "gateway_run_first_token_seconds", delta: 4, exact: true},
		// at least 80 words of the completed reply, 3 of each cancelled one
		metricWant{name: "gateway_deltas_streamed_total", delta: 80 + 3 + 3},
		metricWant{name: "gateway_stream_buffer_deltas", delta: 80 + 3 + 3},
		metricWant{name: "gateway_websocket_frames_received_total", delta: 3},
		metricWant{name: "gateway_websocket_frames_sent_total", delta: 3},
		metricWant{name: "gateway_websocket_received_bytes_total", delta: 100},
		metricWant{name: "gateway_websocket_sent_bytes_total", delta: 1000},
		metricWant{name: "gateway_tool_phase_transitions_total", labels: []string{"tool", "catalog_search", "phase", "running"}, delta: 1, exact: true},
		metricWant{name: "gateway_tool_phase_transitions_total", labels: []string{"tool", "catalog_search", "phase", "completed"}, delta: 1, exact: true},
		metricWant{name: "gateway_tool_operations_total", labels: []string{"tool", "catalog_search", "outcome", "completed"}, delta: 1, exact: true},
		metricWant{name: "gateway_store_transaction_seconds", labels: []string{"kind", "write"}, delta: 10},
		metricWant{name: "gateway_store_transaction_seconds", labels: []string{"kind", "write"}, delta: 1},
		metricWant{name: "gateway_store_transaction_seconds", labels: []string{"kind", "read"}, delta: 1},
		metricWant{name: "gateway_store_group_commit_requests", delta: 1},
	)
	// The demo model reports no usage: no tokens counted (see
	// TestBinaryMetricsTokens for a backend that does).
	if d := after.Get(t, "gateway_model_tokens_total") - base.Get(t, "gateway_model_tokens_total"); d != 0 {
		t.Errorf("tokens moved %+g with the demo model, which reports none", d)
	}

	// Closing the stream and the WebSocket takes the gauges back down.
	sse.Close()
	ev1.Close()
	ev2.Close()
	ev3.Close()
	ws.Close()
	// (Connected once: the gauges count that one connection.)
	if n := ws.Stats().Connects; n != 1 {
		t.Errorf("the WebSocket was cut and reconnected (%d connections)", n)
	}
	final := waitMetrics(t, url, base,
		metricWant{name: "gateway_websocket_connections", delta: 0, exact: true},
		metricWant{name: "gateway_sse_streams", delta: 0, exact: true},
	)

	// No ids as label values; no conversation text anywhere.
	secrets := []string{secretWord, "backpack", completed.RunID, byWS.RunID, byHTTP.RunID, withTool.RunID}
	for _, th := range threads {
		secrets = append(secrets, th.ThreadID)
	}
	for _, m := range sse.Texts() {
		secrets = append(secrets, strings.TrimSpace(m))
	}
	checkNoIDsOrText(t, final, secrets...)

	// The admin listener serves the same registry.
	admin := strings.TrimSuffix(srv.AdminURL(), "/debug/pprof/")
	fromAdmin := apptest.Scrape(t, admin+"/metrics")
	if got, want := fromAdmin.Get(t, "gateway_runs_started_total"), final.Get(t, "gateway_runs_started_total"); got != want {
		t.Errorf("admin listener: runs started %g, main listener %g", got, want)
	}
	srv.Stop()
}

// A backend that reports usage moves the token counters.
func TestBinaryMetricsTokens(t *testing.T) {
	fake := apptest.NewFakeOpenAI(t)
	cfg := apptest.CommandConfig(filepath.Join(t.TempDir(), "gw.db"), 0)
	cfg.Model, cfg.OpenAI = "openai", openai.Config{BaseURL: fake.URL + "/v1", Model: "test-model"}
	srv := apptest.Start(t, cfg)
	url := srv.Base + "/metrics"
	base := apptest.Scrape(t, url)
	th := srv.CreateThread()
	evs := srv.Events(th.ThreadID, th.LastSeq)
	ack := srv.StartRun(th.ThreadID, 1, "hello")
	evs.WaitFor(time.Now().Add(20*time.Second), "run.completed", func(ev client.Event) bool {
		if ev.RunID == ack.RunID && ev.Type == chat.EventRunFailed {
			t.Fatalf("run failed: %s", ev.Raw)
		}
		return ev.RunID == ack.RunID && ev.Type == chat.EventRunCompleted
	})
	// The fake reports 5 prompt and 3 completion tokens per request.
	waitMetrics(t, url, base,
		metricWant{name: "gateway_model_tokens_total", labels: []string{"kind", "prompt"}, delta: 5, exact: true},
		metricWant{name: "gateway_model_tokens_total", labels: []string{"kind", "completion"}, delta: 3, exact: true},
		metricWant{name: "gateway_run_first_token_seconds", delta: 1, exact: true},
		metricWant{name: "gateway_runs_finished_total", labels: []string{"status", "completed"}, delta: 1, exact: true},
	)
	srv.Stop()
}

// Where /metrics is served: on the main listener under -auth none, not under
// -auth password unless -metrics-public; always on the admin listener. And
// refusals by the per-user connection limit are counted.
func TestBinaryMetricsExposure(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "gw.db")
	addUser(t, db, "alice", "correct horse battery")
	token, _ := createToken(t, db, "alice")

	status := func(url string) int {
		t.Helper()
		resp, err := httpClient.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	adminMetrics := func(srv *apptest.Server) string {
		t.Helper()
		for _, l := range strings.Split(srv.Stderr(), "\n") {
			if i := strings.Index(l, `msg=metrics url=`); i >= 0 {
				if u := strings.TrimSpace(l[i+len(`msg=metrics url=`):]); u != srv.Base+"/metrics" {
					return u
				}
			}
		}
		t.Fatalf("no admin metrics line in the log:\n%s", srv.Stderr())
		return ""
	}

	// -auth password: not on the main listener (not even signed in: a
	// scraper has no session), on the admin listener.
	cfg := apptest.CommandConfig(db, 5*time.Millisecond)
	cfg.AuthMode = auth.ModePassword
	cfg.AdminAddr, cfg.AdminHosts = "127.0.0.1:0", cfg.Hosts
	srv := apptest.Start(t, cfg)
	if got := status(srv.Base + "/metrics"); got != http.StatusNotFound {
		t.Errorf("GET /metrics on the main listener under -auth password: %d, want 404", got)
	}
	if !strings.Contains(srv.Stderr(), "-metrics-public") {
		t.Errorf("the log does not say where the metrics are:\n%s", srv.Stderr())
	}
	apptest.Scrape(t, adminMetrics(srv))
	srv.Stop()

	// -metrics-public: on the main listener without sign-in. With one
	// connection allowed per user, a second is refused and counted.
	cfg = apptest.CommandConfig(db, 5*time.Millisecond)
	cfg.AuthMode, cfg.MetricsPublic, cfg.UserConns = auth.ModePassword, true, 1
	srv = apptest.Start(t, cfg)
	url := srv.Base + "/metrics"
	base := apptest.Scrape(t, url)
	alice := srv.As(nil, client.WithBearerToken(token))
	ws := alice.Connect("first connection")
	threadID := alice.CreateThread().ThreadID
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if es, err := alice.API().Events(ctx, threadID, client.FromSnapshot); apptest.RefusedStatus(err) != http.StatusTooManyRequests {
		if es != nil {
			es.Close()
		}
		t.Fatalf("a second connection of the user: %v, want 429", err)
	}
	final := waitMetrics(t, url, base,
		metricWant{name: "gateway_connections_refused_total", labels: []string{"transport", "sse"}, delta: 1, exact: true},
		metricWant{name: "gateway_rate_limited_total", labels: []string{"kind", "connections"}, delta: 1, exact: true},
		metricWant{name: "gateway_websocket_connections", delta: 1, exact: true},
	)
	checkNoIDsOrText(t, final, threadID, "alice", token)
	ws.Close()
	srv.Stop()
}
