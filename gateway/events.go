package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// events streams a thread's events as Server-Sent Events: first what the
// client missed (from Last-Event-ID or after_seq; a snapshot when the gap
// cannot be filled or no position was given), then live events, each seq
// exactly once and in order.
//
// A stream holds one of its user's connection slots (MaxConnsPerUser, shared
// with WebSocket connections) while it is open; past the bound it is
// refused with 429 rate_limited before anything else is looked at.
//
// The handler goroutine is the stream's only writer. Live events reach it
// through an sseFeed, which the thread's feed fills without ever blocking.
// A stream is held to the WebSocket's bounds (WSConfig): every write runs
// under a write deadline of StuckWrite, and a write stuck past it (the
// client stopped reading, or a proxy stalled) ends the stream; so does
// falling more than QueueBytes behind the live feed, or missing an event.
// The handler then returns, giving back its subscription and its
// connection slot, and the client's EventSource reconnects with
// Last-Event-ID and resumes from the store without gap or duplicate.
//
// Like a WebSocket connection, a stream re-checks its credential at every
// keep-alive (KeepAlive) and ends within one interval of a sign-out,
// token revocation, password change or account deletion: an `error` event
// carrying the unauthorized error, then the end of the response (the
// EventSource's reconnect is answered 401, which stops it). A stream also
// ends at WSConfig.MaxConnAge, with a comment saying so; the reconnect
// resumes with Last-Event-ID, authenticated afresh.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	principal, _ := chat.PrincipalFromContext(r.Context())
	user := principal.UserID
	if err := s.limits.join(user); err != nil {
		s.metrics.ConnRefused(transportSSE)
		writeError(w, s.log, err)
		return
	}
	defer s.limits.leave(user)
	threadID, err := pathID(r, "id", "thread_id")
	if err != nil {
		writeError(w, s.log, err)
		return
	}
	after := int64(-1)
	// Last-Event-ID wins over after_seq (a reconnecting EventSource sends
	// it with the original URL), so after_seq is only read without it.
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, s.log, chat.Invalid("Last-Event-ID must be a seq this server sent"))
			return
		}
		after = n
	} else if v := r.URL.Query().Get("after_seq"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, s.log, chat.Invalid("after_seq must be a whole number, 0 or more"))
			return
		}
		after = n
	}
	// A response whose writes cannot be bounded is not streamed: a client
	// that stopped reading would hold it for ever.
	rc := http.NewResponseController(w)
	if err := rc.SetWriteDeadline(time.Time{}); err != nil {
		writeError(w, s.log, fmt.Errorf("event stream: the response cannot take a write deadline: %w", err))
		return
	}
	// Subscribe before reading the store: every event committed after the
	// read arrives live; the seq check drops what the read already had.
	feed := newSSEFeed(s.ws.cfg.QueueBytes, s.metrics)
	s.feed.Add(threadID, feed)
	defer s.feed.Remove(threadID, feed)
	first, err := s.catchUp(r.Context(), user, threadID, after)
	if err != nil {
		writeError(w, s.log, err)
		return
	}

	sseHeaders(w.Header())
	streamID := chat.NewID("sse_") // names the stream in the log
	s.metrics.ConnOpened(transportSSE)
	defer s.metrics.ConnClosed(transportSSE)
	w.WriteHeader(http.StatusOK)
	out := &sseWriter{rc: rc, buf: bufio.NewWriter(w), stuck: s.ws.cfg.StuckWrite}
	defer out.finish()

	s.follow(r.Context(), principal, streamID, feed, out, first, threadStream{log: s.log})
}

// streamSink is what one kind of event stream writes (a thread's events,
// a response's): its events and its last words. follow does the rest.
type streamSink interface {
	// write writes evs, the thread's next events in seq order (none: the
	// catch-up found nothing, and the headers still go out), and reports
	// whether the stream is complete: nothing may follow.
	write(out *sseWriter, evs []*chat.Event) (done bool, err error)
	// resume says how the client picks up after a stream the server
	// ended ("reconnect with Last-Event-ID"), for the comment that ends it.
	resume() string
	// writeError writes err, the caller's credential ending, as the
	// stream's last event.
	writeError(b *bufio.Writer, err error)
}

// follow streams a thread to out through sink: first what the catch-up
// read found (first), then every live event the feed delivers, each seq
// exactly once and in order, until the sink says the stream is complete,
// the client goes away, a write is stuck, the stream falls behind or
// misses an event, the caller's credential ends (checked at every
// keep-alive) or it reaches WSConfig.MaxConnAge. The calling handler's
// goroutine is the stream's only writer.
func (s *Server) follow(ctx context.Context, principal chat.Principal, streamID string, feed *sseFeed, out *sseWriter, first caughtUp, sink streamSink) {
	last := first.lastSeq
	done, err := sink.write(out, first.events)
	if done && err == nil {
		return
	}
	keepAlive := time.NewTicker(s.keepAlive)
	defer keepAlive.Stop()
	var old <-chan time.Time // MaxConnAge passed
	if age := s.ws.cfg.MaxConnAge; age > 0 {
		t := time.NewTimer(age)
		defer t.Stop()
		old = t.C
	}
	for err == nil {
		select {
		case <-ctx.Done():
			return
		case <-old:
			out.write(func(b *bufio.Writer) { b.WriteString(": connection age limit: " + sink.resume() + "\n\n") })
			return
		case <-keepAlive.C:
			if ended := s.credentialEnded(ctx, principal, streamID); ended != nil {
				out.write(func(b *bufio.Writer) { sink.writeError(b, ended) })
				return
			}
			err = out.write(func(b *bufio.Writer) { b.WriteString(": keep-alive\n\n") })
		case <-feed.wake:
			evs, why := feed.take()
			if why != "" {
				// Too slow, or an event went missing: say so in a comment
				// (EventSource ignores it) and end; the reconnect resumes
				// from the store.
				out.write(func(b *bufio.Writer) { b.WriteString(sseEndComment(why, sink.resume())) })
				return
			}
			batch := evs[:0]
			for _, ev := range evs {
				if ev.Seq > last+1 {
					// An event never reached the feed: only the store can
					// fill the gap, and the reconnect asks it. The stream
					// ends at the next wake-up, after what came before.
					feed.end(slowMissed)
					break
				}
				if ev.Seq == last+1 { // lower: the catch-up read had it
					batch, last = append(batch, ev), ev.Seq
				}
			}
			if len(batch) > 0 {
				if done, err = sink.write(out, batch); done && err == nil {
					return
				}
			}
		}
	}
	if errors.Is(err, errStuckWrite) {
		feed.end(slowStuck)
	}
}

// threadStream is a thread's event stream (GET /api/threads/{id}/events):
// the protocol's events as they are, complete after thread.deleted.
type threadStream struct{ log *slog.Logger }

func (threadStream) write(out *sseWriter, evs []*chat.Event) (bool, error) {
	if err := out.events(evs); err != nil {
		return false, err
	}
	// thread.deleted is the thread's last event: nothing follows it.
	return len(evs) > 0 && evs[len(evs)-1].Type == chat.EventThreadDeleted, nil
}

func (threadStream) resume() string { return "reconnect with Last-Event-ID" }

func (t threadStream) writeError(b *bufio.Writer, err error) { writeSSEError(b, err, t.log) }

// sseEndComment is the last line of a stream the server ended as a slow
// consumer for why, with what the client does to resume: what its
// EventSource does anyway, in words for people reading the stream by hand
// (the WebSocket's close reasons).
func sseEndComment(why, resume string) string {
	if why == slowMissed {
		return ": missed events: " + resume + "\n\n"
	}
	return ": too slow: " + resume + "\n\n"
}

// errStuckWrite is a write to an event stream that was still blocked when
// its deadline (WSConfig.StuckWrite) passed.
var errStuckWrite = errors.New("event stream write stuck: the client stopped reading")

// sseFeed is one event stream's live events: a chat.EventSink on its thread
// whose Deliver, called by the feed while the store publishes a commit,
// never blocks. It appends the event (its shared encoding, not a copy) to a
// queue bounded in bytes and wakes the stream's writer, the handler
// goroutine, which takes the whole queue at each wake-up. Past the bound,
// or when the bus reports the thread's events lost, the stream is ended as
// a slow consumer: the queue is dropped, nothing more is taken (the feed
// then unsubscribes it), and the writer ends the response at its next
// wake-up, at the latest when its write in progress returns (StuckWrite).
// Safe for concurrent use.
type sseFeed struct {
	limit   int           // QueueBytes
	metrics Metrics       // counts the end as a slow close, once
	wake    chan struct{} // cap 1: events are queued, or the stream ended

	mu     sync.Mutex
	queue  []*chat.Event
	queued int    // bytes of the queued events
	ended  string // why the stream was ended as slow (slowQueue, …); "" while it is not
}

func newSSEFeed(limit int, m Metrics) *sseFeed {
	return &sseFeed{limit: limit, metrics: m, wake: make(chan struct{}, 1)}
}

// Deliver implements chat.EventSink. It never blocks.
func (f *sseFeed) Deliver(ev *chat.Event) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended != "" {
		return false
	}
	f.queue = append(f.queue, ev)
	f.queued += len(ev.Raw)
	if f.queued > f.limit {
		f.endLocked(slowQueue)
		return false
	}
	f.signal()
	return true
}

// Lost implements bus.LossAware: events of the thread are gone for good,
// so the stream ends like one that missed an event, and the reconnect
// starts over from the store (with a snapshot). Never blocks.
func (f *sseFeed) Lost(string, int64) bool {
	f.end(slowMissed)
	return false
}

// take returns the queued events and empties the queue, or, once the
// stream was ended, why.
func (f *sseFeed) take() ([]*chat.Event, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended != "" {
		return nil, f.ended
	}
	evs := f.queue
	f.queue, f.queued = nil, 0
	return evs, ""
}

// end ends the stream as a slow consumer for why, counted once (the first
// reason wins).
func (f *sseFeed) end(why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.endLocked(why)
}

func (f *sseFeed) endLocked(why string) {
	if f.ended != "" {
		return
	}
	f.ended = why
	f.queue, f.queued = nil, 0
	f.metrics.SlowClosed(transportSSE, why)
	f.signal()
}

func (f *sseFeed) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// sseWriter writes one event stream, each batch under one write deadline.
// Owned by the handler goroutine; not safe for concurrent use.
type sseWriter struct {
	rc     *http.ResponseController
	buf    *bufio.Writer
	stuck  time.Duration // WSConfig.StuckWrite
	broken bool          // a write failed: the connection is done
}

// events writes evs in pieces of about maxFrame bytes (one piece for the
// few events of a live wake-up), each under its own deadline, so that a
// long replay to a client that reads is not mistaken for a stuck one: a
// piece, like a WebSocket frame, must get through within StuckWrite. With
// no events it still flushes once (the headers of a stream that has
// nothing to replay).
func (w *sseWriter) events(evs []*chat.Event) error {
	return w.pieces(len(evs), func(i int) int { return len(evs[i].Raw) }, func(b *bufio.Writer, i int) { writeSSE(b, evs[i]) })
}

// frames writes whole SSE frames ("event: …\ndata: …\n\n") as events
// writes events.
func (w *sseWriter) frames(fs [][]byte) error {
	return w.pieces(len(fs), func(i int) int { return len(fs[i]) }, func(b *bufio.Writer, i int) { b.Write(fs[i]) })
}

// pieces writes n items of the given sizes with put, in pieces of about
// maxFrame bytes, each piece under its own deadline (events).
func (w *sseWriter) pieces(n int, size func(i int) int, put func(b *bufio.Writer, i int)) error {
	next := 0
	for once := true; once || next < n; once = false {
		end, total := next, 0
		for end < n && (end == next || total+size(end) < maxFrame) {
			total += size(end)
			end++
		}
		from := next
		next = end
		if err := w.write(func(b *bufio.Writer) {
			for i := from; i < end; i++ {
				put(b, i)
			}
		}); err != nil {
			return err
		}
	}
	return nil
}

// write runs fill, which writes into the buffer, and flushes everything to
// the client, all under one write deadline; a write still blocked when it
// passes fails with errStuckWrite. The deadline is cleared afterwards: an
// idle stream holds none (on HTTP/2 one that passed would reset the stream
// even with nothing being written).
func (w *sseWriter) write(fill func(*bufio.Writer)) error {
	deadline := time.Now().Add(w.stuck)
	err := w.rc.SetWriteDeadline(deadline)
	if err == nil {
		fill(w.buf)
		err = w.buf.Flush()
	}
	if err == nil {
		err = w.rc.Flush()
	}
	if err == nil {
		err = w.rc.SetWriteDeadline(time.Time{})
	}
	if err == nil {
		return nil
	}
	w.broken = true
	if errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(deadline) {
		return errStuckWrite
	}
	return err
}

// finish bounds what the server still writes after the handler returns
// (the end of the chunked body) by the same deadline; net/http clears it
// once the response is done. A broken stream is left as it is: its
// connection fails every write anyway.
func (w *sseWriter) finish() {
	if !w.broken {
		w.rc.SetWriteDeadline(time.Now().Add(w.stuck))
	}
}

// reachWait bounds how long a subscriber's catch-up waits for this
// instance to deliver the seqs it saw on another one: NATS delivers in
// milliseconds and the instance streaming the thread writes its deltas
// within the store's flush delay (50 ms), so a second means they were
// lost (the holder stopped) and a snapshot is the honest answer.
const reachWait = time.Second

// caughtUp is what a subscriber missed: the events after its seq, or a
// snapshot when that gap cannot be filled.
type caughtUp struct {
	events       []*chat.Event
	lastSeq      int64 // the last seq the events reach
	stateVersion int64
	recovered    bool // the events are the exact gap, not a snapshot
}

// catchUp reads what a subscriber missed after the given seq (after < 0:
// it has nothing yet, so a snapshot). Shared by SSE and WebSocket.
func (s *Server) catchUp(ctx context.Context, user, threadID string, after int64) (caughtUp, error) {
	recent, _ := s.feed.(RecentFeed)
	if after >= 0 {
		replay, err := s.store.Events(ctx, user, threadID, after)
		if err != nil {
			return caughtUp{}, err
		}
		switch {
		case replay.Complete:
			got := caughtUp{events: replay.Events, lastSeq: replay.LastSeq, stateVersion: replay.StateVersion, recovered: true}
			got.addRecent(recent, threadID)
			return got, nil
		case recent != nil && after > replay.LastSeq:
			// A tab that saw such deltas on another instance: they are
			// real if this instance delivers them too, which may take
			// a moment (NATS is a hop; the log may not hold them yet).
			wctx, cancel := context.WithTimeout(ctx, reachWait)
			recent.Reach(wctx, threadID, after)
			cancel()
			if more, ok := recent.Recent(threadID, after); ok {
				last := after
				if len(more) > 0 {
					last = more[len(more)-1].Seq
				}
				return caughtUp{events: more, lastSeq: last, stateVersion: max(replay.StateVersion, lastVersion(more)), recovered: true}, nil
			}
		}
	}
	snap, err := s.store.Snapshot(ctx, user, threadID)
	if err != nil {
		return caughtUp{}, err
	}
	raw, err := chat.SnapshotEvent(snap)
	if err != nil {
		return caughtUp{}, err
	}
	got := caughtUp{
		events:  []*chat.Event{{Type: chat.EventThreadSnapshot, ThreadID: threadID, Seq: snap.LastSeq, Raw: raw}},
		lastSeq: snap.LastSeq, stateVersion: snap.StateVersion,
	}
	got.addRecent(recent, threadID)
	return got, nil
}

// addRecent appends what this instance delivered beyond the end of what
// was read from the database: the instance streaming the thread writes its
// deltas a few ms after it fans them out, so the bus may have delivered
// some past the log's end or the snapshot's seq before the subscriber was
// added. Without them the next live event would skip seqs and close the
// new connection as having missed events. (No RecentFeed, one instance:
// the store's reads include this process's unwritten deltas.)
func (got *caughtUp) addRecent(recent RecentFeed, threadID string) {
	if recent == nil {
		return
	}
	if more, ok := recent.Recent(threadID, got.lastSeq); ok && len(more) > 0 {
		got.events = append(got.events, more...)
		got.lastSeq = more[len(more)-1].Seq
		got.stateVersion = max(got.stateVersion, lastVersion(more))
	}
}

// lastVersion is the state_version of the last durable event among evs
// (0 if none).
func lastVersion(evs []*chat.Event) int64 {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Durable() {
			return evs[i].StateVersion
		}
	}
	return 0
}

// writeSSEError writes err as an `error` event whose data is the
// protocol's error object, as a WebSocket error frame carries it.
func writeSSEError(w *bufio.Writer, err error, log *slog.Logger) {
	w.WriteString("event: error\ndata: ")
	w.Write(errorFrame("", err, log))
	w.WriteString("\n\n")
}

func writeSSE(w *bufio.Writer, ev *chat.Event) {
	w.WriteString("id: ")
	w.WriteString(strconv.FormatInt(ev.Seq, 10))
	w.WriteString("\nevent: ")
	w.WriteString(ev.Type)
	w.WriteString("\ndata: ")
	w.Write(ev.Raw)
	w.WriteString("\n\n")
}

// sseHeaders sets the headers of an event stream's answer (the thread's,
// a response's): never cached, never buffered by a proxy.
func sseHeaders(h http.Header) {
	securityHeaders(h)
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
}
