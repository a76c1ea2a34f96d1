package gateway_test

import (
	"sync"
	"time"
)

// metricsLog is a gateway.Metrics that counts what it is told, by
// "what:label" ("slow:websocket:queue_overflow", "limited:connection_commands",
// "ack:websocket", "open:websocket" …).
type metricsLog struct {
	mu     sync.Mutex
	counts map[string]int
}

func newMetricsLog() *metricsLog { return &metricsLog{counts: map[string]int{}} }

func (m *metricsLog) add(key string, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.counts[key] += n
}

func (m *metricsLog) count(key string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.counts[key]
}

func (m *metricsLog) ConnOpened(transport string)           { m.add("open:"+transport, 1) }
func (m *metricsLog) ConnClosed(transport string)           { m.add("open:"+transport, -1) }
func (m *metricsLog) SlowClosed(t, reason string)           { m.add("slow:"+t+":"+reason, 1) }
func (m *metricsLog) ConnRefused(transport string)          { m.add("refused:"+transport, 1) }
func (m *metricsLog) RateLimited(kind string)               { m.add("limited:"+kind, 1) }
func (m *metricsLog) CancelAcked(t string, _ time.Duration) { m.add("ack:"+t, 1) }

func (m *metricsLog) FrameReceived(n int) {
	m.add("frames_in", 1)
	m.add("bytes_in", n)
}

func (m *metricsLog) FrameSent(n int) {
	m.add("frames_out", 1)
	m.add("bytes_out", n)
}

// waitCount waits (bounded) until key counts want; gauges move when a
// handler ends, a moment after the client saw the close.
func (m *metricsLog) waitCount(key string, want int) int {
	return m.waitCountFor(key, want, waitTimeout)
}

// waitCountFor is waitCount waiting at most d.
func (m *metricsLog) waitCountFor(key string, want int, d time.Duration) int {
	deadline := time.Now().Add(d)
	for m.count(key) != want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
	return m.count(key)
}
