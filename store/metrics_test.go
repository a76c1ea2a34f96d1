package store_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/metrics"
	"github.com/honestcancel/gateway/store"
)

// recorder is a store.Metrics that keeps what it was told.
type recorder struct {
	mu        sync.Mutex
	tx        map[string]int
	groups    []int
	buffered  int64
	settled   []time.Duration
	journaled int
}

func newRecorder() *recorder { return &recorder{tx: map[string]int{}} }

func (r *recorder) Transaction(kind string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d < 0 {
		panic("negative duration")
	}
	r.tx[kind]++
}

func (r *recorder) GroupCommitted(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.groups = append(r.groups, n)
}

func (r *recorder) StreamBuffered(delta int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buffered += delta
}

func (r *recorder) CancelSettled(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.settled = append(r.settled, d)
}

func (r *recorder) CancelJournaled() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.journaled++
}

func (r *recorder) bufferedNow() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buffered
}

// rows counts the deltas of stream_batches directly in the database.
func rows(t *testing.T, path string) int64 {
	t.Helper()
	db := rawDB(t, path)
	var n int64
	if err := db.QueryRow(`SELECT COALESCE(SUM(last_seq - first_seq + 1), 0) FROM stream_batches`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The stream buffer's size is kept, not counted per scrape: it starts at
// the rows there at Open, grows by what commits (a refused write in a group
// adds nothing), and shrinks by what the purge removes; it equals the rows
// in the table throughout. Every finished cancel is measured once, from
// its cancel_requested_at.
func TestMetricsStreamBufferAndCancel(t *testing.T) {
	path := testDSN(t)
	rec := newRecorder()
	st, err := store.Open(ctx, path, store.Options{Metrics: rec})
	if err != nil {
		t.Fatal(err)
	}
	runs, _ := startRuns(t, st, 4)
	if err := st.AppendDeltas(ctx, leaseW(runs[0]), "msg_m0", []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	// Run 1 is cancelled; then four appends share one group, one refused.
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: runs[1], Reason: "user_requested", RequestedBy: "tab:t"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // so the cancel's latency is visibly above zero
	if done, err := st.FinishCancel(ctx, runs[1], ptr(leaseW(runs[1])), 0); err != nil || !done {
		t.Fatalf("finish cancel: %v %v", done, err)
	}
	release := st.HoldWriter()
	var wg sync.WaitGroup
	for i, run := range runs {
		wg.Go(func() { _ = st.AppendDeltas(ctx, leaseW(run), fmt.Sprintf("msg_g%d", i), []string{"x", "y", "z"}) })
	}
	waitUntil(t, func() bool { return st.QueuedWrites() >= len(runs) }, release, fmt.Sprintf("the %d writes never all queued", len(runs)))
	release()
	wg.Wait()

	if got, want := rec.bufferedNow(), rows(t, path); got != want || want != 2+3*3 {
		t.Fatalf("buffered %d, table has %d rows; want both %d", got, want, 2+3*3)
	}
	rec.mu.Lock()
	if len(rec.settled) != 1 || rec.settled[0] < 5*time.Millisecond || rec.settled[0] > 10*time.Second {
		t.Errorf("cancel settled %v, want one observation of at least 5ms", rec.settled)
	}
	if rec.tx["write"] < 2 {
		t.Errorf("transactions %v, want at least 2 write transactions", rec.tx)
	}
	sawGroup := false
	for _, n := range rec.groups {
		sawGroup = sawGroup || n == len(runs)
	}
	if !sawGroup {
		t.Errorf("group sizes %v, want one of %d", rec.groups, len(runs))
	}
	rec.mu.Unlock()
	if _, err := st.Snapshot(ctx, user, mustThreadOf(t, st, runs[0])); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	if rec.tx["read"] == 0 {
		t.Errorf("no read transaction measured")
	}
	rec.mu.Unlock()

	// Purging everything takes the gauge to zero with the table.
	if n, err := st.Retention().PurgeStream(ctx, time.Now().Add(time.Hour)); err != nil || n != 11 {
		t.Fatalf("purge: %d %v, want 11", n, err)
	}
	if got := rec.bufferedNow(); got != 0 || rows(t, path) != 0 {
		t.Fatalf("after the purge: buffered %d, rows %d", got, rows(t, path))
	}
	if err := st.AppendDeltas(ctx, leaseW(runs[2]), "msg_m2", []string{"p", "q"}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	// Reopened, the count starts from the rows in the file; without
	// Metrics nothing is counted.
	again := newRecorder()
	st, err = store.Open(ctx, path, store.Options{Metrics: again})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := again.bufferedNow(); got != 2 {
		t.Fatalf("reopened: buffered %d, want the 2 rows in the file", got)
	}
}

func mustThreadOf(t *testing.T, st *store.Store, runID string) string {
	t.Helper()
	r, err := st.Run(ctx, user, runID)
	if err != nil {
		t.Fatal(err)
	}
	return r.ThreadID
}

// BenchmarkAppendDeltas200RunsWithMetrics is BenchmarkAppendDeltas200Runs
// with the Prometheus instruments recording (transaction latency, group
// sizes, the buffer gauge, and the deltas counted from the committed
// events): compare the two for the metrics' cost on the hot path.
func BenchmarkAppendDeltas200RunsWithMetrics(b *testing.B) {
	for _, per := range []int{1, 8} {
		b.Run(fmt.Sprintf("per-call=%d", per), func(b *testing.B) {
			m := metrics.New()
			benchAppendWith(b, per, store.Options{OnCommit: m.Committed, Metrics: m})
		})
	}
}
