// Streams: text and tool calls decoded from the SSE stream, streams that
// break off or carry an error, the idle watchdog, and cancels.

package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/honestcancel/gateway/model"
)

// ---------------------------------------------------------------------------
// Streams.

func TestTextStream(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, chunk(map[string]any{"role": "assistant", "content": ""}, nil))
		send(w, text("Hel"))
		send(w, text("lo, "))
		send(w, text("world."))
		send(w, finish("stop"))
		send(w, usage(12, 3))
		sendDone(w)
	})
	b := up.backend(func(c *Config) { c.Headers = map[string]string{"X-Router-Team": "blue"} })
	s := open(t, b, hello)
	chunks, err := drain(t, s)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	want := []model.Chunk{{Text: "Hel"}, {Text: "lo, "}, {Text: "world."}}
	if !reflect.DeepEqual(chunks, want) {
		t.Errorf("chunks %+v, want %+v", chunks, want)
	}
	if p, c := s.Usage(); p != 12 || c != 3 {
		t.Errorf("Usage() = %d, %d; want 12, 3", p, c)
	}
	if _, err := s.Next(context.Background()); !errors.Is(err, model.EOF) {
		t.Errorf("Next after EOF: %v, want EOF again", err)
	}
	req := up.request(0)
	if req.path != "/v1/chat/completions" {
		t.Errorf("path %q, want /v1/chat/completions", req.path)
	}
	if got := req.header.Get("Authorization"); got != "Bearer "+testKey {
		t.Errorf("Authorization %q, want the configured key", got)
	}
	if got := req.header.Get("X-Router-Team"); got != "blue" {
		t.Errorf("X-Router-Team %q, want blue", got)
	}
	up.wantRequests(t, 1, "")
}

func TestToolCallAssembledFromPieces(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, text("Let me look."))
		send(w, toolDelta(0, "call_abc", "catalog_search", ""))
		send(w, toolDelta(0, "", "", `{"qu`))
		send(w, toolDelta(0, "", "", `ery": "desk `))
		// A second call in the same reply is ignored: one call per step.
		send(w, toolDelta(1, "call_def", "send_email", `{"to":`))
		send(w, toolDelta(0, "", "", `lamp"}`))
		send(w, toolDelta(1, "", "", `"a@example.com"}`))
		send(w, finish("tool_calls"))
		send(w, usage(40, 9))
		sendDone(w)
	})
	s := open(t, up.backend(nil), hello)
	chunks, err := drain(t, s)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(chunks) != 2 || chunks[0].Text != "Let me look." || chunks[0].Call != nil {
		t.Fatalf("chunks %+v, want the text then one call", chunks)
	}
	call := chunks[1].Call
	if call == nil || chunks[1].Text != "" {
		t.Fatalf("last chunk %+v, want a call only", chunks[1])
	}
	if call.ID != "call_abc" || call.Name != "catalog_search" {
		t.Errorf("call %s %s, want call_abc catalog_search", call.ID, call.Name)
	}
	var args map[string]any
	if err := json.Unmarshal(call.Arguments, &args); err != nil || !reflect.DeepEqual(args, map[string]any{"query": "desk lamp"}) {
		t.Errorf("arguments %s (%v), want {\"query\":\"desk lamp\"}", call.Arguments, err)
	}
	if p, c := s.Usage(); p != 40 || c != 9 {
		t.Errorf("Usage() = %d, %d; want 40, 9", p, c)
	}
}

func TestToolCallCompatibleServers(t *testing.T) {
	t.Parallel()
	// Servers that send each call whole at index 0 and finish with "stop":
	// the first call is still handed over, once.
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, toolDelta(0, "call_1", "catalog_search", `{"query":"chair"}`))
		send(w, toolDelta(0, "call_2", "catalog_search", `{"query":"table"}`))
		send(w, finish("stop"))
		sendDone(w)
	})
	chunks, err := drain(t, open(t, up.backend(nil), hello))
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(chunks) != 1 || chunks[0].Call == nil || chunks[0].Call.ID != "call_1" || string(chunks[0].Call.Arguments) != `{"query":"chair"}` {
		t.Fatalf("chunks %+v, want one call call_1 with {\"query\":\"chair\"}", chunks)
	}
}

func TestBadToolCall(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, toolDelta(0, "call_1", "catalog_search", `{"query":`))
		send(w, finish("tool_calls"))
		sendDone(w)
	})
	_, err := drain(t, open(t, up.backend(nil), hello))
	e := wantKind(t, err, KindBadReply)
	if !strings.Contains(e.Error(), "not valid JSON") {
		t.Errorf("error %q, want it to say the arguments are not valid JSON", e)
	}
}

func TestStreamBreaksOff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		end  func(w http.ResponseWriter)
	}{
		{"connection aborted", func(w http.ResponseWriter) { panic(http.ErrAbortHandler) }},
		{"body ends without a finish", func(w http.ResponseWriter) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
				startSSE(w)
				send(w, text("Half a"))
				tc.end(w)
			})
			chunks, err := drain(t, open(t, up.backend(nil), hello))
			if texts(chunks) != "Half a" {
				t.Errorf("text %q before the break, want %q", texts(chunks), "Half a")
			}
			e := wantKind(t, err, KindBrokenStream)
			if !strings.Contains(e.Error(), "the model's stream broke off") {
				t.Errorf("error %q, want it to say the stream broke off", e)
			}
			up.wantRequests(t, 1, "no retry after the first token")
		})
	}
}

func TestErrorEventMidStream(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		startSSE(w)
		send(w, text("Start"))
		send(w, map[string]any{"error": map[string]any{"message": "the server is overloaded", "type": "server_error"}})
	})
	_, err := drain(t, open(t, up.backend(nil), hello))
	e := wantKind(t, err, KindUpstream)
	if !strings.Contains(e.Error(), "mid-stream") || !strings.Contains(e.Error(), "the server is overloaded") {
		t.Errorf("error %q, want the upstream's message", e)
	}
	up.wantRequests(t, 1, "")
}

func TestIdleWatchdog(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		before func(w http.ResponseWriter) // what the server sends before it stalls
		text   string
	}{
		{"before the response", func(w http.ResponseWriter) {}, ""},
		{"after the first chunk", func(w http.ResponseWriter) { startSSE(w); send(w, text("Thinking")) }, "Thinking"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stopped := make(chan struct{})
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
				tc.before(w)
				stall(r, release, stopped)
			})
			s := open(t, up.backend(func(c *Config) { c.IdleTimeout = 150 * time.Millisecond }), hello)
			chunks, err := drain(t, s)
			if texts(chunks) != tc.text {
				t.Errorf("text %q, want %q", texts(chunks), tc.text)
			}
			e := wantKind(t, err, KindIdle)
			if want := "the model sent nothing for 150ms; the request was stopped"; e.Error() != want {
				t.Errorf("error %q, want %q", e, want)
			}
			wait(t, stopped, "the server seeing the stalled request end")
			up.wantRequests(t, 1, "a stall is not retried")
		})
	}
}

func TestIdleTimeoutIsNotAStreamTimeout(t *testing.T) {
	t.Parallel()
	// A stream that lasts longer than IdleTimeout in total, but never pauses
	// that long, completes: the server sends a chunk every half idle period.
	idle := 300 * time.Millisecond
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
		startSSE(w)
		for i := range 4 {
			select {
			case <-time.After(idle / 2):
			case <-release:
				return
			}
			send(w, text(fmt.Sprintf("%d ", i)))
		}
		send(w, finish("stop"))
		sendDone(w)
	})
	start := time.Now()
	chunks, err := drain(t, open(t, up.backend(func(c *Config) { c.IdleTimeout = idle }), hello))
	if err != nil || texts(chunks) != "0 1 2 3 " {
		t.Fatalf("stream: %q, %v", texts(chunks), err)
	}
	if elapsed := time.Since(start); elapsed < idle {
		t.Errorf("the stream took %v, want longer than the idle timeout %v for this test to mean anything", elapsed, idle)
	}
}

func TestCancelClosesUpstream(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"stream context", "next context", "close"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			upstreamDone := make(chan struct{})
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
				startSSE(w)
				send(w, text("Once upon"))
				stall(r, release, upstreamDone)
			})
			b := up.backend(nil)
			streamCtx, cancelStream := context.WithCancel(context.Background())
			defer cancelStream()
			nextCtx, cancelNext := context.WithCancel(context.Background())
			defer cancelNext()
			ms, err := b.Stream(streamCtx, hello)
			if err != nil {
				t.Fatal(err)
			}
			s := ms.(*Stream)
			defer s.Close()
			if c, err := s.Next(nextCtx); err != nil || c.Text != "Once upon" {
				t.Fatalf("first Next: %+v, %v", c, err)
			}
			errc := make(chan error, 1)
			go func() {
				_, err := s.Next(nextCtx) // blocks: the server sends nothing more
				errc <- err
			}()
			switch how {
			case "stream context":
				cancelStream()
			case "next context":
				cancelNext()
			case "close":
				s.Close()
			}
			wait(t, upstreamDone, "the server observing the request's context done")
			var err2 error
			select {
			case err2 = <-errc:
			case <-time.After(5 * time.Second):
				t.Fatal("the blocked Next did not return within 5s")
			}
			want := context.Canceled
			if how == "close" {
				want = ErrClosed
			}
			if !errors.Is(err2, want) {
				t.Errorf("blocked Next returned %v, want %v", err2, want)
			}
			if _, err := s.Next(context.Background()); err == nil || errors.Is(err, model.EOF) {
				t.Errorf("Next after the cancel returned %v, want an error", err)
			}
			up.wantRequests(t, 1, "")
		})
	}
}

func TestCancelDuringRetryBackoff(t *testing.T) {
	t.Parallel()
	answered := make(chan struct{})
	var once sync.Once
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		w.Header().Set("Retry-After", "10") // a 10s backoff follows
		http.Error(w, `{"error":{"message":"slow down"}}`, http.StatusTooManyRequests)
		once.Do(func() { close(answered) })
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := up.backend(nil).Stream(ctx, hello)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Next(ctx)
		errc <- err
	}()
	wait(t, answered, "the first answer (429)")
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Next returned %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Next did not return within 5s of a cancel during the 10s backoff")
	}
	up.wantRequests(t, 1, "")
}
