package loadgen

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// longWindow is how many exchanges long's figures of the first and of the
// last exchanges each cover.
const longWindow = 10

// longStartEvery is the least time between two run.starts of long's tab.
// One WebSocket connection may send 20 commands a second, burst 40
// (gateway.WSConfig's CommandRate and CommandBurst defaults; not flags),
// and an instant model completes an exchange in a few milliseconds: at
// one start per 60 ms the tab stays under that rate, so no run.start is
// answered rate_limited.
const longStartEvery = 60 * time.Millisecond

// long: one thread with one tab, LongExchanges exchanges one after the
// other (run.start with a short message, wait for run.completed on the
// tab, the next, at most one start per longStartEvery) with the demo
// model at LongPace. Before each start (and once after the last) it reads
// the server's write_bytes and the size of the database's files, and at
// the edges of the first and last exchanges what the database holds: what
// one exchange costs as the conversation grows, the first exchanges
// against the last.
func (r *runner) long(ctx context.Context) (s ScenarioReport) {
	c := r.cfg
	n := c.LongExchanges
	s.Shape = fmt.Sprintf(
		"one thread, one tab, %d exchanges one after another (run.start with a short message, "+
			"wait for run.completed, the next; starts at least %s apart), the demo model at %s a word",
		n, longStartEvery, c.LongPace,
	)
	p := r.startSetUp(ctx, &s, "long", c.LongPace, 1+16, 1, 1, false)
	if p == nil {
		return s
	}
	defer p.finish(ctx, &s)
	th, pid := p.threads[0], p.proc.pid
	first, last := edgeSpans(n, longWindow)
	probes := map[int]bool{first.lo: true, first.hi: true, last.lo: true, last.hi: true}

	// Read at each boundary: just before each exchange's run.start, and
	// as long after the last's start; so each exchange's figures hold
	// what the server wrote from its start to the next (what it wrote
	// after run.completed included) and no write falls between two.
	var written, files []int64
	inUse := map[int]int64{} // at the probed boundaries
	var ioErr, filesErr, inUseErr error
	bounds := 0
	boundary := func(i int) {
		bounds++
		if ioErr == nil {
			var v int64
			v, ioErr = sumWriteBytes([]int{pid})
			written = append(written, v)
		}
		if filesErr == nil {
			var v int64
			v, filesErr = sqliteFiles(p.db)
			files = append(files, v)
		}
		if probes[i] && inUseErr == nil {
			inUse[i], inUseErr = sqliteInUse(ctx, p.db)
		}
	}
	var lastStart time.Time
	pause := func() { // a rate (longStartEvery), not a wait for the server
		if !lastStart.IsZero() {
			sleep(ctx, time.Until(lastStart.Add(longStartEvery)))
		}
	}
	// No exchange is cancelled: awaitEnd's own limits end one that hangs.
	never := time.Now().Add(24 * time.Hour)
	var ackToDone []int64 // µs, per exchange
	r.logf("long: %d exchanges", n)
	for i := range n {
		pause()
		if ctx.Err() != nil {
			break
		}
		boundary(i)
		lastStart = time.Now()
		st, ok := th.startRun(ctx, shortMessage(i))
		if !ok {
			break
		}
		end, ok := th.awaitEnd(ctx, st, never, c.LongPace)
		if !ok {
			break
		}
		if end.typ == chat.EventRunCancelled {
			p.env.errs.add("run_cancelled_unasked", st.runID) // run.failed the tab counts itself
		}
		ackToDone = append(ackToDone, end.at.Sub(st.acked).Microseconds())
	}
	m := len(ackToDone)
	if bounds == m { // not yet read after the last exchange
		pause()
		boundary(m)
	}
	if m < n {
		s.Notes = append(s.Notes, fmt.Sprintf("only %d of %d exchanges completed: the figures are of those", m, n))
		first, last = edgeSpans(m, longWindow)
		if _, ok := inUse[m]; !ok && inUseErr == nil && m > 0 {
			inUse[m], inUseErr = sqliteInUse(ctx, p.db)
		}
	}
	p.env.verifyEnd(ctx, p.threads, 5*time.Second)
	p.finish(ctx, &s)
	after, afterErr := sqliteFiles(p.db)

	var perWrite, perFiles []int64
	for _, e := range []struct {
		what string
		err  error
	}{{"write_bytes (/proc/PID/io)", ioErr}, {"database file sizes", filesErr}, {"database pages in " +
		"use", inUseErr}, {"database size after the stop", afterErr}} {
		if e.err != nil {
			s.Notes = append(s.Notes, e.what+" unavailable: "+e.err.Error())
		}
	}
	if ioErr == nil {
		perWrite = perExchange(written)
	}
	if filesErr == nil {
		perFiles = perExchange(files)
	}
	growth := func(sp span) float64 { // pages in use, per exchange
		a, okA := inUse[sp.lo]
		b, okB := inUse[sp.hi]
		if !okA || !okB || inUseErr != nil || sp.n() == 0 {
			return nan
		}
		return float64(b-a) / float64(sp.n())
	}
	afterMiB := nan
	if afterErr == nil {
		afterMiB = float64(after) / (1 << 20)
	}
	all := span{0, m}
	fl, ll := first.label(), last.label()
	kib := func(v float64) float64 { return v / 1024 }
	dFirst, dLast := spanDist(ackToDone, first), spanDist(ackToDone, last)
	s.Metrics = []Metric{
		metric(
			"bytes written per exchange, "+fl+" (mean, /proc/PID/io)",
			"KiB",
			kib(spanMean(perWrite, first)),
			"≤ 40 KiB",
		),
		metric("bytes written per exchange, "+ll+" (mean)", "KiB", kib(spanMean(perWrite, last)), "≤ 40 KiB"),
		metric(
			"bytes written per exchange, last / first (means)",
			"×",
			ratio(spanMean(perWrite, last), spanMean(perWrite, first)),
			"≤ 1.10×",
		),
		metric("bytes written per exchange, "+fl+" (median)", "KiB", kib(spanMedian(perWrite, first)), ""),
		metric("bytes written per exchange, "+ll+" (median)", "KiB", kib(spanMedian(perWrite, last)), ""),
		metric(fmt.Sprintf("bytes written per exchange, all %d (mean)", m), "KiB", kib(spanMean(perWrite, all)), ""),
		metric("database growth per exchange, "+fl+" (pages in use)", "KiB", kib(growth(first)), ""),
		metric("database growth per exchange, "+ll+" (pages in use)", "KiB", kib(growth(last)), ""),
		metric(
			fmt.Sprintf("database + -wal files growth per exchange, all %d", m),
			"KiB",
			kib(spanMean(perFiles, all)),
			"",
		),
		metric("database + -wal after the server stopped", "MiB", afterMiB, ""),
		metric("run.start ack → run.completed p50, "+fl, "ms", dFirst.P50, ""),
		metric("run.start ack → run.completed p99, "+fl, "ms", dFirst.P99, ""),
		metric("run.start ack → run.completed p50, "+ll, "ms", dLast.P50, ""),
		metric("run.start ack → run.completed p99, "+ll, "ms", dLast.P99, ""),
		metric("exchanges completed", "count", float64(m), ""),
	}
	return s
}

// shortMessage is exchange i's user message: with the word "short", so
// the demo model answers in at most 10 words.
func shortMessage(i int) string {
	return fmt.Sprintf("A short question, number %d: how do goroutines and channels differ?", i+1)
}

// span is the exchanges lo to hi-1 (0-based) of a scenario.
type span struct{ lo, hi int }

func (s span) n() int { return s.hi - s.lo }

// label names the span's exchanges as the report counts them, from 1.
func (s span) label() string {
	switch s.n() {
	case 0:
		return "no exchange"
	case 1:
		return fmt.Sprintf("exchange %d", s.hi)
	}
	return fmt.Sprintf("exchanges %d–%d", s.lo+1, s.hi)
}

// edgeSpans are the first k and the last k of n exchanges: all n when
// there are fewer than k, overlapping when fewer than 2k.
func edgeSpans(n, k int) (first, last span) {
	k = max(0, min(k, n))
	return span{0, k}, span{n - k, n}
}

// perExchange turns the readings of a counter taken before the first
// exchange and after each (n+1 readings) into what each of the n
// exchanges added.
func perExchange(readings []int64) []int64 {
	if len(readings) < 2 {
		return nil
	}
	out := make([]int64, len(readings)-1)
	for i := range out {
		out[i] = readings[i+1] - readings[i]
	}
	return out
}

// spanValues is per's values over s; nil when per does not cover it.
func spanValues(per []int64, s span) []int64 {
	if s.lo < 0 || s.hi > len(per) || s.n() <= 0 {
		return nil
	}
	return per[s.lo:s.hi]
}

// spanMean is the mean of per over s; NaN when per does not cover it.
func spanMean(per []int64, s span) float64 {
	v := spanValues(per, s)
	if len(v) == 0 {
		return nan
	}
	var sum int64
	for _, x := range v {
		sum += x
	}
	return float64(sum) / float64(len(v))
}

// spanMedian is the median of per over s (the mean of the two middle
// values for an even count); NaN when per does not cover it.
func spanMedian(per []int64, s span) float64 {
	v := slices.Clone(spanValues(per, s))
	if len(v) == 0 {
		return nan
	}
	slices.Sort(v)
	h := len(v) / 2
	if len(v)%2 == 1 {
		return float64(v[h])
	}
	return (float64(v[h-1]) + float64(v[h])) / 2
}

// spanDist summarizes the microsecond samples of per over s.
func spanDist(per []int64, s span) Dist {
	v := spanValues(per, s)
	us := make([]int32, len(v))
	for i, x := range v {
		us[i] = int32(min(max(x, 0), math.MaxInt32))
	}
	return summarize(us)
}

// ratio is a / b; NaN unless both are figures and b is positive.
func ratio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b <= 0 {
		return nan
	}
	return a / b
}
