package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// The gateway never sends a duplicate, skips a seq, or is slow to take a
// subscribe, so the client's repairs are shown here against scripted
// servers that do; the tests above show the real gateway needs none.

// fakeWS serves /ws with script, one call per connection (n counts them
// from 1).
func fakeWS(t *testing.T, script func(t *testing.T, n int, ws *fakeConn)) string {
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		script(t, i, &fakeConn{t: t, ws: ws})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

type fakeConn struct {
	t  *testing.T
	ws *websocket.Conn
}

type command struct {
	Type     string `json:"type"`
	ID       string `json:"id"`
	ThreadID string `json:"thread_id"`
	AfterSeq *int64 `json:"after_seq"`
}

// read returns the next command; ok is false once the client is gone.
func (f *fakeConn) read() (command, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	_, data, err := f.ws.Read(ctx)
	if err != nil {
		return command{}, false
	}
	var c command
	if err := json.Unmarshal(data, &c); err != nil {
		f.t.Errorf("client frame %s: %v", data, err)
	}
	return c, true
}

// expect reads a command of type typ.
func (f *fakeConn) expect(typ string) command {
	c, ok := f.read()
	if !ok || c.Type != typ {
		f.t.Errorf("client sent %+v (%v), want %s", c, ok, typ)
	}
	return c
}

// send writes objects in one frame, "\n"-separated, as the gateway does.
func (f *fakeConn) send(objs ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	f.ws.Write(ctx, websocket.MessageText, []byte(strings.Join(objs, "\n")))
}

func ack(re string, fields string) string {
	if fields != "" {
		fields = "," + fields
	}
	return fmt.Sprintf(`{"type":"ack","re":%q%s}`, re, fields)
}

// event is an event of thread thr_x: a checkpoint.created (durable) at
// seq 1, a delta otherwise, thread.deleted when last.
func event(seq int64, last bool) string {
	switch {
	case last:
		return fmt.Sprintf(`{"type":"thread.deleted","thread_id":"thr_x","seq":%d,"ts":1,"state_version":%d}`, seq, seq)
	case seq == 1:
		return `{"type":"checkpoint.created","thread_id":"thr_x","seq":1,"ts":1,"state_version":1,"checkpoint_id":"cp_1","parent_checkpoint_id":null}`
	}
	return fmt.Sprintf(`{"type":"message.delta","thread_id":"thr_x","seq":%d,"ts":1,"run_id":"run_1","message_id":"msg_1","text":"w%d "}`, seq, seq)
}

// A duplicate is dropped; a seq that skips ahead makes the Subscription
// resume after the last seq it took; a resubscribe refused rate_limited is
// tried again once allowed. The reader sees 1..5 once each, then the end.
func TestSubscriptionRepairs(t *testing.T) {
	subscribes := make(chan int64, 8)
	unsubscribed := make(chan struct{})
	base := fakeWS(t, func(t *testing.T, n int, f *fakeConn) {
		if n > 1 {
			t.Errorf("connection %d: the Conn reconnected", n)
			return
		}
		s := f.expect("subscribe")
		subscribes <- *s.AfterSeq
		f.send(ack(s.ID, `"thread_id":"thr_x","recovered":true,"state_version":1,"last_seq":0`),
			event(1, false), event(2, false), event(2, false), event(4, false))
		s = f.expect("subscribe") // resume after 2
		subscribes <- *s.AfterSeq
		f.send(fmt.Sprintf(`{"type":"error","re":%q,"error":"rate_limited","message":"slow down","retry_after_seconds":1}`, s.ID),
			event(5, false)) // dropped: not subscribed yet
		s = f.expect("subscribe")
		subscribes <- *s.AfterSeq
		f.send(ack(s.ID, `"thread_id":"thr_x","recovered":true,"state_version":1,"last_seq":5`),
			event(3, false), event(4, false), event(5, true))
		u := f.expect("unsubscribe") // the slot back after thread.deleted
		f.send(ack(u.ID, ""))
		close(unsubscribed)
		f.read() // until the client closes
	})
	c := newClient(t, base)
	conn := connect(t, c, "")
	sub := subscribe(t, conn, "thr_x", 0)
	began := time.Now()
	wantSeqsThenDeleted(t, sub, 5)
	select {
	case <-unsubscribed:
	case <-bounded(t).Done():
		t.Fatal("no unsubscribe after thread.deleted")
	}
	if waited := time.Since(began); waited < 900*time.Millisecond {
		t.Errorf("resubscribed %v after a rate_limited answer asking for 1 s", waited)
	}
	close(subscribes)
	var afters []int64
	for a := range subscribes {
		afters = append(afters, a)
	}
	if fmt.Sprint(afters) != "[0 2 2]" {
		t.Errorf("subscribes after seqs %v, want [0 2 2]", afters)
	}
	st := conn.Stats()
	if st.Duplicates != 1 || st.Jumps != 1 || st.Connects != 1 || st.Stray != 0 || st.Unanswered != 0 {
		t.Errorf("stats %+v: want one duplicate, one jump, one connection", st)
	}
	if sub.LastSeq() != 5 || sub.StateVersion() != 5 {
		t.Errorf("subscription at seq %d version %d, want 5, 5", sub.LastSeq(), sub.StateVersion())
	}
}

// A connection closed 1008 (the credential ended) is not reconnected: the
// Conn ends with unauthorized. A silent connection is taken for dead after
// the idle timeout and replaced.
func TestConnEnds(t *testing.T) {
	t.Run("1008", func(t *testing.T) {
		base := fakeWS(t, func(t *testing.T, n int, f *fakeConn) {
			h := f.expect("hello")
			f.send(ack(h.ID, `"connection_id":"con_1"`))
			f.ws.Close(websocket.StatusPolicyViolation, "signed out: sign in again")
		})
		conn := connect(t, newClient(t, base), "tab-1008")
		select {
		case <-conn.Done():
		case <-bounded(t).Done():
			t.Fatal("the Conn is still running after a 1008 close")
		}
		e := wantError(t, conn.Err(), chat.CodeUnauthorized, http.StatusUnauthorized)
		if !strings.Contains(e.Message, "sign in") {
			t.Errorf("error %+v: want the close reason", e)
		}
		if st := conn.Stats(); st.Drops != 1 || st.LastDrop != "closed by the server: 1008 signed out: sign in again" {
			t.Errorf("stats %+v: want one drop, with the server's close code and reason", st)
		}
		_, err := conn.Subscribe(bounded(t), "thr_x", 0)
		wantError(t, err, chat.CodeUnauthorized, http.StatusUnauthorized)
	})
	t.Run("idle", func(t *testing.T) {
		third := make(chan struct{})
		base := fakeWS(t, func(t *testing.T, n int, f *fakeConn) {
			if n == 3 {
				close(third)
			}
			f.read() // silent until the client goes
		})
		c := newClient(t, base, client.WithIdleTimeout(100*time.Millisecond), client.WithBackoff(time.Millisecond, 10*time.Millisecond))
		conn := connect(t, c, "")
		select {
		case <-third:
		case <-bounded(t).Done():
			t.Fatalf("no third connection: %+v", conn.Stats())
		}
		// Each drop is counted before the next connection is dialled.
		if st := conn.Stats(); st.Drops < 2 || st.LastDrop != "client: the connection was taken for dead (nothing received for 100ms)" {
			t.Errorf("stats %+v: want two drops or more, for the idle timeout", st)
		}
	})
	t.Run("1013", func(t *testing.T) {
		second := make(chan struct{})
		base := fakeWS(t, func(t *testing.T, n int, f *fakeConn) {
			h := f.expect("hello")
			f.send(ack(h.ID, fmt.Sprintf(`"connection_id":"con_%d"`, n)))
			if n == 1 {
				f.ws.Close(websocket.StatusTryAgainLater, "too slow: reconnect")
				return
			}
			close(second)
			f.read() // until the client goes
		})
		conn := connect(t, newClient(t, base, client.WithBackoff(time.Millisecond, 10*time.Millisecond)), "tab-1013")
		select {
		case <-second:
		case <-bounded(t).Done():
			t.Fatalf("not reconnected after a 1013 close: %+v", conn.Stats())
		}
		if st := conn.Stats(); st.Drops != 1 || st.LastDrop != "closed by the server: 1013 too slow: reconnect" {
			t.Errorf("stats %+v: want one drop, with the server's close code and reason", st)
		}
		if err := conn.Err(); err != nil {
			t.Errorf("the Conn ended after a 1013 close: %v", err)
		}
	})
}

// An event stream whose seq skips ahead is resumed with Last-Event-ID
// after the last event returned.
func TestStreamRepairs(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.URL.Query().Get("after_seq")+"/"+r.Header.Get("Last-Event-ID"))
		n := len(asked)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		write := func(seq int64, last bool) {
			data := event(seq, last)
			var h struct{ Type string }
			json.Unmarshal([]byte(data), &h)
			fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", seq, h.Type, data)
		}
		fmt.Fprint(w, ": keep-alive\n\n")
		if n == 1 {
			write(1, false)
			write(2, false)
			write(2, false)
			write(4, false)
			w.(http.Flusher).Flush()
			<-r.Context().Done() // the client drops it
			return
		}
		write(3, false)
		write(4, false)
		write(5, true)
	}))
	t.Cleanup(srv.Close)
	stream := events(t, newClient(t, srv.URL), "thr_x", 0)
	wantSeqsThenDeleted(t, stream, 5)
	if st := stream.Stats(); st.Duplicates != 1 || st.Jumps != 1 || st.Connects != 2 || st.Drops != 0 {
		t.Errorf("stats %+v: want one duplicate, one jump, two connections (the client ended the first: not a drop)", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(asked) != "[0/ 2/2]" {
		t.Errorf("requests asked from %v (after_seq/Last-Event-ID), want [0/ 2/2]", asked)
	}
}

// An event stream the server ends mid-way, or that goes silent past the
// idle timeout, is counted as a drop, with the reason, and resumed after
// the last event: nothing lost, nothing twice.
func TestStreamDropIsCounted(t *testing.T) {
	t.Run("ended", func(t *testing.T) { streamDropped(t, false, "the server ended the stream") })
	t.Run("silent", func(t *testing.T) {
		streamDropped(t, true, "client: the connection was taken for dead (nothing received for 100ms)")
	})
}

func streamDropped(t *testing.T, silent bool, want string) {
	var mu sync.Mutex
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Header.Get("Last-Event-ID"))
		n := len(asked)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		from, to := int64(1), int64(2)
		if n > 1 {
			from, to = 3, 4
		}
		for seq := from; seq <= to; seq++ {
			data := event(seq, seq == 4)
			var h struct{ Type string }
			json.Unmarshal([]byte(data), &h)
			fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", seq, h.Type, data)
		}
		if n == 1 && silent {
			w.(http.Flusher).Flush()
			<-r.Context().Done() // silent until the client gives up on it
		}
		// else the response ends: a restart, a proxy's limit
	}))
	t.Cleanup(srv.Close)
	opts := []client.Option{client.WithBackoff(time.Millisecond, 10*time.Millisecond)}
	if silent {
		opts = append(opts, client.WithIdleTimeout(100*time.Millisecond))
	}
	stream := events(t, newClient(t, srv.URL, opts...), "thr_x", 0)
	wantSeqsThenDeleted(t, stream, 4)
	if st := stream.Stats(); st.Drops != 1 || st.LastDrop != want || st.Connects != 2 || st.Malformed != 0 {
		t.Errorf("stats %+v: want one drop (%s), two connections", st, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(asked) != "[ 2]" {
		t.Errorf("Last-Event-ID asked %q, want none then 2", asked)
	}
}

// A Subscription whose reader falls behind its buffer never blocks the
// connection: it stops taking events and, once read, resumes after the
// last one it took, so the reader still gets every seq once, in order.
func TestSlowReaderLosesNothing(t *testing.T) {
	c, th := newThread(t, "")
	conn, err := c.Connect(bounded(t), client.ConnOptions{TabID: "tab-slow", Buffer: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sub := subscribe(t, conn, th.ThreadID, 0)
	// The run ends (seen on another subscriber) before the slow one reads.
	watch := events(t, c, th.ThreadID, 0)
	run := startRun(t, conn, th, "Explain goroutines")
	newReader(t, watch, th.ThreadID, 0).runEvent(chat.EventRunCompleted, run.RunID)
	r := newReader(t, sub, th.ThreadID, 0)
	r.runEvent(chat.EventRunCompleted, run.RunID)
	for i, ev := range r.events {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
	}
	if st := conn.Stats(); st.Lagged == 0 || st.Connects != 1 || st.Duplicates+st.Jumps+st.Stray+st.Unanswered+st.Malformed != 0 {
		t.Fatalf("stats %+v: want the subscription to have lagged, on one connection, and nothing else", st)
	}
}
