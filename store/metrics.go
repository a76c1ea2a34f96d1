package store

import "time"

// Metrics receives the store's measurements (package metrics implements it
// for Prometheus). Methods must be safe for concurrent use and must not
// block: they are called with the write lock held.
type Metrics interface {
	// Transaction observes the duration of one transaction of a kind
	// (txWrite, txRead).
	Transaction(kind string, d time.Duration)
	// GroupCommitted observes how many writes one group commit held.
	GroupCommitted(requests int)
	// StreamBuffered moves the count of deltas in the stream buffer: once
	// at Open by the rows there, then by each commit that adds or purges
	// some.
	StreamBuffered(delta int64)
	// CancelSettled observes, for a run.cancelled just committed, the time
	// since its run's cancel was accepted (cancel_requested_at).
	CancelSettled(d time.Duration)
	// CancelJournaled counts a cancel acknowledged from the cancel journal
	// (canceljournal.go) rather than after its own commit.
	CancelJournaled()
}

// Kinds of transaction passed to Metrics.Transaction.
const (
	txWrite = "write"
	txRead  = "read"
)

// noMetrics records nothing (Options.Metrics nil).
type noMetrics struct{}

func (noMetrics) Transaction(string, time.Duration) {}
func (noMetrics) GroupCommitted(int)                {}
func (noMetrics) StreamBuffered(int64)              {}
func (noMetrics) CancelSettled(time.Duration)       {}
func (noMetrics) CancelJournaled()                  {}

// observe reports a transaction of kind that started at start.
func (s *Store) observe(kind string, start time.Time) {
	s.metrics.Transaction(kind, time.Since(start))
}

// committedLocked reports a committed transaction: first its measurements,
// then its events to OnCommit (so a subscriber that saw an event finds it
// measured). Called with the writer gate held.
func (s *Store) committedLocked(t *txn) {
	if t.buffered != 0 {
		s.metrics.StreamBuffered(t.buffered)
	}
	for _, at := range t.cancelsAccepted {
		s.metrics.CancelSettled(time.Since(fromMS(at)))
	}
	if len(t.events) > 0 {
		s.published(t.events)
	}
	if t.queueStarted {
		s.signalQueueStarts()
	}
}
