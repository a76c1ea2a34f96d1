package app_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
	"github.com/honestcancel/gateway/internal/pgtest"
)

// These tests drive whole gateways in this process, through their real
// listeners, as a client would (package client, the protocol's Go client):
// under -race they see the wiring (store, bus, engine, gateway)
// race-checked together. Kill, signal and restart need a process
// boundary: the root package's scenario tests exec the binary for those.

// waitLimit bounds every wait of these tests.
const waitLimit = 20 * time.Second

// newClient is a protocol client of the gateway at base, closed when the
// newClient is a protocol client of the gateway at base, closed when the
// test ends.
func newClient(t *testing.T, base string, opts ...client.Option) *client.Client {
	t.Helper()
	return apptest.Client(t, base, opts...)
}

// bounded is a context that ends after waitLimit.
func bounded(t *testing.T) context.Context { return apptest.Bounded(t, waitLimit) }

// createThread creates a thread through base's API.
func createThread(t *testing.T, base string) chat.Snapshot {
	t.Helper()
	th, err := newClient(t, base).CreateThread(bounded(t), "")
	if err != nil {
		t.Fatalf("POST %s/api/threads: %v", base, err)
	}
	return th
}

// tab is one WebSocket client on one thread: the client hands it the
// thread's events each seq once and in order, and the tab checks that the
// server needed no repair for that (no reconnection, no duplicate, gap,
// event of another thread, unanswered error or unreadable frame) and that
// seqs follow each other.
type tab struct {
	t      *testing.T
	conn   *client.Conn
	sub    *client.Subscription
	thread string
	last   int64
}

func openTab(t *testing.T, base, thread, tabID string) *tab {
	t.Helper()
	conn, err := newClient(t, base).Connect(bounded(t), client.ConnOptions{TabID: tabID, ReadLimit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	sub, err := conn.Subscribe(bounded(t), thread, 0)
	if err != nil {
		t.Fatal(err)
	}
	return &tab{t: t, conn: conn, sub: sub, thread: thread}
}

// next reads the next event; events must be of the tab's thread and come
// in seq order, with no gap, on the connection the tab opened.
func (tb *tab) next() client.Event {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	ev, err := tb.sub.Next(ctx)
	cancel()
	if err != nil {
		tb.t.Fatalf("read: %v", err)
	}
	switch st := tb.conn.Stats(); {
	case st.Connects != 1:
		tb.t.Fatalf("the connection dropped (%d connections)", st.Connects)
	case st.Unanswered+st.Malformed != 0:
		tb.t.Fatalf("error or unreadable frame: %s", st.LastAnomaly)
	case st.Stray != 0:
		tb.t.Fatalf("an event of another thread: %s", st.LastAnomaly)
	case st.Duplicates+st.Jumps+st.Lagged != 0:
		tb.t.Fatalf("a gap or a duplicate: %s", st.LastAnomaly)
	}
	if ev.ThreadID != tb.thread {
		tb.t.Fatalf("an event of another thread: %s", ev.Raw)
	}
	if ev.Type != chat.EventThreadSnapshot && ev.Seq != tb.last+1 {
		tb.t.Fatalf("seq %d after %d (%s): a gap or a duplicate", ev.Seq, tb.last, ev.Type)
	}
	tb.last = ev.Seq
	return ev
}

// until reads up to the first event of type typ for the run, and returns
// the deltas of that run it read on the way.
func (tb *tab) until(typ, runID string, deltas *[]string) client.Event {
	tb.t.Helper()
	for {
		ev := tb.next()
		if ev.RunID != runID {
			continue
		}
		if d := ev.Delta(); d != nil {
			*deltas = append(*deltas, d.Text)
		}
		if ev.Type == typ {
			return ev
		}
	}
}

// cancelMidReply starts a run through startOn, waits on the tab for its
// first delta, cancels it over the tab, and checks the receipt: the run
// ends cancelled, nothing of it is published, and the discarded count
// covers everything the tab was streamed (it may be more: what the server
// received from the model and had not streamed yet when the cancel came).
func cancelMidReply(t *testing.T, startOn string, tb *tab, thread chat.Snapshot) {
	t.Helper()
	run, err := newClient(t, startOn).StartRun(bounded(t), client.StartRunRequest{
		ThreadID:             thread.ThreadID,
		ExpectedStateVersion: thread.StateVersion,
		UserMessage:          "Compare desk lamps for reading: light colour, glare, brightness and price, step by step",
	})
	if err != nil {
		t.Fatalf("POST %s/api/threads/%s/runs: %v", startOn, thread.ThreadID, err)
	}
	var deltas []string
	reply := tb.until(chat.EventMessageDelta, run.RunID, &deltas).Delta().MessageID
	ack, err := tb.conn.CancelRun(bounded(t), client.CancelRunRequest{RunID: run.RunID, Reason: "enough"})
	if err != nil {
		t.Fatalf("error frame: %v", err)
	}
	if ack.Status != chat.RunCancelRequested {
		t.Fatalf("cancel ack %+v, want status cancel_requested", ack)
	}
	for {
		ev := tb.next()
		if ev.RunID == run.RunID && ev.Type == chat.EventMessageDelta {
			deltas = append(deltas, ev.Delta().Text)
		}
		if ev.RunID == run.RunID && ev.Type == chat.EventMessagePublished && strings.Contains(string(ev.Raw), reply) {
			t.Fatalf("the reply of the cancelled run was published: %s", ev.Raw)
		}
		if ev.RunID == run.RunID && ev.Type == chat.EventRunCancelled {
			body := ev.Cancelled()
			seen := int64(utf8.RuneCountInString(strings.Join(deltas, "")))
			if body.DiscardedStreamChars < seen || seen == 0 {
				t.Fatalf("run.cancelled says %d characters discarded; the tab was streamed %d", body.DiscardedStreamChars, seen)
			}
			// The last message published before the cancel is the user's
			// request, never the reply it stopped.
			if body.PublishedMessageID == nil || *body.PublishedMessageID == reply || body.ResumeCheckpointID == "" {
				t.Fatalf("run.cancelled %s: want the request as the last published message (not the reply %s) and a checkpoint to resume from", ev.Raw, reply)
			}
			return
		}
	}
}

// One gateway on SQLite: a tab cancels a reply mid-stream and is told the
// truth about it; the database then passes every invariant.
func TestAppCancelsMidReply(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gateway.db")
	t.Run("serve", func(t *testing.T) {
		base, _ := apptest.Serve(t, apptest.Config(db))
		th := createThread(t, base)
		tb := openTab(t, base, th.ThreadID, "tab-a")
		cancelMidReply(t, base, tb, th)
	})
	apptest.CheckClean(t, db)
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
			cfg := apptest.Config(db)
			cfg.NATS, cfg.NATSSubject, cfg.InstanceID = natsURL, subject, fmt.Sprintf("gw%d", i)
			cfg.SQLiteSynchronous = ""
			base, _ := apptest.Serve(t, cfg)
			bases = append(bases, base)
		}
		th := createThread(t, bases[0])
		tb := openTab(t, bases[1], th.ThreadID, "tab-b")
		cancelMidReply(t, bases[0], tb, th)
	})
	apptest.CheckClean(t, db)
}
