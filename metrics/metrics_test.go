package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/honestcancel/gateway/chat"
)

// value sums the series of name whose labels include want (a histogram:
// its sample count).
func value(t *testing.T, m *Metrics, name string, want ...string) float64 {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, s := range f.GetMetric() {
			for i := 0; i+1 < len(want); i += 2 {
				if !hasLabel(s, want[i], want[i+1]) {
					continue series
				}
			}
			sum += s.GetCounter().GetValue() + s.GetGauge().GetValue() + float64(s.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

func hasLabel(s *dto.Metric, name, value string) bool {
	for _, l := range s.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

func toolEvent(typ, tool, phase string, outcome, result *string) *chat.Event {
	return &chat.Event{Type: typ, ThreadID: "thr_secret", RunID: "run_secret", Body: chat.ToolBody{Operation: chat.Operation{
		OperationID: "op_secret", RunID: "run_secret", ThreadID: "thr_secret", Tool: tool, Phase: phase,
		Outcome: outcome, ResultRef: result, Args: []byte(`{"to":"anna@example.com"}`),
	}}}
}

func ptr(s string) *string { return &s }

// Committed counts runs, deltas and tool operations from committed events,
// and takes nothing else of them: no id, no text.
func TestCommittedCountsWhatCommitted(t *testing.T) {
	m := New()
	ev := func(typ string) *chat.Event {
		return &chat.Event{Type: typ, ThreadID: "thr_secret", RunID: "run_secret", MessageID: "msg_secret",
			Body: chat.MessageDeltaBody{MessageID: "msg_secret", Text: "secret words"}}
	}
	m.Committed([]*chat.Event{ev(chat.EventRunStarted), ev(chat.EventMessageDelta), ev(chat.EventMessageDelta), ev(chat.EventMessageDelta)})
	m.Committed([]*chat.Event{ev(chat.EventMessageDelta), ev(chat.EventMessagePublished), ev(chat.EventRunCompleted)})
	m.Committed([]*chat.Event{ev(chat.EventRunStarted), ev(chat.EventRunCancelRequested)})
	m.Committed([]*chat.Event{ev(chat.EventRunCancelled)})
	m.Committed([]*chat.Event{ev(chat.EventRunStarted), ev(chat.EventRunFailed)})
	// An email: prepared, confirmed, committing, unknown (looked up, not
	// final), reconciled (final, committed). A search: running, unknown
	// with its result recorded (still reconciled: not final), then unknown
	// after the gateway stopped asking (final). One aborted.
	m.Committed([]*chat.Event{toolEvent(chat.EventToolPrepared, "send_email", chat.PhasePrepared, nil, nil)})
	m.Committed([]*chat.Event{toolEvent(chat.EventToolUpdated, "send_email", chat.PhaseConfirmed, nil, nil)})
	m.Committed([]*chat.Event{toolEvent(chat.EventToolUpdated, "send_email", chat.PhaseCommitting, nil, nil)})
	m.Committed([]*chat.Event{toolEvent(chat.EventToolUpdated, "send_email", chat.PhaseUnknown, ptr(chat.OutcomeUnknown), nil)})
	m.Committed([]*chat.Event{toolEvent(chat.EventToolUpdated, "send_email", chat.PhaseReconciled, ptr(chat.OutcomeCommitted), ptr("msg_secret"))})
	m.Committed([]*chat.Event{toolEvent(chat.EventToolUpdated, "catalog_search", chat.PhaseRunning, nil, nil)})
	m.Committed([]*chat.Event{toolEvent(chat.EventToolUpdated, "catalog_search", chat.PhaseUnknown, ptr(chat.OutcomeUnknown), ptr("msg_secret"))})
	gaveUp := toolEvent(chat.EventToolUpdated, "catalog_search", chat.PhaseUnknown, ptr(chat.OutcomeUnknown), ptr("msg_secret"))
	horizon := time.Now()
	gaveUp.Body = chat.ToolBody{Operation: func() chat.Operation {
		op := gaveUp.Body.(chat.ToolBody).Operation
		op.ReconcileUntil = &horizon
		return op
	}()}
	m.Committed([]*chat.Event{gaveUp})
	m.Committed([]*chat.Event{toolEvent(chat.EventToolUpdated, "catalog_search", chat.PhaseAborted, ptr(chat.OutcomeAborted), nil)})

	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"gateway_runs_started_total", nil, 3},
		{"gateway_runs_finished_total", []string{"status", "completed"}, 1},
		{"gateway_runs_finished_total", []string{"status", "cancelled"}, 1},
		{"gateway_runs_finished_total", []string{"status", "failed"}, 1},
		{"gateway_deltas_streamed_total", nil, 4},
		{"gateway_tool_phase_transitions_total", []string{"tool", "send_email"}, 5},
		{"gateway_tool_phase_transitions_total", []string{"tool", "send_email", "phase", "unknown"}, 1},
		{"gateway_tool_phase_transitions_total", []string{"tool", "catalog_search"}, 4},
		{"gateway_tool_operations_total", []string{"tool", "send_email"}, 1},
		{"gateway_tool_operations_total", []string{"tool", "send_email", "outcome", "committed"}, 1},
		{"gateway_tool_operations_total", []string{"tool", "catalog_search", "outcome", "unknown"}, 1},
		{"gateway_tool_operations_total", []string{"tool", "catalog_search", "outcome", "aborted"}, 1},
	} {
		if got := value(t, m, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, secret := range []string{"secret", "anna@example.com"} {
		if strings.Contains(string(body), secret) {
			t.Errorf("the exposition contains %q", secret)
		}
	}
	if !strings.Contains(string(body), "go_goroutines") || !strings.Contains(string(body), "process_cpu_seconds_total") {
		t.Error("the Go runtime and process collectors are not in the registry")
	}
}

// Two Metrics are independent: nothing is registered globally.
func TestOwnRegistry(t *testing.T) {
	a, b := New(), New()
	a.Committed([]*chat.Event{{Type: chat.EventRunStarted}})
	if got := value(t, b, "gateway_runs_started_total"); got != 0 {
		t.Fatalf("a second Metrics sees %g runs started by the first", got)
	}
}

// A slow close is counted under its transport's own metric.
func TestSlowClosedByTransport(t *testing.T) {
	m := New()
	m.SlowClosed("websocket", "queue_overflow")
	m.SlowClosed("sse", "stuck_write")
	m.SlowClosed("sse", "stuck_write")
	for _, c := range []struct {
		name, reason string
		want         float64
	}{
		{"gateway_websocket_slow_closes_total", "queue_overflow", 1},
		{"gateway_websocket_slow_closes_total", "stuck_write", 0},
		{"gateway_sse_slow_closes_total", "stuck_write", 2},
		{"gateway_sse_slow_closes_total", "queue_overflow", 0},
	} {
		if got := value(t, m, c.name, "reason", c.reason); got != c.want {
			t.Errorf("%s{reason=%q} = %g, want %g", c.name, c.reason, got, c.want)
		}
	}
}

// What runs per delta, per frame and per transaction allocates nothing.
func TestHotPathDoesNotAllocate(t *testing.T) {
	m := New()
	batch := make([]*chat.Event, 64)
	for i := range batch {
		batch[i] = &chat.Event{Type: chat.EventMessageDelta}
	}
	allocs := testing.AllocsPerRun(200, func() {
		m.Committed(batch)
		m.FrameReceived(120)
		m.FrameSent(4096)
		m.Transaction("write", 300*time.Microsecond)
		m.Transaction("write", 300*time.Microsecond)
		m.GroupCommitted(12)
		m.StreamBuffered(64)
		m.FirstToken(40 * time.Millisecond)
		m.CancelAcked("websocket", 200*time.Microsecond)
		m.RunsExecuting(1)
		m.RunsExecuting(-1)
	})
	if allocs != 0 {
		t.Fatalf("%g allocations per call, want 0", allocs)
	}
}

func BenchmarkCommitted64Deltas(b *testing.B) {
	m := New()
	batch := make([]*chat.Event, 64)
	for i := range batch {
		batch[i] = &chat.Event{Type: chat.EventMessageDelta}
	}
	b.ReportAllocs()
	for b.Loop() {
		m.Committed(batch)
	}
}

func BenchmarkFrameSent(b *testing.B) {
	m := New()
	b.ReportAllocs()
	for b.Loop() {
		m.FrameSent(4096)
	}
}

func TestWatchBusReadsAtScrape(t *testing.T) {
	m := New()
	counts := BusCounts{Recoveries: 3, Recovered: 7}
	m.WatchBus(func() BusCounts { return counts })
	counts.Skipped, counts.Unsent = 1, 2 // changed after registration: read at the scrape
	counts.Yields, counts.Unanswered, counts.WrittenPast, counts.DeltasLost = 4, 5, 6, 8
	for name, want := range map[string]float64{"gateway_bus_recoveries_total": 3, "gateway_bus_recovered_events_total": 7,
		"gateway_bus_skipped_events_total": 1, "gateway_bus_unsent_total": 2,
		"gateway_stream_yields_total": 4, "gateway_stream_yields_unanswered_total": 5, "gateway_stream_written_past_total": 6,
		"gateway_stream_deltas_lost_total": 8} {
		if got := value(t, m, name); got != want {
			t.Errorf("%s = %g, want %g", name, got, want)
		}
	}
}
