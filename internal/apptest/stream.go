package apptest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// Stream is a thread's event stream (client.Stream), read with Next,
// WaitFor and WaitDeltas, which also require that the stream needed no
// repair (one connection; no duplicate, no gap, no event of another
// thread, no SSE id or event line that disagrees with its data: the
// client's Stats) and keep the text of each streamed message (Text).
//
// A Stream belongs to the test that opened it: it is read from that
// test's goroutine only (its reads may stop the test), and closed when
// the test ends.
type Stream struct {
	t         testing.TB
	threadID  string
	es        *client.Stream
	anomalies int64 // of es.Stats reported so far

	lastSeq int64
	deltas  map[string]*strings.Builder // message id -> concatenated delta text
	seen    []client.Event
	// afterCrash: the stream resumes from a position seen before the
	// server was killed, so its first event may be a thread.snapshot
	// standing for a gap (Event.Gap: the deltas in memory at the kill
	// are lost, and recorded lost).
	afterCrash bool
}

// Events opens the event stream of threadID after seq after (bounded:
// 15s) with the Server's protocol client.
func (s *Server) Events(threadID string, after int64) *Stream {
	s.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	es, err := s.API().Events(ctx, threadID, after)
	if err != nil {
		s.T.Fatalf("open the event stream of %s: %v", threadID, err)
	}
	st := &Stream{t: s.T, threadID: threadID, es: es, lastSeq: after, deltas: map[string]*strings.Builder{}}
	s.T.Cleanup(st.Close)
	return st
}

// EventsAfterCrash is Events for a position a tab saw before the
// gateway was killed: the stream may start with a thread.snapshot
// standing for a gap, whose seq must be past after (seqs never repeat
// across a crash); the text of the run it shows active restarts from
// the snapshot's partial text.
func (s *Server) EventsAfterCrash(threadID string, after int64) *Stream {
	s.T.Helper()
	st := s.Events(threadID, after)
	st.afterCrash = true
	return st
}

// Close ends the stream; it may be called more than once.
func (st *Stream) Close() { st.es.Close() }

// LastSeq is the seq of the last event read.
func (st *Stream) LastSeq() int64 { return st.lastSeq }

// Next returns the next event, failing the test at the deadline or when
// the stream ends (or was cut and resumed). A thread.snapshot standing
// for a gap fails it too, every event after the stream's position should
// still be held, except as the first event of EventsAfterCrash.
func (st *Stream) Next(deadline time.Time, what string) client.Event {
	st.t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	ev, err := st.es.Next(ctx)
	cancel()
	stats := st.es.Stats()
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		st.t.Fatalf("timed out waiting for %s on thread %s; last seq %d; last events:\n%s", what, st.threadID, st.lastSeq, st.tail(8))
	case err != nil:
		st.t.Fatalf("event stream of %s ended (%v) while waiting for %s; last seq %d", st.threadID, err, what, st.lastSeq)
	case stats.Connects != 1:
		st.t.Fatalf("event stream of %s ended and was resumed (%d connections) while waiting for %s; last seq %d", st.threadID, stats.Connects, what, st.lastSeq)
	}
	if n := stats.Malformed + stats.Duplicates + stats.Jumps + stats.Stray; n > st.anomalies {
		st.anomalies = n
		st.t.Errorf("event stream of %s: %d SSE events whose id or event line disagrees with the data (or unreadable), %d duplicates, %d gaps, %d events of another thread; the last: %s",
			st.threadID, stats.Malformed, stats.Duplicates, stats.Jumps, stats.Stray, stats.LastAnomaly)
	}
	if ev.Gap != nil {
		if !st.afterCrash || len(st.seen) > 0 {
			st.t.Fatalf("event stream of %s answered after_seq=%d with a thread.snapshot, but every event after it should still be held: %s",
				st.threadID, ev.Gap.After, ev.Raw)
		}
		// Seqs never repeat across a crash: the snapshot ends past
		// everything the tab saw before it.
		if ev.Gap.Through <= ev.Gap.After {
			st.t.Fatalf("after the crash, event stream of %s resynced with a snapshot at seq %d, not past seq %d seen before it: %s", st.threadID, ev.Gap.Through, ev.Gap.After, ev.Raw)
		}
		st.deltas = map[string]*strings.Builder{}
		if a := ev.Snapshot().ActiveRun; a != nil && a.MessageID != nil {
			b := &strings.Builder{}
			b.WriteString(a.PartialText)
			st.deltas[*a.MessageID] = b
		}
	}
	st.lastSeq = ev.Seq
	if d := ev.Delta(); d != nil {
		b := st.deltas[d.MessageID]
		if b == nil {
			b = &strings.Builder{}
			st.deltas[d.MessageID] = b
		}
		b.WriteString(d.Text)
	}
	st.seen = append(st.seen, ev)
	return ev
}

// WaitFor consumes events until one matches, and returns it.
func (st *Stream) WaitFor(deadline time.Time, what string, match func(client.Event) bool) client.Event {
	st.t.Helper()
	for {
		if ev := st.Next(deadline, what); match(ev) {
			return ev
		}
	}
}

// Text is the concatenated delta text of message messageID read so far.
func (st *Stream) Text(messageID string) string {
	if b := st.deltas[messageID]; b != nil {
		return b.String()
	}
	return ""
}

// Texts is the streamed text of every message read so far, by message id.
func (st *Stream) Texts() map[string]string {
	out := make(map[string]string, len(st.deltas))
	for id, b := range st.deltas {
		out[id] = b.String()
	}
	return out
}

func (st *Stream) tail(n int) string {
	from := max(0, len(st.seen)-n)
	var b strings.Builder
	for _, ev := range st.seen[from:] {
		raw := string(ev.Raw)
		if len(raw) > 300 {
			raw = raw[:300] + "…"
		}
		b.WriteString("  " + raw + "\n")
	}
	return b.String()
}

// WaitDeltas waits until n message.delta events of runID arrived and
// returns the message id they stream; the run ending first fails the
// test (raise the demo pace).
func (st *Stream) WaitDeltas(deadline time.Time, runID string, n int) string {
	st.t.Helper()
	messageID := ""
	for got := 0; got < n; {
		ev := st.Next(deadline, fmt.Sprintf("%d deltas of run %s", n, runID))
		if ev.RunID != runID {
			continue
		}
		switch ev.Type {
		case chat.EventMessageDelta:
			if d := ev.Delta(); messageID != "" && d.MessageID != messageID {
				st.t.Fatalf("deltas of run %s switched message from %s to %s", runID, messageID, d.MessageID)
			}
			messageID = ev.Delta().MessageID
			got++
		case chat.EventRunCompleted, chat.EventRunFailed, chat.EventRunCancelled, chat.EventMessagePublished:
			st.t.Fatalf("run %s reached %s after only %d deltas (wanted %d first): raise the demo pace", runID, ev.Type, got, n)
		}
	}
	if !strings.HasPrefix(messageID, "msg_") {
		st.t.Fatalf("delta message_id %q does not start with msg_", messageID)
	}
	return messageID
}

// Seen is every event read so far, in order.
func (st *Stream) Seen() []client.Event { return st.seen }
