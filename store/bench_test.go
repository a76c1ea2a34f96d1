package store_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// BenchmarkAppendDeltas200Runs: 200 runs streaming at once on a real
// database (testDSN: a SQLite file by default), with 1 delta per
// AppendDeltas call (a model at a human pace hands the engine one word at
// a time) and with 8 (the engine's pump
// batches what queued while it waited for the writer). Reports buffered
// deltas per second; b.N counts deltas.
func BenchmarkAppendDeltas200Runs(b *testing.B) {
	for _, per := range []int{1, 8} {
		b.Run(fmt.Sprintf("per-call=%d", per), func(b *testing.B) {
			benchAppendWith(b, per, store.Options{OnCommit: func([]*chat.Event) {}})
		})
	}
}

func benchAppendWith(b *testing.B, per int, opts store.Options) {
	st, err := store.Open(ctx, testDSN(b), opts)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	const runs = 200
	ids := make([]string, runs)
	for i := range ids {
		_, ids[i] = newThreadWithRun(b, st, "go")
		if _, err := st.Claim(ctx, "w", time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, run := range ids {
		wg.Go(func() {
			msg := fmt.Sprintf("msg_bench%d", i)
			batch := make([]string, per)
			for j := range batch {
				batch[j] = "word "
			}
			for next.Add(int64(per)) <= int64(b.N) {
				if err := st.AppendDeltas(ctx, leaseW(run), msg, batch); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "deltas/s")
}

// BenchmarkSynchronous is what each SQLite synchronous setting costs on
// this disk: plain writes one at a time (CreateThread: one transaction, so
// under full one sync of the WAL each; reports commits/s), and 200 runs'
// deltas through group commit, 8 per call (reports deltas/s; commits are
// shared, so a sync is too).
func BenchmarkSynchronous(b *testing.B) {
	for _, setting := range []string{store.SynchronousNormal, store.SynchronousFull} {
		b.Run("sync="+setting+"/plain-write", func(b *testing.B) {
			st, err := store.Open(ctx, testDSN(b), store.Options{Synchronous: setting})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			start := time.Now()
			for b.Loop() {
				if _, err := st.CreateThread(ctx, user, "t"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "commits/s")
		})
		b.Run("sync="+setting+"/deltas-200-runs-per-call=8", func(b *testing.B) {
			benchAppendWith(b, 8, store.Options{OnCommit: func([]*chat.Event) {}, Synchronous: setting})
		})
	}
}

// BenchmarkSearchThreads: one user's 1,000 threads of 20 messages of
// 1,000 bytes each (20 MB of text), searched for a word no message holds
// (every message is read: the worst case) and for one in every title (the
// title settles it: no message is read). The search is a scan, not an
// index (store.ListThreads); this says what it costs. The messages are
// written straight into the table: the benchmark measures the read.
func BenchmarkSearchThreads(b *testing.B) {
	dsn := testDSN(b)
	st, err := store.Open(ctx, dsn, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	const threads, perThread = 1000, 20
	var ids []string
	for i := range threads {
		snap, err := st.CreateThread(ctx, user, fmt.Sprintf("thread %d about gardens", i))
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, snap.ThreadID)
	}
	db := rawDB(b, dsn).db
	tx := db.MustBegin()
	text := strings.Repeat("soil water light compost mulch ", 34)[:1000]
	for _, id := range ids {
		for j := range perThread {
			tx.MustExec(tx.Rebind(`INSERT INTO messages (message_id, thread_id, role, kind, content, state_version, checkpoint_id, created_at)
				VALUES (?, ?, 'user', 'text', ?, 1, 'cp_bench', ?)`), chat.NewID(chat.PrefixMessage), id, text, int64(j))
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, q string }{{"no-match", "zucchini"}, {"every-title", "gardens"}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, _, err := st.ListThreads(ctx, user, 50, "", c.q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
