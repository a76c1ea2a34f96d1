// Package metrics measures the gateway for Prometheus. A Metrics holds its
// own registry (never the process-wide default), with the Go runtime and
// process collectors, and the gateway's instruments, which the other
// packages record through the small interfaces they declare:
// gateway.Metrics, engine.Metrics and store.Metrics. Committed counts what
// the store commits (runs started and finished, deltas, tool phases) from
// the events it hands to subscribers.
//
// Labels take values from small fixed sets only (a status, a kind, a
// reason, a transport, a tool phase or outcome, a configured tool's name):
// never an id of a user, thread, run, message, tab or connection, and never
// text.
//
// Every method is safe for concurrent use and never blocks: counters,
// gauges and histograms are atomic, and nothing on the per-delta or
// per-frame path allocates.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/honestcancel/gateway/chat"
)

// Label values. They are the ones the recording packages pass; each series
// is created up front, so it is exported (as 0) before the first event.
var (
	// transports of a cancel's ack
	cancelTransports = []string{"websocket", "http"}
	// transports of a connection refused by the per-user limit
	connTransports = []string{"websocket", "sse"}
	// why a WebSocket was closed, or an event stream ended, as a slow
	// consumer: its queue went over its bound, its write was stuck, or an
	// event never reached it
	slowReasons = []string{"queue_overflow", "stuck_write", "missed_events"}
	// the limit behind a rate_limited answer
	rateLimitKinds = []string{"user_commands", "cancels", "connection_commands", "connections", "subscriptions"}
	// run endings
	finishStatuses = []string{string(chat.RunCompleted), string(chat.RunFailed), string(chat.RunCancelled)}
	// store transactions
	txKinds = []string{"write", "read"}
)

// Buckets, in seconds.
var (
	// fastBuckets: work done in-process and in one small transaction
	// (50 µs to 2.5 s).
	fastBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
	// slowBuckets: waits on a model or a tool (1 ms to 2 min).
	slowBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}
)

// Metrics is the gateway's instruments and the registry that exports them.
// Create it with New. Safe for concurrent use.
type Metrics struct {
	reg     *prometheus.Registry
	handler http.Handler

	// WebSocket connections and event streams
	wsOpen      prometheus.Gauge
	sseOpen     prometheus.Gauge
	framesIn    prometheus.Counter
	framesOut   prometheus.Counter
	bytesIn     prometheus.Counter
	bytesOut    prometheus.Counter
	slowCloses  *prometheus.CounterVec
	sseSlow     *prometheus.CounterVec
	refused     *prometheus.CounterVec
	rateLimited *prometheus.CounterVec
	cancelAck   labelledHistogram

	// runs
	runsStarted    prometheus.Counter
	runsFinished   *prometheus.CounterVec
	runsCompleted  prometheus.Counter
	runsFailed     prometheus.Counter
	runsCancelled  prometheus.Counter
	runsExecuting  prometheus.Gauge
	runCapacity    prometheus.Gauge
	runsWaiting    prometheus.Gauge
	firstToken     prometheus.Histogram
	cancelSettle   prometheus.Histogram
	cancelsJournal prometheus.Counter
	tokens         *prometheus.CounterVec
	promptTokens   prometheus.Counter
	completeTokens prometheus.Counter
	deltas         prometheus.Counter
	toolPhases     *prometheus.CounterVec
	toolOutcomes   *prometheus.CounterVec

	// store
	txSeconds    labelledHistogram
	groupSize    prometheus.Histogram
	streamBuffer prometheus.Gauge
}

// New returns the gateway's instruments, registered with the Go runtime and
// process collectors in a registry of their own.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := factory{reg}
	m := &Metrics{
		reg: reg,

		wsOpen: f.gauge("gateway_websocket_connections",
			"WebSocket connections open now."),
		sseOpen: f.gauge("gateway_sse_streams",
			"Server-Sent Event streams (GET /api/threads/{id}/events) open now."),
		framesIn: f.counter("gateway_websocket_frames_received_total",
			"WebSocket data frames received from clients (one command each)."),
		framesOut: f.counter("gateway_websocket_frames_sent_total",
			"WebSocket data frames sent to clients; one frame may carry several events a writer coalesced."),
		bytesIn: f.counter("gateway_websocket_received_bytes_total",
			"Payload bytes of the WebSocket data frames received."),
		bytesOut: f.counter("gateway_websocket_sent_bytes_total",
			"Payload bytes of the WebSocket data frames sent."),
		slowCloses: f.counterVec("gateway_websocket_slow_closes_total",
			"WebSocket connections closed as slow consumers, by reason: "+
				"queue_overflow (more than the queue bound waited, closed with 1013), "+
				"stuck_write (one write blocked too long, dropped), "+
				"missed_events (an event never reached the queue, closed with 1013).",
			"reason", slowReasons),
		sseSlow: f.counterVec("gateway_sse_slow_closes_total",
			"Server-Sent Event streams ended as slow consumers, by reason: "+
				"queue_overflow (fell more than the queue bound behind the live feed), "+
				"stuck_write (one write blocked past the write deadline), "+
				"missed_events (an event never reached the stream). The client reconnects with Last-Event-ID.",
			"reason", slowReasons),
		refused: f.counterVec("gateway_connections_refused_total",
			"WebSocket upgrades and event streams refused because their user already holds the most connections "+
				"allowed (-max-conns-per-user), by transport.",
			"transport", connTransports),
		rateLimited: f.counterVec("gateway_rate_limited_total",
			"Answers rate_limited, by the limit that gave them: user_commands, cancels (the cancel reserve), "+
				"connection_commands, connections (as gateway_connections_refused_total), subscriptions.",
			"kind", rateLimitKinds),
		cancelAck: f.histogramVec("gateway_cancel_ack_seconds",
			"Time from a cancel command's arrival to its ack: until the ack is queued for the connection's writer "+
				"(websocket) or written to the response (http). Acks only, errors not.",
			fastBuckets, "transport", cancelTransports),

		runsStarted: f.counter("gateway_runs_started_total",
			"Runs created (run.started committed)."),
		runsFinished: f.counterVec("gateway_runs_finished_total",
			"Runs ended, by status: completed, failed, cancelled (run.completed, run.failed, run.cancelled committed).",
			"status", finishStatuses),
		runsExecuting: f.gauge("gateway_runs_executing",
			"Runs this process's workers hold now: claimed and not yet completed, failed, cancelled, "+
				"handed back or left waiting for a decision."),
		runCapacity: f.gauge("gateway_run_capacity",
			"Runs this process's workers may execute at once (-workers): its admission capacity."),
		runsWaiting: f.gauge("gateway_runs_waiting",
			"Runs queued and not yet claimed by any instance, as this process last counted them "+
				"(after each claim pass): the runs waiting for a free slot, or for a moment for the next claim."),
		firstToken: f.histogram("gateway_run_first_token_seconds",
			"Time from a worker claiming a run to the model's first chunk (text or tool call); "+
				"claims that start with a tool step are not measured.",
			slowBuckets),
		cancelSettle: f.histogram("gateway_cancel_to_cancelled_seconds",
			"Time from a cancel being accepted (the run's cancel_requested_at, millisecond resolution) "+
				"to the commit of its run.cancelled, whichever worker or process finished it.",
			slowBuckets),
		cancelsJournal: f.counter("gateway_cancels_journaled_total",
			"Cancels acknowledged from the cancel journal (SQLite: synced to DB-cancels while the writer was "+
				"busy, recorded by its next transaction) rather than after a commit of their own."),
		tokens: f.counterVec("gateway_model_tokens_total",
			"Tokens model calls reported using, by kind: prompt or completion (only backends that report usage).",
			"kind", []string{"prompt", "completion"}),
		deltas: f.counter("gateway_deltas_streamed_total",
			"Text deltas written to the stream buffer and sent to subscribers (message.delta committed)."),
		toolPhases: f.counterVec("gateway_tool_phase_transitions_total",
			"Tool operations entering a phase (tool.prepared and tool.updated committed), "+
				"by configured tool and phase.",
			"tool", nil, "phase"),
		toolOutcomes: f.counterVec("gateway_tool_operations_total",
			"Tool operations that reached a final phase, by configured tool and outcome (completed, committed, "+
				"failed, aborted, not_started, unknown).",
			"tool", nil, "outcome"),

		txSeconds: f.histogramVec("gateway_store_transaction_seconds",
			"Time one store transaction takes, from BEGIN to COMMIT or ROLLBACK, by kind: write (one group commit: "+
				"the state changes and stream-buffer writes queued at the time, "+
				"including handing their events to subscribers), read (a read transaction).",
			fastBuckets, "kind", txKinds),
		groupSize: f.histogram("gateway_store_group_commit_requests",
			"Stream-buffer writes (one batch of one run's deltas each) per group-commit transaction.",
			[]float64{1, 2, 4, 8, 16, 32, 64, 128}),
		streamBuffer: f.gauge("gateway_stream_buffer_deltas",
			"Deltas held in the stream buffer now (deltas in stream_batches: counted at start, "+
				"then kept up to date as batches commit and the purge removes them; "+
				"deltas fanned out and not yet written are not counted)."),
	}
	m.runsCompleted = m.runsFinished.WithLabelValues(string(chat.RunCompleted))
	m.runsFailed = m.runsFinished.WithLabelValues(string(chat.RunFailed))
	m.runsCancelled = m.runsFinished.WithLabelValues(string(chat.RunCancelled))
	m.promptTokens = m.tokens.WithLabelValues("prompt")
	m.completeTokens = m.tokens.WithLabelValues("completion")
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, MaxRequestsInFlight: 4})
	return m
}

// Handler serves the registry in Prometheus's exposition format.
func (m *Metrics) Handler() http.Handler { return m.handler }

// Registry is the registry the instruments are in (for tests and for
// adding collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// factory creates and registers instruments.
type factory struct{ reg *prometheus.Registry }

func (f factory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	f.reg.MustRegister(c)
	return c
}

func (f factory) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	f.reg.MustRegister(g)
	return g
}

func (f factory) histogram(name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	f.reg.MustRegister(h)
	return h
}

// counterVec creates a counter with the label first, whose series for
// values exist from the start, and more labels.
func (f factory) counterVec(name, help, label string, values []string, more ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{label}, more...))
	for _, v := range values {
		c.WithLabelValues(v)
	}
	f.reg.MustRegister(c)
	return c
}

// histogramVec creates a histogram with one label, whose series for values
// exist from the start and are held ready to observe.
func (f factory) histogramVec(name, help string, buckets []float64, label string, values []string) labelledHistogram {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, []string{label})
	bound := make([]prometheus.Observer, len(values))
	for i, v := range values {
		bound[i] = h.WithLabelValues(v)
	}
	f.reg.MustRegister(h)
	return labelledHistogram{vec: h, values: values, bound: bound}
}

// labelledHistogram is a histogram with one label whose series for the
// label values known up front are held ready: observing one of those
// neither looks its series up nor allocates (the per-transaction and
// per-cancel paths). Any other value is looked up.
type labelledHistogram struct {
	vec    *prometheus.HistogramVec
	values []string
	bound  []prometheus.Observer
}

// observe records d, in seconds, in the series of the label value.
func (h labelledHistogram) observe(value string, d time.Duration) {
	for i, v := range h.values {
		if v == value {
			h.bound[i].Observe(d.Seconds())
			return
		}
	}
	h.vec.WithLabelValues(value).Observe(d.Seconds())
}

// ---------------------------------------------------------------------------
// What the store commits (its OnCommit events).

// Committed counts what one committed transaction reports: runs started and
// ended, deltas streamed, tool operations' phases and outcomes. Call it with
// the events of every commit, before they are handed to subscribers (so a
// client that saw an event finds it counted). It only counts: no event is
// kept, and nothing of an event but its type, a run's status and a tool's
// name, phase and outcome is looked at.
func (m *Metrics) Committed(events []*chat.Event) {
	deltas := 0
	for _, ev := range events {
		switch ev.Type {
		case chat.EventMessageDelta:
			deltas++
		case chat.EventRunStarted:
			m.runsStarted.Inc()
		case chat.EventRunCompleted:
			m.runsCompleted.Inc()
		case chat.EventRunFailed:
			m.runsFailed.Inc()
		case chat.EventRunCancelled:
			m.runsCancelled.Inc()
		case chat.EventToolPrepared, chat.EventToolUpdated:
			if b, ok := ev.Body.(chat.ToolBody); ok {
				m.toolOperation(b.Operation)
			}
		}
	}
	if deltas > 0 {
		m.deltas.Add(float64(deltas))
	}
}

func (m *Metrics) toolOperation(op chat.Operation) {
	m.toolPhases.WithLabelValues(op.Tool, op.Phase).Inc()
	if !finalPhase(op) {
		return
	}
	outcome := chat.OutcomeNotStarted
	if op.Outcome != nil {
		outcome = *op.Outcome
	}
	m.toolOutcomes.WithLabelValues(op.Tool, outcome).Inc()
}

// finalPhase reports whether an operation is settled: nothing moves it
// again. (unknown is final only once the gateway stopped looking its key
// up, at the reconcile horizon; until then it may still become
// reconciled, and is counted then.)
func finalPhase(op chat.Operation) bool {
	switch op.Phase {
	case chat.PhaseCompleted, chat.PhaseCommitted, chat.PhaseRejected, chat.PhaseVoided,
		chat.PhaseAborted, chat.PhaseFailed, chat.PhaseReconciled:
		return true
	case chat.PhaseUnknown:
		return op.ReconcileNextAt == nil && op.ReconcileUntil != nil
	}
	return false
}

// ---------------------------------------------------------------------------
// gateway.Metrics

// ConnOpened counts an open WebSocket ("websocket") or event stream ("sse").
func (m *Metrics) ConnOpened(transport string) { m.connGauge(transport).Inc() }

// ConnClosed ends what ConnOpened counted.
func (m *Metrics) ConnClosed(transport string) { m.connGauge(transport).Dec() }

func (m *Metrics) connGauge(transport string) prometheus.Gauge {
	if transport == "sse" {
		return m.sseOpen
	}
	return m.wsOpen
}

// FrameReceived counts one WebSocket data frame of n bytes from a client.
func (m *Metrics) FrameReceived(n int) {
	m.framesIn.Inc()
	m.bytesIn.Add(float64(n))
}

// FrameSent counts one WebSocket data frame of n bytes to a client.
func (m *Metrics) FrameSent(n int) {
	m.framesOut.Inc()
	m.bytesOut.Add(float64(n))
}

// SlowClosed counts a WebSocket ("websocket") closed, or an event stream
// ("sse") ended, as a slow consumer, by reason.
func (m *Metrics) SlowClosed(transport, reason string) {
	if transport == "sse" {
		m.sseSlow.WithLabelValues(reason).Inc()
		return
	}
	m.slowCloses.WithLabelValues(reason).Inc()
}

// ConnRefused counts a connection refused by the per-user connection
// limit, in both its counter and the rate_limited answers (kind
// connections).
func (m *Metrics) ConnRefused(transport string) {
	m.refused.WithLabelValues(transport).Inc()
	m.rateLimited.WithLabelValues("connections").Inc()
}

// RateLimited counts a rate_limited answer, by the limit that gave it.
func (m *Metrics) RateLimited(kind string) { m.rateLimited.WithLabelValues(kind).Inc() }

// CancelAcked observes a cancel's time from arrival to ack.
func (m *Metrics) CancelAcked(transport string, d time.Duration) { m.cancelAck.observe(transport, d) }

// ---------------------------------------------------------------------------
// engine.Metrics

// RunsExecuting moves the gauge of runs this process's workers hold.
func (m *Metrics) RunsExecuting(delta int) { m.runsExecuting.Add(float64(delta)) }

// Admission records the engine's capacity and the runs it last counted
// waiting (engine.Metrics).
func (m *Metrics) Admission(capacity, waiting int) {
	m.runCapacity.Set(float64(capacity))
	m.runsWaiting.Set(float64(waiting))
}

// FirstToken observes a claim's time to the model's first chunk.
func (m *Metrics) FirstToken(d time.Duration) { m.firstToken.Observe(d.Seconds()) }

// TokensUsed counts the tokens one model call reported.
func (m *Metrics) TokensUsed(prompt, completion int64) {
	if prompt > 0 {
		m.promptTokens.Add(float64(prompt))
	}
	if completion > 0 {
		m.completeTokens.Add(float64(completion))
	}
}

// ---------------------------------------------------------------------------
// store.Metrics

// Transaction observes one store transaction's duration, by kind.
func (m *Metrics) Transaction(kind string, d time.Duration) { m.txSeconds.observe(kind, d) }

// GroupCommitted observes how many writes one group commit held.
func (m *Metrics) GroupCommitted(requests int) { m.groupSize.Observe(float64(requests)) }

// StreamBuffered moves the count of deltas in the stream buffer.
func (m *Metrics) StreamBuffered(delta int64) { m.streamBuffer.Add(float64(delta)) }

// CancelSettled observes a cancel's time from acceptance to run.cancelled.
func (m *Metrics) CancelSettled(d time.Duration) { m.cancelSettle.Observe(d.Seconds()) }

// CancelJournaled counts a cancel acknowledged from the cancel journal.
func (m *Metrics) CancelJournaled() { m.cancelsJournal.Inc() }

// ---------------------------------------------------------------------------
// The NATS bus between instances.

// BusCounts are the NATS bus's counters since it connected (bus.NATSStats).
type BusCounts struct {
	Recoveries, Recovered, Skipped, Unsent int64
	// The threads handed between instances (store.StreamStats).
	Yields, Unanswered, WrittenPast, DeltasLost int64
}

// WatchBus exports the NATS bus's counters, read from counts at each
// scrape. Call it once, when the gateway runs as one of several instances.
func (m *Metrics) WatchBus(counts func() BusCounts) {
	for _, c := range []struct {
		name, help string
		value      func(BusCounts) int64
	}{
		{
			"gateway_bus_recoveries_total",
			"Reads of the event log by the NATS bus to fill a gap in a thread's seqs (a message NATS lost, " +
				"or an interleaving of two instances' commits).",
			func(b BusCounts) int64 { return b.Recoveries },
		},
		{
			"gateway_bus_recovered_events_total",
			"Events the NATS bus took from the event log because NATS had not brought them.",
			func(b BusCounts) int64 { return b.Recovered },
		},
		{
			"gateway_bus_skipped_events_total",
			"Events neither NATS nor the event log could give (purged): " +
				"the tabs saw a gap and resynced. Should stay 0.",
			func(b BusCounts) int64 { return b.Skipped },
		},
		{
			"gateway_bus_unsent_total",
			"Messages not handed to NATS (its queue was full or it refused them); " +
				"other instances recover their events from the log.",
			func(b BusCounts) int64 { return b.Unsent },
		},
		{
			"gateway_stream_yields_total",
			"Threads another instance streamed on that it handed over when this one had to write them " +
				"(its pending deltas written first).",
			func(b BusCounts) int64 { return b.Yields },
		},
		{
			"gateway_stream_yields_unanswered_total",
			"Requests to hand a thread over that the other instance did not answer in time (gone, stalled or cut off).",
			func(b BusCounts) int64 { return b.Unanswered },
		},
		{
			"gateway_stream_written_past_total",
			"Another process's reserved seqs this instance recorded as lost and wrote past " +
				"(after an unanswered request). Should stay 0 while every instance is healthy.",
			func(b BusCounts) int64 { return b.WrittenPast },
		},
		{
			"gateway_stream_deltas_lost_total",
			"Deltas this instance fanned out and then dropped unwritten because another instance had written past " +
				"them (tabs that saw them resync). Should stay 0 while every instance is healthy.",
			func(b BusCounts) int64 { return b.DeltasLost },
		},
	} {
		value := c.value
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help},
			func() float64 { return float64(value(counts())) }))
	}
}
