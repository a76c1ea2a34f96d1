package engine

import "time"

// Metrics receives the engine's measurements (package metrics implements
// it for Prometheus). Methods must be safe for concurrent use and must not
// block; they are called by the workers, never per delta.
type Metrics interface {
	// RunsExecuting moves the count of runs this engine's workers hold:
	// +1 when a worker takes a claimed run, -1 when it lets go.
	RunsExecuting(delta int)
	// Admission reports the workers' capacity and the queued runs not yet
	// claimed, as dispatch last counted them.
	Admission(capacity, waiting int)
	// FirstToken observes the time from a run's claim to the first chunk
	// of its model's reply.
	FirstToken(d time.Duration)
	// TokensUsed counts the tokens one model call reported.
	TokensUsed(prompt, completion int64)
}

// noMetrics records nothing (Config.Metrics nil).
type noMetrics struct{}

func (noMetrics) RunsExecuting(int)        {}
func (noMetrics) Admission(int, int)       {}
func (noMetrics) FirstToken(time.Duration) {}
func (noMetrics) TokensUsed(int64, int64)  {}

// firstToken measures one claim's time to the model's first chunk, once.
// A claim that starts with a tool step is not measured: its wait is the
// tool's. Used by the run's worker goroutine only.
type firstToken struct {
	claimed time.Time
	done    bool
}

// chunk records the first chunk of the claim.
func (f *firstToken) chunk(m Metrics) {
	if !f.done {
		f.done = true
		m.FirstToken(time.Since(f.claimed))
	}
}
