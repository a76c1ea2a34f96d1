package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// maxEvent bounds one event read from a stream (a snapshot holds a
// thread's whole history).
const maxEvent = 64 << 20

// Stream is a thread's Server-Sent Events (GET
// /api/threads/{id}/events), read with Next: each seq exactly once, in
// order. When the connection ends (a network failure, the server ending a
// slow or old stream, a restart, the idle timeout) the next call to Next
// reconnects with Last-Event-ID, spaced by the Client's backoff, and goes
// on after the last event it returned; a gap the server can no longer
// fill arrives as a thread.snapshot with Event.Gap set.
//
// A Stream starts no goroutine: Next reads in its caller's goroutine. Next
// must not be called concurrently with itself; Close, Stats, LastSeq and
// StateVersion may be called from any goroutine, also while Next blocks.
type Stream struct {
	cl     *Client
	thread string
	ctx    context.Context // the stream's life; Close cancels it
	cancel context.CancelFunc

	// Owned by Next: the current connection, its context (a child of
	// ctx, which ends it: cancelled by Close, the idle timer, the end of a
	// Next's ctx) and its reader.
	body      io.ReadCloser
	end       context.CancelFunc
	rd        *bufio.Reader
	idle      *time.Timer
	pos       int64 // last seq delivered; FromSnapshot until one is
	version   int64
	err       error // terminal: returned by every Next
	bo        backoff
	attempted bool // a connection was tried since the last event
	stats     stats

	seen struct { // for LastSeq and StateVersion from other goroutines
		sync.Mutex
		seq, version int64
	}
}

// Events opens the event stream of a thread after seq after (0: from the
// start; FromSnapshot: the current state as a thread.snapshot, then live
// events). The first connection is made before it returns, so an unknown
// thread or a refused credential is its error (an *Error); later
// connections are Next's business. ctx bounds this first connection only;
// the stream lives until Close.
func (c *Client) Events(ctx context.Context, threadID string, after int64) (*Stream, error) {
	if after < FromSnapshot {
		return nil, fmt.Errorf("client: Events after seq %d: want FromSnapshot or a seq >= 0", after)
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Stream{cl: c, thread: threadID, ctx: sctx, cancel: cancel, pos: after,
		bo: backoff{min: c.minBackoff, max: c.maxBackoff}}
	s.seen.seq = after
	s.attempted = true
	if err := s.connect(ctx); err != nil {
		cancel()
		return nil, err
	}
	return s, nil
}

// ThreadID is the thread the stream follows.
func (s *Stream) ThreadID() string { return s.thread }

// LastSeq is the seq of the last event Next returned (the position given
// to Events before the first).
func (s *Stream) LastSeq() int64 {
	s.seen.Lock()
	defer s.seen.Unlock()
	return s.seen.seq
}

// StateVersion is the state_version of the last durable event or
// snapshot Next returned (0 before one): the expected_state_version of a
// command based on what was read.
func (s *Stream) StateVersion() int64 {
	s.seen.Lock()
	defer s.seen.Unlock()
	return s.seen.version
}

// Stats says what the stream did to stay exact (reconnections, gaps,
// repairs).
func (s *Stream) Stats() Stats { return s.stats.snapshot() }

// Close ends the stream: a Next blocked in a read returns ErrClosed, and
// so does every later call. It never cancels anything on the server.
func (s *Stream) Close() error {
	s.cancel()
	return nil
}

// drop forgets the current connection (Next's goroutine only).
func (s *Stream) drop() {
	if s.idle != nil {
		s.idle.Stop()
		s.idle = nil
	}
	if s.end != nil {
		s.end()
		s.end = nil
	}
	if s.body != nil {
		s.body.Close()
		s.body = nil
	}
	s.rd = nil
}

// connect opens one connection from the current position. ctx bounds the
// wait for the answer's headers; the connection lives until drop or
// Close.
func (s *Stream) connect(ctx context.Context) error {
	c := s.cl
	q := url.Values{}
	if s.pos >= 0 {
		q.Set("after_seq", strconv.FormatInt(s.pos, 10))
	}
	cctx, end := context.WithCancel(s.ctx)
	req, err := http.NewRequestWithContext(
		cctx,
		http.MethodGet,
		c.endpoint("/api/threads/"+esc(s.thread)+"/events", q),
		nil,
	)
	if err != nil {
		end()
		return fmt.Errorf("client: event stream: %w", err)
	}
	c.authorize(req.Header)
	req.Header.Set("Accept", "text/event-stream")
	if s.pos >= 0 && s.stats.connects.Load() > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(s.pos, 10)) // as an EventSource resumes
	}
	if c.host != "" {
		req.Host = c.host
	}
	stop := context.AfterFunc(ctx, end)
	resp, err := c.streaming.Do(req)
	aborted := !stop()
	switch {
	case err == nil && aborted: // ctx ended just as the answer came
		resp.Body.Close()
		fallthrough
	case err != nil:
		end()
		if s.ctx.Err() != nil {
			return ErrClosed
		}
		if aborted && ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("client: event stream of %s: %w", s.thread, err)
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		end()
		return parseError(resp.StatusCode, resp.Header, data)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		resp.Body.Close()
		end()
		return fmt.Errorf("client: event stream of %s: answer is %q, not text/event-stream", s.thread, ct)
	}
	s.body, s.end = resp.Body, end
	s.rd = bufio.NewReaderSize(resp.Body, 64<<10)
	if d := c.idle; d > 0 {
		s.idle = time.AfterFunc(d, end)
	}
	s.stats.connects.Add(1)
	return nil
}

// Next returns the next event. It blocks until one comes, ctx ends (the
// stream stays usable: the connection read from is dropped, and the next
// call resumes after the last event returned), or the stream ends for
// good: ErrClosed after Close, ErrThreadDeleted after thread.deleted was
// returned, or an *Error the server will keep answering (not_found,
// unauthorized: a credential that ended while the stream was open).
// Errors of the network and the server's 5xx and 429 answers are retried,
// not returned.
func (s *Stream) Next(ctx context.Context) (Event, error) {
	for {
		if s.err != nil {
			return Event{}, s.err
		}
		if err := ctx.Err(); err != nil {
			return Event{}, err
		}
		if s.ctx.Err() != nil {
			s.fail(ErrClosed)
			continue
		}
		if s.rd == nil {
			if s.attempted {
				if !sleep(ctx, s.bo.next()) {
					if s.ctx.Err() != nil {
						continue
					}
					return Event{}, ctx.Err()
				}
			}
			s.attempted = true
			if err := s.connect(ctx); err != nil {
				switch {
				case errors.Is(err, ErrClosed):
					s.fail(ErrClosed)
				case ctx.Err() != nil:
					return Event{}, ctx.Err()
				case !retryable(err):
					s.fail(err)
				}
				continue
			}
		}
		ev, err := s.read(ctx)
		if err != nil {
			idled := s.idle != nil && !s.idle.Stop() // it fired: it ended the connection
			s.drop()
			var e *Error
			switch {
			case s.ctx.Err() != nil:
				s.fail(ErrClosed)
			case errors.As(err, &e):
				s.fail(err) // the server's error event: the stream is over
			case ctx.Err() != nil:
				return Event{}, ctx.Err()
			case idled:
				s.stats.dropped(fmt.Sprintf("%v (nothing received for %v)", errIdle, s.cl.idle))
			case errors.Is(err, io.ErrUnexpectedEOF):
				s.stats.dropped("the server ended the stream")
			default:
				s.stats.dropped(err.Error())
			}
			continue // reconnect
		}
		if ev, ok := s.accept(ev); ok {
			return ev, nil
		}
	}
}

func (s *Stream) fail(err error) {
	s.drop()
	s.err = err
}

// accept applies the seq rules to an event read; ok is false for one not
// to deliver.
func (s *Stream) accept(ev Event) (Event, bool) {
	switch {
	case ev.ThreadID != s.thread:
		s.stats.note(&s.stats.stray, "event %s of thread %s on the stream of %s", ev, ev.ThreadID, s.thread)
		return ev, false
	case ev.Type == chat.EventThreadSnapshot:
		if s.pos >= 0 {
			ev.Gap = &Gap{After: s.pos, Through: ev.Seq}
			s.stats.resyncs.Add(1)
		}
	case s.pos < 0:
		// No position yet: the server starts such a stream with a
		// snapshot; take the event as the position anyway.
	case ev.Seq <= s.pos:
		s.stats.note(&s.stats.duplicates, "event %s after seq %d", ev, s.pos)
		return ev, false
	case ev.Seq != s.pos+1:
		s.stats.note(&s.stats.jumps, "event %s after seq %d: resuming from %d", ev, s.pos, s.pos)
		s.drop()
		s.attempted = false // reconnect at once
		return ev, false
	}
	s.pos = ev.Seq
	if ev.Type != chat.EventMessageDelta && ev.StateVersion > 0 {
		s.version = ev.StateVersion
	}
	s.seen.Lock()
	s.seen.seq, s.seen.version = s.pos, s.version
	s.seen.Unlock()
	s.bo.reset()
	s.attempted = false
	if ev.Type == chat.EventThreadDeleted {
		s.fail(ErrThreadDeleted) // nothing follows it; the next Next says so
	}
	return ev, true
}

// read parses the next event of the current connection. ctx ending closes
// the connection (the only way to interrupt a read).
func (s *Stream) read(ctx context.Context) (Event, error) {
	stop := context.AfterFunc(ctx, s.end)
	defer stop()
	var id, typ string
	var data []byte
	lines := 0
	for {
		line, err := s.line()
		if err != nil {
			return Event{}, err
		}
		if s.idle != nil {
			s.idle.Reset(s.cl.idle)
		}
		if len(line) == 0 { // end of an event
			if lines == 0 {
				continue
			}
			return s.event(id, typ, data)
		}
		if line[0] == ':' { // a comment: keep-alive, or why the server ends the stream
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		lines++
		switch string(field) {
		case "id":
			id = string(value)
		case "event":
			typ = string(value)
		case "data":
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, value...)
			if len(data) > maxEvent {
				return Event{}, fmt.Errorf("client: event over %d bytes", maxEvent)
			}
		}
	}
}

// line reads one line without its end of line.
func (s *Stream) line() ([]byte, error) {
	var long []byte
	for {
		chunk, err := s.rd.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			long = append(long, chunk...)
			if len(long) > maxEvent {
				return nil, fmt.Errorf("client: event stream line over %d bytes", maxEvent)
			}
			continue
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF // the server ended the stream
			}
			return nil, err
		}
		if long != nil {
			chunk = append(long, chunk...)
		}
		chunk = bytes.TrimSuffix(chunk, []byte("\n"))
		return bytes.TrimSuffix(chunk, []byte("\r")), nil
	}
}

// event makes an Event of one SSE event's fields.
func (s *Stream) event(id, typ string, data []byte) (Event, error) {
	if typ == "error" {
		return Event{}, parseError(0, nil, data)
	}
	ev, err := decodeEvent(append([]byte(nil), data...))
	if err != nil {
		s.stats.note(&s.stats.malformed, "%v", err)
		return Event{}, err
	}
	if id != strconv.FormatInt(ev.Seq, 10) || (typ != "" && typ != ev.Type) {
		s.stats.note(&s.stats.malformed, "SSE id %q / event %q do not match seq %d / type %s", id, typ, ev.Seq, ev.Type)
	}
	ev.Received = time.Now()
	return ev, nil
}
