package app_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/app"
	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/gateway"
	"github.com/honestcancel/gateway/internal/pgtest"
	"github.com/honestcancel/gateway/store"
)

// These tests drive whole gateways in this process, through their real
// listeners, as a client would: under -race they see the wiring (store,
// bus, engine, gateway) race-checked together. Kill, signal and restart
// need a process boundary: the root package's scenario tests exec the
// binary for those.

// waitLimit bounds every wait of these tests.
const waitLimit = 20 * time.Second

// config is an App's configuration with the command's defaults, on a
// loopback port of the system's choosing.
func config(db string) app.Config {
	return app.Config{
		Addr: "127.0.0.1:0", DB: db, SQLiteSynchronous: store.SynchronousNormal,
		NATSSubject: "gateway", LeaseTTL: 15 * time.Second, ReconcileHorizon: time.Hour,
		Model: "demo", DemoPace: 20 * time.Millisecond,
		StreamTTL: 10 * time.Minute, Workers: 8,
		SearchLatency: 50 * time.Millisecond, OutboxLatency: 50 * time.Millisecond, OutboxRecordDelay: time.Second,
		AuthMode: auth.ModeNone, SessionTTL: time.Hour,
		WSPing: 20 * time.Second, MaxConnAge: time.Hour,
		UserConns: 32, UserSubs: 500, UserRate: 60,
		Hosts:       gateway.LoopbackHosts(),
		BodyTimeout: gateway.DefaultBodyTimeout, IdleTimeout: time.Minute,
	}
}

// start runs an App until the test ends, and returns its base URL.
func start(t *testing.T, cfg app.Config) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.New(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		cancel()
		t.Fatalf("app.New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		a.Close()
	})
	return "http://" + a.Addr().String()
}

// post sends a JSON body and decodes the JSON answer into out.
func post(t *testing.T, url string, body, out any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("POST %s: %v in %s", url, err, raw)
	}
}

// tab is one WebSocket client on one thread: it checks that seqs follow
// each other and keeps every frame.
type tab struct {
	t       *testing.T
	conn    *websocket.Conn
	thread  string
	last    int64
	pending [][]byte // lines of the last message not read yet (a message may carry several)
}

func openTab(t *testing.T, base, thread, tabID string) *tab {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	conn.SetReadLimit(1 << 20)
	tb := &tab{t: t, conn: conn, thread: thread}
	tb.send(map[string]any{"type": "hello", "id": "h", "tab_id": tabID})
	tb.answer("h")
	tb.send(map[string]any{"type": "subscribe", "id": "s", "thread_id": thread, "after_seq": 0})
	tb.answer("s")
	return tb
}

func (tb *tab) send(cmd map[string]any) {
	tb.t.Helper()
	b, _ := json.Marshal(cmd)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := tb.conn.Write(ctx, websocket.MessageText, b); err != nil {
		tb.t.Fatal(err)
	}
}

// frame is one event or answer as the tab read it.
type frame struct {
	Type     string `json:"type"`
	Re       string `json:"re"`
	Seq      int64  `json:"seq"`
	ThreadID string `json:"thread_id"`
	RunID    string `json:"run_id"`
	Text     string `json:"text"`
	Message  string `json:"message_id"`
	raw      []byte
}

// next reads the next frame; events must be of the tab's thread and come
// in seq order, with no gap.
func (tb *tab) next() frame {
	tb.t.Helper()
	for len(tb.pending) == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		_, msg, err := tb.conn.Read(ctx)
		cancel()
		if err != nil {
			tb.t.Fatalf("read: %v", err)
		}
		for line := range bytes.SplitSeq(msg, []byte("\n")) {
			if len(line) > 0 {
				tb.pending = append(tb.pending, line)
			}
		}
	}
	data := tb.pending[0]
	tb.pending = tb.pending[1:]
	var f frame
	if err := json.Unmarshal(data, &f); err != nil {
		tb.t.Fatalf("unreadable frame %s: %v", data, err)
	}
	f.raw = data
	if f.Type == "error" {
		tb.t.Fatalf("error frame: %s", data)
	}
	if f.Seq > 0 && f.Type != "ack" {
		if f.ThreadID != tb.thread {
			tb.t.Fatalf("an event of another thread: %s", data)
		}
		if f.Type != "thread.snapshot" && f.Seq != tb.last+1 {
			tb.t.Fatalf("seq %d after %d (%s): a gap or a duplicate", f.Seq, tb.last, f.Type)
		}
		tb.last = f.Seq
	}
	return f
}

// answer reads up to the ack of command id and returns it.
func (tb *tab) answer(id string) frame {
	tb.t.Helper()
	for {
		if f := tb.next(); f.Type == "ack" && f.Re == id {
			return f
		}
	}
}

// until reads up to the first event of type typ for the run, and returns
// the deltas of that run it read on the way.
func (tb *tab) until(typ, runID string, deltas *[]string) frame {
	tb.t.Helper()
	for {
		f := tb.next()
		if f.RunID != runID {
			continue
		}
		if f.Type == "message.delta" {
			*deltas = append(*deltas, f.Text)
		}
		if f.Type == typ {
			return f
		}
	}
}

type snapshot struct {
	ThreadID     string `json:"thread_id"`
	StateVersion int64  `json:"state_version"`
}

type cancelled struct {
	DiscardedStreamChars int     `json:"discarded_stream_chars"`
	PublishedMessageID   *string `json:"published_message_id"`
	ResumeCheckpointID   string  `json:"resume_checkpoint_id"`
}

// cancelMidReply starts a run through startOn, waits on the tab for its
// first delta, cancels it over the tab, and checks the receipt: the run
// ends cancelled, nothing of it is published, and the discarded count
// covers everything the tab was streamed (it may be more: what the server
// received from the model and had not streamed yet when the cancel came).
func cancelMidReply(t *testing.T, startOn string, tb *tab, thread snapshot) {
	t.Helper()
	var run struct {
		RunID string `json:"run_id"`
	}
	post(t, startOn+"/api/threads/"+thread.ThreadID+"/runs", map[string]any{
		"expected_state_version": thread.StateVersion,
		"user_message":           "Compare desk lamps for reading: light colour, glare, brightness and price, step by step",
	}, &run)
	var deltas []string
	reply := tb.until("message.delta", run.RunID, &deltas).Message
	tb.send(map[string]any{"type": "run.cancel", "id": "c", "run_id": run.RunID, "reason": "enough"})
	for {
		f := tb.next()
		if f.RunID == run.RunID && f.Type == "message.delta" {
			deltas = append(deltas, f.Text)
		}
		if f.RunID == run.RunID && f.Type == "message.published" && strings.Contains(string(f.raw), reply) {
			t.Fatalf("the reply of the cancelled run was published: %s", f.raw)
		}
		if f.Type == "ack" && f.Re == "c" && !strings.Contains(string(f.raw), "cancel_requested") {
			t.Fatalf("cancel ack %s, want status cancel_requested", f.raw)
		}
		if f.RunID == run.RunID && f.Type == "run.cancelled" {
			var body cancelled
			if err := json.Unmarshal(f.raw, &body); err != nil {
				t.Fatal(err)
			}
			seen := utf8.RuneCountInString(strings.Join(deltas, ""))
			if body.DiscardedStreamChars < seen || seen == 0 {
				t.Fatalf("run.cancelled says %d characters discarded; the tab was streamed %d", body.DiscardedStreamChars, seen)
			}
			// The last message published before the cancel is the user's
			// request, never the reply it stopped.
			if body.PublishedMessageID == nil || *body.PublishedMessageID == reply || body.ResumeCheckpointID == "" {
				t.Fatalf("run.cancelled %s: want the request as the last published message (not the reply %s) and a checkpoint to resume from", f.raw, reply)
			}
			return
		}
	}
}

// checkClean audits the database after the apps closed.
func checkClean(t *testing.T, db string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	st, err := store.Open(ctx, db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	v, err := st.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range v {
		t.Errorf("invariant violated: %+v", x)
	}
}

// One gateway on SQLite: a tab cancels a reply mid-stream and is told the
// truth about it; the database then passes every invariant.
func TestAppCancelsMidReply(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gateway.db")
	t.Run("serve", func(t *testing.T) {
		base := start(t, config(db))
		var th snapshot
		post(t, base+"/api/threads", map[string]any{}, &th)
		tb := openTab(t, base, th.ThreadID, "tab-a")
		cancelMidReply(t, base, tb, th)
	})
	checkClean(t, db)
}

// Two gateways on one PostgreSQL database and NATS, in this process: a
// reply started through one is cancelled from a tab on the other (handed
// over NATS to whichever instance executes it), and that tab, which sees
// the reply through the bus, gets the same receipt.
func TestAppsCancelAcrossInstances(t *testing.T) {
	natsURL := os.Getenv("GATEWAY_TEST_NATS_URL")
	if natsURL == "" {
		t.Skip("set GATEWAY_TEST_NATS_URL (and GATEWAY_TEST_POSTGRES_URL) to run two instances")
	}
	db := pgtest.Schema(t)
	var b [6]byte
	rand.Read(b[:])
	subject := "gwtest" + hex.EncodeToString(b[:])
	t.Run("serve", func(t *testing.T) {
		var bases []string
		for i := range 2 {
			cfg := config(db)
			cfg.NATS, cfg.NATSSubject, cfg.InstanceID = natsURL, subject, fmt.Sprintf("gw%d", i)
			cfg.SQLiteSynchronous = ""
			bases = append(bases, start(t, cfg))
		}
		var th snapshot
		post(t, bases[0]+"/api/threads", map[string]any{}, &th)
		tb := openTab(t, bases[1], th.ThreadID, "tab-b")
		cancelMidReply(t, bases[0], tb, th)
	})
	checkClean(t, db)
}
