package gateway

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// subscriberBuffer bounds how many events a stream may fall behind the
// live feed before it resyncs from the store.
const subscriberBuffer = 1024

// events streams a thread's events as Server-Sent Events: first what the
// client missed (from Last-Event-ID or after_seq; a snapshot when the gap
// cannot be filled or no position was given), then live events, each seq
// exactly once and in order.
//
// A stream holds one of its user's connection slots (MaxConnsPerUser, shared
// with WebSocket connections) while it is open; past the bound it is
// refused with 429 rate_limited before anything else is looked at.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	user := userID(r)
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
	// Subscribe before reading the store: every event committed after the
	// read arrives live; the seq check drops what the read already had.
	sub := s.subscribe(threadID, subscriberBuffer)
	defer func() { sub.Close() }()
	first, err := s.catchUp(r.Context(), user, threadID, after)
	last := first.lastSeq
	if err != nil {
		writeError(w, s.log, err)
		return
	}

	flusher, ok := w.(http.Flusher)
	if !ok {
		writeError(w, s.log, errors.New("response writer cannot stream"))
		return
	}
	h := w.Header()
	securityHeaders(h)
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	s.metrics.ConnOpened(transportSSE)
	defer s.metrics.ConnClosed(transportSSE)
	w.WriteHeader(http.StatusOK)
	out := bufio.NewWriter(w)
	send := func(evs []*chat.Event) bool {
		for _, ev := range evs {
			writeSSE(out, ev)
		}
		return out.Flush() == nil
	}
	if !send(first.events) {
		return
	}
	flusher.Flush()

	keepAlive := time.NewTicker(s.keepAlive)
	defer keepAlive.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-keepAlive.C:
			out.WriteString(": keep-alive\n\n")
			if out.Flush() != nil {
				return
			}
			flusher.Flush()
		case ev, ok := <-sub.Events():
			var batch []*chat.Event
			switch {
			case !ok:
				// Dropped for falling behind: resubscribe, then fill the gap
				// from the store.
				sub = s.subscribe(threadID, subscriberBuffer)
				got, err := s.catchUp(r.Context(), user, threadID, last)
				if err != nil {
					s.log.Warn("event stream resync failed", "thread_id", threadID, "err", err)
					return
				}
				batch, last = got.events, got.lastSeq
			case ev.Seq <= last:
				continue
			case ev.Seq == last+1:
				batch, last = []*chat.Event{ev}, ev.Seq
			default:
				got, err := s.catchUp(r.Context(), user, threadID, last)
				if err != nil {
					s.log.Warn("event stream gap fill failed", "thread_id", threadID, "err", err)
					return
				}
				batch, last = got.events, got.lastSeq
			}
			if !send(batch) {
				return
			}
			flusher.Flush()
		}
	}
}

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
	if after >= 0 {
		replay, err := s.store.Events(ctx, user, threadID, after)
		if err != nil {
			return caughtUp{}, err
		}
		if replay.Complete {
			return caughtUp{events: replay.Events, lastSeq: replay.LastSeq, stateVersion: replay.StateVersion, recovered: true}, nil
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
	return caughtUp{
		events:  []*chat.Event{{Type: chat.EventThreadSnapshot, ThreadID: threadID, Seq: snap.LastSeq, Raw: raw}},
		lastSeq: snap.LastSeq, stateVersion: snap.StateVersion,
	}, nil
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
