package loadgen

import (
	"math"
	"slices"
	"sort"
	"sync"
)

// Dist summarises a latency distribution, in milliseconds.
type Dist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted, which must be in ascending order; 0 for no samples.
func percentile(sorted []int32, p float64) int32 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// summarize sorts samples (microseconds) in place and returns their
// distribution in milliseconds; NaN (shown as "—") without samples.
func summarize(us []int32) Dist {
	if len(us) == 0 {
		return Dist{P50: math.NaN(), P99: math.NaN(), Max: math.NaN()}
	}
	slices.Sort(us)
	ms := func(v int32) float64 { return float64(v) / 1000 }
	return Dist{N: len(us), P50: ms(percentile(us, 50)), P99: ms(percentile(us, 99)), Max: ms(us[len(us)-1])}
}

// samples collects microsecond samples from one goroutine at a time; a
// bounded number is kept (the first max), the rest are counted only.
type samples struct {
	v       []int32
	dropped int
}

// maxSamples bounds one collector (4 bytes each).
const maxSamples = 4 << 20

func (s *samples) add(us int64) {
	if len(s.v) >= maxSamples {
		s.dropped++
		return
	}
	s.v = append(s.v, int32(min(max(us, 0), math.MaxInt32)))
}

// merged returns the concatenation of every collector's samples.
func merged(all ...*samples) []int32 {
	n := 0
	for _, s := range all {
		n += len(s.v)
	}
	out := make([]int32, 0, n)
	for _, s := range all {
		out = append(out, s.v...)
	}
	return out
}

// errorLog counts protocol errors by kind and keeps the first few examples
// of each. Safe for concurrent use.
type errorLog struct {
	mu       sync.Mutex
	counts   map[string]int
	examples map[string][]string
}

func newErrorLog() *errorLog {
	return &errorLog{counts: map[string]int{}, examples: map[string][]string{}}
}

const examplesPerKind = 3

func (e *errorLog) add(kind, example string) { e.addN(kind, 1, example) }

// addN counts n errors of kind at once (a tab's count of one anomaly).
func (e *errorLog) addN(kind string, n int, example string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.counts[kind] += n
	if len(e.examples[kind]) < examplesPerKind && example != "" {
		e.examples[kind] = append(e.examples[kind], example)
	}
}

func (e *errorLog) total() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, c := range e.counts {
		n += c
	}
	return n
}

// ErrorCount is one kind of protocol error and how often it happened.
type ErrorCount struct {
	Kind     string   `json:"kind"`
	Count    int      `json:"count"`
	Examples []string `json:"examples,omitempty"`
}

func (e *errorLog) list() []ErrorCount {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]ErrorCount, 0, len(e.counts))
	for k, c := range e.counts {
		out = append(out, ErrorCount{Kind: k, Count: c, Examples: e.examples[k]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kind < out[j].Kind })
	return out
}
