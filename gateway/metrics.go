package gateway

import (
	"net/http"
	"time"
)

// Metrics receives the gateway's measurements (package metrics implements
// it for Prometheus). Every method must be safe for concurrent use and must
// not block: they are called on a connection's reader and writer, some
// with the connection's lock held. String arguments are one of the label
// values below, never an id.
type Metrics interface {
	// ConnOpened and ConnClosed bracket an open connection of a transport
	// (transportWebSocket, transportSSE).
	ConnOpened(transport string)
	ConnClosed(transport string)
	// FrameReceived and FrameSent count one WebSocket data frame of n
	// payload bytes.
	FrameReceived(n int)
	FrameSent(n int)
	// SlowClosed counts a WebSocket closed, or an event stream ended, as a
	// slow consumer (transportWebSocket, transportSSE; slowQueue,
	// slowStuck, slowMissed).
	SlowClosed(transport, reason string)
	// ConnRefused counts a connection of a transport refused by the
	// per-user connection limit, which is also a rate_limited answer
	// (the recorder counts it as kind "connections"; RateLimited is not
	// called for it).
	ConnRefused(transport string)
	// RateLimited counts a rate_limited answer by the limit that gave it
	// (limitUserCommands, limitCancels, limitConnCommands,
	// limitSubscriptions).
	RateLimited(kind string)
	// CancelAcked observes the time from a cancel's arrival to its ack
	// (transportWebSocket, transportHTTP).
	CancelAcked(transport string, d time.Duration)
}

// Label values passed to Metrics.
const (
	transportWebSocket = "websocket"
	transportSSE       = "sse"
	transportHTTP      = "http"

	slowQueue  = "queue_overflow"
	slowStuck  = "stuck_write"
	slowMissed = "missed_events"

	limitUserCommands  = "user_commands"
	limitCancels       = "cancels"
	limitConnCommands  = "connection_commands"
	limitSubscriptions = "subscriptions"
)

// noMetrics records nothing (Config.Metrics nil).
type noMetrics struct{}

func (noMetrics) ConnOpened(string)                 {}
func (noMetrics) ConnClosed(string)                 {}
func (noMetrics) FrameReceived(int)                 {}
func (noMetrics) FrameSent(int)                     {}
func (noMetrics) SlowClosed(string, string)         {}
func (noMetrics) ConnRefused(string)                {}
func (noMetrics) RateLimited(string)                {}
func (noMetrics) CancelAcked(string, time.Duration) {}

// timedCancel measures an HTTP cancel from its arrival (before
// authentication and the rate limit) to its ack written: only a 202 is
// observed.
func (s *Server) timedCancel(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		if sw.status == http.StatusAccepted {
			s.metrics.CancelAcked(transportHTTP, time.Since(start))
		}
	})
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
