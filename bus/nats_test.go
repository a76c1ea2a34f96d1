package bus_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/honestcancel/gateway/bus"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/internal/natstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitLimit bounds every wait of these tests.
const waitLimit = 15 * time.Second

// natsURL is the NATS server these tests use, or a skip.
func natsURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("GATEWAY_TEST_NATS_URL")
	if u == "" {
		t.Skip("set GATEWAY_TEST_NATS_URL (e.g. nats://127.0.0.1:4222) to run the NATS bus tests against a real server")
	}
	return u
}

// testSubject isolates one test's buses from every other user of the server.
func testSubject() string {
	var b [6]byte
	rand.Read(b[:])
	return "gwtest" + hex.EncodeToString(b[:])
}

// memLog is the store's contract in memory: a commit appends events with
// the thread's next seqs; the committing instance then publishes them.
type memLog struct {
	mu      sync.Mutex
	threads map[string][]*chat.Event
	// reading, when set, makes ThreadEvents signal on it and then wait for
	// its ctx to end.
	reading chan struct{}
	// purged makes ThreadEvents answer as a store whose deltas are gone:
	// not Complete, no events.
	purged bool
}

func newMemLog() *memLog { return &memLog{threads: map[string][]*chat.Event{}} }

func (l *memLog) append(thread string, n int) []*chat.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*chat.Event
	for range n {
		seq := int64(len(l.threads[thread]) + 1)
		ev := &chat.Event{Type: chat.EventMessageDelta, ThreadID: thread, Seq: seq, TS: chat.Now(), RunID: "run_1",
			Body: chat.MessageDeltaBody{MessageID: "msg_1", Text: "t" + strconv.FormatInt(seq, 10)}}
		if err := ev.Encode(); err != nil {
			panic(err)
		}
		l.threads[thread] = append(l.threads[thread], ev)
		out = append(out, ev)
	}
	return out
}

func (l *memLog) ThreadEvents(ctx context.Context, thread string, after int64) (chat.Replay, error) {
	if l.reading != nil {
		select {
		case l.reading <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return chat.Replay{}, ctx.Err()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	evs := l.threads[thread]
	if l.purged {
		return chat.Replay{LastSeq: int64(len(evs))}, nil
	}
	rep := chat.Replay{LastSeq: int64(len(evs)), Complete: true}
	for _, ev := range evs {
		if ev.Seq > after {
			rep.Events = append(rep.Events, ev)
		}
	}
	return rep, nil
}

func (l *memLog) LastSeqs(_ context.Context, threads []string) (map[string]int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int64{}
	for _, id := range threads {
		out[id] = int64(len(l.threads[id]))
	}
	return out, nil
}

// instance is one gateway: its bus, and the write lock under which its
// store commits and publishes.
type instance struct {
	bus *bus.NATS
	log *memLog
	mu  sync.Mutex
}

// commit appends n events to the thread; publish=false is an instance that
// died between its commit and its publish.
func (in *instance) commit(thread string, n int, publish bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	evs := in.log.append(thread, n)
	if publish {
		in.bus.Publish(evs)
	}
}

func dial(t *testing.T, url string, log *memLog, cfg bus.NATSConfig) *instance {
	t.Helper()
	cfg.Log = log
	b, err := bus.DialNATS(url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return &instance{bus: b, log: log}
}

// watchedPair dials two instances that share log and a fresh subject, both
// with cfg, and watches thread on the second with a new sink.
func watchedPair(t *testing.T, log *memLog, cfg bus.NATSConfig, thread string) (a, b *instance, sb *recSink) {
	t.Helper()
	url := natsURL(t)
	cfg.Subject = testSubject()
	a, b = dial(t, url, log, cfg), dial(t, url, log, cfg)
	sb = newSink(thread)
	b.bus.Add(thread, sb)
	return a, b, sb
}

// recSink records every seq it is given, as the gateway's sinks would see
// them.
type recSink struct {
	thread  string
	mu      sync.Mutex
	seqs    []int64
	wrong   []string
	changed chan struct{}
}

func newSink(thread string) *recSink {
	return &recSink{thread: thread, changed: make(chan struct{}, 1)}
}

func (s *recSink) Deliver(ev *chat.Event) bool {
	s.mu.Lock()
	s.seqs = append(s.seqs, ev.Seq)
	if ev.ThreadID != s.thread || len(ev.Raw) == 0 {
		s.wrong = append(s.wrong, fmt.Sprintf("seq %d: thread %q, %d bytes", ev.Seq, ev.ThreadID, len(ev.Raw)))
	}
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return true
}

// waitSeqs waits until the sink has been given n events and checks they are
// exactly 1..n.
func (s *recSink) waitSeqs(t *testing.T, name string, n int) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		s.mu.Lock()
		got := slices.Clone(s.seqs)
		wrong := s.wrong
		s.mu.Unlock()
		if len(got) >= n {
			if want := seqRange(1, n); !slices.Equal(got, want) || len(wrong) > 0 {
				t.Fatalf("%s got seqs %v (bad: %v), want exactly %v", name, got, wrong, want)
			}
			return
		}
		select {
		case <-s.changed:
		case <-deadline:
			t.Fatalf("%s: after %s got seqs %v, want 1..%d", name, waitLimit, got, n)
		}
	}
}

func seqRange(from, to int) []int64 {
	var out []int64
	for s := from; s <= to; s++ {
		out = append(out, int64(s))
	}
	return out
}

func TestNATSInterleavedCommitsOfTwoInstances(t *testing.T) {
	url := natsURL(t)
	log := newMemLog()
	subj := testSubject()
	a := dial(t, url, log, bus.NATSConfig{Subject: subj, Name: "a"})
	b := dial(t, url, log, bus.NATSConfig{Subject: subj, Name: "b"})
	const thread = "thr_interleaved"
	sa, sb := newSink(thread), newSink(thread)
	a.bus.Add(thread, sa)
	b.bus.Add(thread, sb)
	sub := b.bus.Subscribe(thread, 1000)
	defer sub.Close()
	log.append("thr_nobody_watches", 3) // other threads stay out of the way

	const perInstance = 200
	var wg sync.WaitGroup
	for i, in := range []*instance{a, b} {
		wg.Go(func() {
			for k := 0; k < perInstance; {
				n := 1 + (k+i)%3
				n = min(n, perInstance-k)
				in.commit(thread, n, true)
				in.commit("thr_nobody_watches", 1, true)
				k += n
			}
		})
	}
	wg.Wait()
	sa.waitSeqs(t, "instance a's sink", 2*perInstance)
	sb.waitSeqs(t, "instance b's sink", 2*perInstance)
	t.Logf("a: %+v, b: %+v", a.bus.Stats(), b.bus.Stats())
	noSkips(t, a, b)
	deadline := time.After(waitLimit)
	for want := int64(1); want <= 2*perInstance; want++ {
		select {
		case ev := <-sub.Events():
			if ev == nil || ev.Seq != want {
				t.Fatalf("subscription got %+v, want seq %d (err %v)", ev, want, sub.Err())
			}
		case <-deadline:
			t.Fatalf("subscription stuck before seq %d", want)
		}
	}
}

func TestNATSLostPublishIsRecoveredBySweep(t *testing.T) {
	url := natsURL(t)
	log := newMemLog()
	subj := testSubject()
	a := dial(t, url, log, bus.NATSConfig{Subject: subj, SweepEvery: 50 * time.Millisecond})
	b := dial(t, url, log, bus.NATSConfig{Subject: subj, SweepEvery: 50 * time.Millisecond})
	const thread = "thr_lost_tail"
	log.append(thread, 2) // history before anyone watches
	sa, sb := newSink(thread), newSink(thread)
	a.bus.Add(thread, sa)
	b.bus.Add(thread, sb)

	a.commit(thread, 2, true)  // seqs 3, 4
	a.commit(thread, 1, false) // seq 5: a died before publishing; nothing follows
	want := []int64{3, 4, 5}
	for name, s := range map[string]*recSink{"a": sa, "b": sb} {
		waitExact(t, name, s, want)
	}
	recovered(t, "a", a, 1)
	recovered(t, "b", b, 1)
	noSkips(t, a, b)
}

// recovered checks that in took at least n events from the log.
func recovered(t *testing.T, name string, in *instance, n int64) {
	t.Helper()
	if st := in.bus.Stats(); st.Recovered < n {
		t.Errorf("%s recovered %d events from the log, want at least %d (%+v)", name, st.Recovered, n, st)
	}
}

// noSkips checks that no bus delivered past a gap.
func noSkips(t *testing.T, ins ...*instance) {
	t.Helper()
	for i, in := range ins {
		if st := in.bus.Stats(); st.Skipped != 0 || st.Unsent != 0 {
			t.Errorf("instance %d skipped or did not send events: %+v", i, st)
		}
	}
}

func TestNATSLostPublishIsRecoveredByTheNextEvent(t *testing.T) {
	const thread = "thr_lost_middle"
	// No sweep during the test: only the gap before seq 4 can bring seq 3.
	a, b, sb := watchedPair(t, newMemLog(), bus.NATSConfig{SweepEvery: time.Hour}, thread)

	a.commit(thread, 2, true)  // 1, 2
	a.commit(thread, 1, false) // 3: its publish is lost
	a.commit(thread, 2, true)  // 4, 5
	b.commit(thread, 1, true)  // 6, delivered locally on b
	sb.waitSeqs(t, "b's sink", 6)
	recovered(t, "b", b, 1)
	noSkips(t, a, b)
}

func TestNATSGapTheLogCannotFillIsDeliveredPast(t *testing.T) {
	const thread = "thr_purged"
	log := newMemLog()
	log.purged = true
	a, b, sb := watchedPair(t, log, bus.NATSConfig{SweepEvery: time.Hour}, thread)
	a.commit(thread, 1, true)
	a.commit(thread, 1, false) // 2: lost, and the log no longer has it
	a.commit(thread, 1, true)
	// The sink is given 3 right after 1: it sees the gap (a WebSocket
	// closes and its client resyncs).
	waitExact(t, "b", sb, []int64{1, 3})
	if st := b.bus.Stats(); st.Skipped != 1 {
		t.Errorf("b skipped %d seqs, want 1 (%+v)", st.Skipped, st)
	}
}

// A lost event the log cannot give either, with nothing after it: no seq
// will ever show the gap, so a LossAware sink (here a Subscription; a
// WebSocket closes the same way) is told and dropped: its reader starts
// over instead of waiting on stale state forever.
func TestNATSLostTailEndsLossAwareSinks(t *testing.T) {
	url := natsURL(t)
	log := newMemLog()
	log.purged = true
	subj := testSubject()
	a := dial(t, url, log, bus.NATSConfig{Subject: subj, SweepEvery: time.Hour})
	b := dial(t, url, log, bus.NATSConfig{Subject: subj, SweepEvery: 20 * time.Millisecond})
	const thread = "thr_lost_tail"
	sub := b.bus.Subscribe(thread, 16)
	defer sub.Close()
	// A sink that already has what is lost (a tab that caught up from the
	// log or saw it on another instance) stays, and gets what follows.
	ahead := &aheadSink{recSink: newSink(thread), has: 2, lost: make(chan struct{}, 1)}
	b.bus.Add(thread, ahead)
	a.commit(thread, 1, true)
	a.commit(thread, 1, false) // 2: lost, the log no longer has it, nothing follows
	var got []int64
	deadline := time.After(waitLimit)
	for open := true; open; {
		select {
		case ev, ok := <-sub.Events():
			if !ok {
				open = false
				break
			}
			got = append(got, ev.Seq)
		case <-deadline:
			t.Fatalf("the subscription still waits after %v with seqs %v: nobody told it seq 2 is gone", waitLimit, got)
		}
	}
	if !slices.Equal(got, []int64{1}) || !errors.Is(sub.Err(), bus.ErrLagged) {
		t.Fatalf("the subscription got %v and ended with %v, want [1] and ErrLagged", got, sub.Err())
	}
	if st := b.bus.Stats(); st.Skipped != 1 {
		t.Errorf("b skipped %d seqs, want 1 (%+v)", st.Skipped, st)
	}
	select { // (the bus tells its sinks one by one: the subscription may have been first)
	case <-ahead.lost:
	case <-time.After(waitLimit):
		t.Fatal("the sink ahead was never told of the loss")
	}
	if got := ahead.told(); !slices.Equal(got, []int64{2}) {
		t.Fatalf("the sink ahead was told of losses through %v, want [2]", got)
	}
	a.commit(thread, 1, true) // 3
	waitExact(t, "the sink ahead", ahead.recSink, []int64{1, 3})
}

// aheadSink is a LossAware sink that has every seq through has: it keeps
// its subscription when told of a loss up to there.
type aheadSink struct {
	*recSink
	has    int64
	lost   chan struct{} // signalled at each Lost
	mu     sync.Mutex
	losses []int64
}

func (s *aheadSink) Lost(_ string, through int64) bool {
	s.mu.Lock()
	s.losses = append(s.losses, through)
	s.mu.Unlock()
	select {
	case s.lost <- struct{}{}:
	default:
	}
	return through <= s.has
}

func (s *aheadSink) told() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.losses)
}

func TestNATSPendingBoundDeliversPastTheGap(t *testing.T) {
	url := natsURL(t)
	log := newMemLog()
	stuck := newMemLog() // b's log reads never end: only the bound can move b on
	stuck.reading = make(chan struct{}, 1)
	subj := testSubject()
	a := dial(t, url, log, bus.NATSConfig{Subject: subj, SweepEvery: time.Hour})
	b := dial(t, url, stuck, bus.NATSConfig{Subject: subj, SweepEvery: time.Hour, MaxPending: 3})
	const thread = "thr_bound"
	sb := newSink(thread)
	b.bus.Add(thread, sb)
	a.commit(thread, 1, true)
	a.commit(thread, 1, false) // 2 is lost
	a.commit(thread, 3, true)  // 3..5 held behind the gap
	waitExact(t, "b", sb, []int64{1})
	a.commit(thread, 1, true) // 6: over the bound
	waitExact(t, "b", sb, []int64{1, 3, 4, 5, 6})
	if st := b.bus.Stats(); st.Skipped != 1 {
		t.Errorf("b skipped %d seqs, want 1 (%+v)", st.Skipped, st)
	}
}

// waitExact waits until s has len(want) seqs and checks they are want.
func waitExact(t *testing.T, name string, s *recSink, want []int64) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		s.mu.Lock()
		got := slices.Clone(s.seqs)
		s.mu.Unlock()
		if len(got) >= len(want) {
			if !slices.Equal(got, want) {
				t.Fatalf("%s got seqs %v, want exactly %v", name, got, want)
			}
			return
		}
		select {
		case <-s.changed:
		case <-deadline:
			t.Fatalf("%s: after %s got seqs %v, want %v", name, waitLimit, got, want)
		}
	}
}

func TestNATSRestartMidStream(t *testing.T) {
	srv := natstest.Start(t)
	log := newMemLog()
	subj := testSubject()
	// No periodic sweep: only the reconnect's recovery (or the messages
	// the client buffered while disconnected) can bring the outage's events.
	a := dial(t, srv.URL(), log, bus.NATSConfig{Subject: subj, Name: "a", SweepEvery: time.Hour})
	b := dial(t, srv.URL(), log, bus.NATSConfig{Subject: subj, Name: "b", SweepEvery: time.Hour})
	const thread = "thr_restart"
	sa, sb := newSink(thread), newSink(thread)
	a.bus.Add(thread, sa)
	b.bus.Add(thread, sb)

	a.commit(thread, 5, true)
	sb.waitSeqs(t, "b before the restart", 5)

	srv.Stop()
	a.commit(thread, 3, true)  // 6..8: published into the outage
	a.commit(thread, 2, false) // 9, 10: publishes lost in the outage
	sa.waitSeqs(t, "a during the outage", 8)
	srv.Start()

	sb.waitSeqs(t, "b after the restart", 10)
	b.commit(thread, 2, true) // 11, 12 over the restarted server
	sa.waitSeqs(t, "a after the restart", 12)
	sb.waitSeqs(t, "b at the end", 12)
	recovered(t, "a", a, 2) // 9 and 10 were never published
	recovered(t, "b", b, 2)
	if st := a.bus.Stats(); st.Skipped != 0 {
		t.Errorf("a skipped events: %+v", st)
	}
	if st := b.bus.Stats(); st.Skipped != 0 {
		t.Errorf("b skipped events: %+v", st)
	}
	t.Logf("a: %+v, b: %+v", a.bus.Stats(), b.bus.Stats())
}

func TestNATSCancelWakeUpReachesOnlyTheOtherInstance(t *testing.T) {
	url := natsURL(t)
	log := newMemLog()
	subj := testSubject()
	gotA, gotB := make(chan string, 10), make(chan string, 10)
	a := dial(t, url, log, bus.NATSConfig{Subject: subj})
	b := dial(t, url, log, bus.NATSConfig{Subject: subj})
	a.bus.SetHandlers(bus.Handlers{OnCancel: func(id string) { gotA <- id }})
	b.bus.SetHandlers(bus.Handlers{OnCancel: func(id string) { gotB <- id }})
	recv := func(name string, c chan string, want string) {
		t.Helper()
		select {
		case got := <-c:
			if got != want {
				t.Fatalf("%s OnCancel got %q, want %q (its own wake-up must not come back)", name, got, want)
			}
		case <-time.After(waitLimit):
			t.Fatalf("%s OnCancel never got %q", name, want)
		}
	}
	// NATS keeps each publisher's order, so had an instance received its own
	// wake-up, it would come before the other's answer.
	a.bus.PublishCancel("run_from_a")
	recv("b", gotB, "run_from_a")
	b.bus.PublishCancel("run_from_b")
	recv("a", gotA, "run_from_b")
	a.bus.PublishCancel("run_from_a_again")
	recv("b", gotB, "run_from_a_again")
}

func TestNATSCloseStopsEveryGoroutine(t *testing.T) {
	url := natsURL(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	log := newMemLog()
	subj := testSubject()
	a, err := bus.DialNATS(url, bus.NATSConfig{Subject: subj, Log: log, SweepEvery: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	blocked := newMemLog()
	blocked.reading = make(chan struct{}, 1)
	b, err := bus.DialNATS(url, bus.NATSConfig{Subject: subj, Log: blocked, SweepEvery: time.Hour})
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	const thread = "thr_close"
	sa, sb := newSink(thread), newSink(thread)
	a.Add(thread, sa)
	b.Add(thread, sb)
	ia := &instance{bus: a, log: log}
	ia.commit(thread, 2, true)
	ia.commit(thread, 1, false)
	waitExact(t, "a", sa, []int64{1, 2, 3})
	waitExact(t, "b", sb, []int64{1, 2})
	ia.commit(thread, 1, true) // b: seq 4 after a gap starts a recovery that blocks in its log read
	a.PublishCancel("run_x")
	select {
	case <-blocked.reading:
	case <-time.After(waitLimit):
		t.Fatal("b never started recovering the gap before seq 4")
	}
	waitExact(t, "a", sa, []int64{1, 2, 3, 4})

	done := make(chan struct{})
	go func() {
		a.Close()
		b.Close()
		b.Close() // twice is fine
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(waitLimit):
		t.Fatal("Close did not return")
	}
	// Nothing reaches a sink after Close.
	a.Publish(log.append(thread, 1))
	waitExact(t, "a after close", sa, []int64{1, 2, 3, 4})
}

// A yield request reaches the holder it names, and only that one; its
// answer (success or the holder's error) comes back to the asker. A holder
// nobody answers for fails at once, not after the asker's bound.
func TestNATSYieldStreamReachesTheHolder(t *testing.T) {
	url := natsURL(t)
	subj := testSubject()
	log := newMemLog()
	type asked struct{ holder, thread string }
	got := make(chan asked, 4)
	onYield := func(holder string) func(context.Context, string) error {
		return func(_ context.Context, thread string) error {
			got <- asked{holder, thread}
			if thread == "thr_refused" {
				return errors.New("write failed: try again")
			}
			return nil
		}
	}
	// Lease owners name a process and need not be NATS tokens.
	dial(t, url, log, bus.NATSConfig{Subject: subj, Holder: "gw A.p*1"}).bus.SetHandlers(bus.Handlers{OnYield: onYield("a")})
	dial(t, url, log, bus.NATSConfig{Subject: subj, Holder: "gwC.p3"}).bus.SetHandlers(bus.Handlers{OnYield: onYield("c")})
	asker := dial(t, url, log, bus.NATSConfig{Subject: subj})

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := asker.bus.YieldStream(ctx, "gw A.p*1", "thr_1"); err != nil {
		t.Fatalf("yield from a live holder: %v", err)
	}
	if a := <-got; a != (asked{"a", "thr_1"}) {
		t.Fatalf("asked %+v, want holder a for thr_1", a)
	}
	err := asker.bus.YieldStream(ctx, "gw A.p*1", "thr_refused")
	if err == nil || !strings.Contains(err.Error(), "write failed") {
		t.Fatalf("yield the holder refused: %v, want its error", err)
	}
	<-got
	start := time.Now()
	err = asker.bus.YieldStream(ctx, "gwB.gone", "thr_1")
	if err == nil {
		t.Fatal("a holder nobody answers for yielded")
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("a gone holder took %v to fail: %v", waited, err)
	}
	select {
	case a := <-got:
		t.Fatalf("another process answered for the gone holder: %+v", a)
	default:
	}
}

// A forwarded cancel reaches the process executing the run and comes back
// with its ack, or with its refusal as the same *chat.Error.
func TestNATSForwardCancelCarriesAckAndRefusal(t *testing.T) {
	url := natsURL(t)
	subj := testSubject()
	log := newMemLog()
	dial(t, url, log, bus.NATSConfig{Subject: subj, Holder: "gwA.p1"}).bus.SetHandlers(bus.Handlers{
		OnCancelRun: func(_ context.Context, p chat.CancelRun) (chat.CancelAck, error) {
			if p.RunID == "run_done" {
				return chat.CancelAck{}, chat.Errorf(chat.CodeRunNotActive, "run %s already ended completed", p.RunID).With("status", "completed")
			}
			return chat.CancelAck{RunID: p.RunID, Status: chat.RunCancelRequested, AcceptedStateVersion: 7, ResumeCheckpointID: "cp_1"}, nil
		}})
	asker := dial(t, url, log, bus.NATSConfig{Subject: subj})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ack, err := asker.bus.ForwardCancel(ctx, "gwA.p1", chat.CancelRun{UserID: "usr_1", RunID: "run_1", RequestedBy: "tab:x"})
	if err != nil || ack.RunID != "run_1" || ack.Status != chat.RunCancelRequested || ack.AcceptedStateVersion != 7 || ack.ResumeCheckpointID != "cp_1" {
		t.Fatalf("forwarded cancel = %+v, %v", ack, err)
	}
	_, err = asker.bus.ForwardCancel(ctx, "gwA.p1", chat.CancelRun{UserID: "usr_1", RunID: "run_done"})
	var ce *chat.Error
	if !errors.As(err, &ce) || ce.Code != chat.CodeRunNotActive || ce.Fields["status"] != "completed" {
		t.Fatalf("refused cancel = %v, want run_not_active with its fields", err)
	}
	if _, err := asker.bus.ForwardCancel(ctx, "gwB.gone", chat.CancelRun{RunID: "run_1"}); err == nil || errors.As(err, &ce) {
		t.Fatalf("cancel for a gone holder = %v, want a failure that is not a refusal", err)
	}
}

// A holder that confirmed receipt is waited for past ReceiptTimeout, however
// long its work takes (its writer queue under load): the asker taking over
// then would do the same work twice. A process that listens on the
// holder's subject but never confirms (stopped, wedged) fails the request
// once ReceiptTimeout has passed, well before the asker's own bound.
func TestNATSAskerWaitsForAHolderThatConfirmedReceipt(t *testing.T) {
	url := natsURL(t)
	subj := testSubject()
	log := newMemLog()
	started, release := make(chan struct{}), make(chan struct{})
	dial(t, url, log, bus.NATSConfig{Subject: subj, Holder: "gwA.p1"}).bus.SetHandlers(bus.Handlers{
		OnCancelRun: func(_ context.Context, p chat.CancelRun) (chat.CancelAck, error) {
			close(started)
			<-release
			return chat.CancelAck{RunID: p.RunID, Status: chat.RunCancelRequested}, nil
		}})
	asker := dial(t, url, log, bus.NATSConfig{Subject: subj})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()

	type result struct {
		ack chat.CancelAck
		err error
	}
	done := make(chan result, 1)
	begun := time.Now()
	go func() {
		ack, err := asker.bus.ForwardCancel(ctx, "gwA.p1", chat.CancelRun{RunID: "run_1"})
		done <- result{ack, err}
	}()
	<-started
	// The holder is busy with it; let the receipt bound pass twice over.
	select {
	case r := <-done:
		t.Fatalf("the asker gave up on a holder at work: %+v after %v", r, time.Since(begun))
	case <-time.After(time.Until(begun.Add(2 * bus.ReceiptTimeout))):
	}
	close(release)
	if r := <-done; r.err != nil || r.ack.RunID != "run_1" {
		t.Fatalf("forwarded cancel = %+v, %v; want the holder's ack", r.ack, r.err)
	}

	// A listener that never confirms: a raw connection on every holder
	// subject of this test, for a holder no bus serves.
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	mute, err := nc.SubscribeSync(subj + ".holder.>")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	begun = time.Now()
	err = asker.bus.YieldStream(ctx, "gwWedged.p9", "thr_1")
	waited := time.Since(begun)
	if err == nil || !strings.Contains(err.Error(), "no receipt") {
		t.Fatalf("yield from a holder that never confirms = %v, want no receipt", err)
	}
	if waited < bus.ReceiptTimeout || waited > waitLimit/2 {
		t.Fatalf("gave up after %v, want the receipt bound %v", waited, bus.ReceiptTimeout)
	}
	if _, err := mute.NextMsg(time.Second); err != nil {
		t.Fatalf("the request did not reach the listener: %v", err)
	}
}

// A tab that saw seqs on another instance subscribes here before this
// bus has delivered them: Reach waits for them (so Recent can answer
// instead of a snapshot), and gives up only at its context's end.
func TestNATSReachWaitsForSeqsAnotherInstanceFannedOut(t *testing.T) {
	const thread = "thr_reach"
	a, b, _ := watchedPair(t, newMemLog(), bus.NATSConfig{SweepEvery: time.Hour}, thread) // the sink's baseline: 0

	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	reached := b.bus.Reach(short, thread, 3)
	cancel()
	if reached {
		t.Fatal("Reach answered true for seqs nobody published")
	}
	if b.bus.Reach(context.Background(), "thr_nobody_watches_here", 1) {
		t.Fatal("Reach answered true for a thread without a sink on this bus")
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	done := make(chan bool, 1)
	go func() { done <- b.bus.Reach(ctx, thread, 3) }()
	a.commit(thread, 3, true)
	if !<-done {
		t.Fatal("Reach gave up although seqs 1..3 were published")
	}
	evs, ok := b.bus.Recent(thread, 0)
	var seqs []int64
	for _, ev := range evs {
		seqs = append(seqs, ev.Seq)
	}
	if !ok || !slices.Equal(seqs, []int64{1, 2, 3}) {
		t.Fatalf("Recent after Reach = %v, %v; want 1..3", seqs, ok)
	}
}
