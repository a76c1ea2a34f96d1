package app_test

import (
	"bufio"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
	"github.com/honestcancel/gateway/internal/natstest"
	"github.com/honestcancel/gateway/internal/pgtest"
)

// Two gateways on one PostgreSQL database and a NATS server of the test's
// own. While one of them streams a reply, NATS stalls (its process is
// stopped) and a tab on the other saves the fragment it sees: the other
// cannot ask the streaming instance to yield the thread, so after the
// bus's receipt bound it writes past that instance's reserved seqs. What
// the streaming instance fanned out into them is lost; it learns at its
// next flush. The reply is then never published with a hole: the step
// starts over (attempt 2) under a new message, whose published text is
// exactly its deltas, and the fragment is exactly what the tab saw.
func TestAppsWritePastDuringANATSStall(t *testing.T) {
	db := pgtest.Schema(t)
	ns := natstest.Start(t)
	var b [6]byte
	rand.Read(b[:])
	subject := "gwtest" + hex.EncodeToString(b[:])
	raw, err := sql.Open("pgx", db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	var threadID string
	var lostDeltas int64
	t.Run("serve", func(t *testing.T) {
		var bases [2]string
		for i := range bases {
			cfg := apptest.Config(db)
			cfg.NATS, cfg.NATSSubject, cfg.InstanceID = ns.URL(), subject, fmt.Sprintf("gw%d", i)
			cfg.SQLiteSynchronous = ""
			// About 3 s a reply: it streams on well after the stall.
			cfg.DemoPace = 35 * time.Millisecond
			bases[i], _ = apptest.Serve(t, cfg)
		}
		th := createThread(t, bases[0])
		threadID = th.ThreadID
		run, err := newClient(t, bases[0]).StartRun(bounded(t), client.StartRunRequest{
			ThreadID: th.ThreadID, ExpectedStateVersion: th.StateVersion,
			UserMessage: "Compare desk lamps for reading: light colour, glare, brightness and price, step by step",
		})
		if err != nil {
			t.Fatal(err)
		}
		holder := waitFor(t, "the run claimed", func() (int, bool) {
			var owner sql.NullString
			if err := raw.QueryRow(`SELECT lease_owner FROM runs WHERE run_id = $1`, run.RunID).Scan(&owner); err != nil {
				t.Fatal(err)
			}
			for i := range bases {
				if strings.HasPrefix(owner.String, fmt.Sprintf("gw%d.", i)) {
					return i, true
				}
			}
			return 0, false
		})
		other := newClient(t, bases[1-holder])
		// Some of the reply written: a tab on the other instance sees it.
		waitFor(t, "part of the reply written", func() (struct{}, bool) {
			s, err := other.Thread(bounded(t), th.ThreadID)
			if err != nil {
				t.Fatal(err)
			}
			return struct{}{}, s.ActiveRun != nil && len(strings.Fields(s.ActiveRun.PartialText)) >= 3
		})

		ns.Pause()
		seen, err := other.Thread(bounded(t), th.ThreadID)
		if err != nil {
			t.Fatal(err)
		}
		holed := *seen.ActiveRun.MessageID
		saved, err := other.SaveFragment(bounded(t), client.SaveFragmentRequest{ThreadID: th.ThreadID, MessageID: holed,
			LastSeq: seen.ActiveRun.LastSeq, ExpectedStateVersion: seen.StateVersion})
		ns.Resume()
		if err != nil {
			t.Fatalf("save the fragment the tab saw during the stall: %v", err)
		}

		done := waitFor(t, "the run to end", func() (chat.Run, bool) {
			r, err := other.Run(bounded(t), run.RunID)
			if err != nil {
				t.Fatal(err)
			}
			return r, r.Status.Terminal()
		})
		if done.Status != chat.RunCompleted || done.Attempt != 2 {
			t.Fatalf("run ended %s at attempt %d; want completed at attempt 2 (the step started over once)", done.Status, done.Attempt)
		}
		if n := metric(t, bases[1-holder], "gateway_stream_written_past_total"); n != 1 {
			t.Fatalf("the other instance wrote past %d reservations, want 1", n)
		}
		// Whether deltas were lost depends on the moment the other
		// instance wrote past: with deltas fanned out and not yet written,
		// they are lost and the holder stops the message at its next
		// flush; with none (it had written all it had streamed), only
		// reserved seqs no delta was given are gone, the holder streams on
		// after the gap, and the store refuses to publish the message
		// across it. Either way the step starts over (checked above) and
		// the reply published is whole (below).
		lostDeltas = metric(t, bases[holder], "gateway_stream_deltas_lost_total")
		t.Logf("deltas lost by the streaming instance: %d", lostDeltas)
		final, err := other.Thread(bounded(t), th.ThreadID)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(final.Messages); n != 3 || final.Messages[1].MessageID != saved.MessageID || final.Messages[1].Content != seen.ActiveRun.PartialText ||
			final.Messages[2].MessageID == holed {
			t.Fatalf("history %+v; want the request, the fragment %q exactly as the tab saw it, and a reply other than the cut one %s",
				final.Messages, seen.ActiveRun.PartialText, holed)
		}
		reply := final.Messages[2]

		// Read back after the seqs recorded lost: the reply's deltas, in
		// full, make exactly its published text.
		var gapLast int64
		if err := raw.QueryRow(`SELECT COALESCE(MAX(last_seq), 0) FROM stream_gaps WHERE thread_id = $1`, th.ThreadID).Scan(&gapLast); err != nil || gapLast == 0 {
			t.Fatalf("no seqs recorded lost (%v)", err)
		}
		events, err := other.Events(bounded(t), th.ThreadID, gapLast)
		if err != nil {
			t.Fatal(err)
		}
		defer events.Close()
		var deltas strings.Builder
		for {
			ev, err := events.Next(bounded(t))
			if err != nil {
				t.Fatal(err)
			}
			if ev.Type == chat.EventThreadSnapshot {
				t.Fatalf("the events after seq %d cannot be replayed: %s", gapLast, ev.Raw)
			}
			if d := ev.Delta(); d != nil && d.MessageID == reply.MessageID {
				deltas.WriteString(d.Text)
			}
			if p := ev.Published(); p != nil && p.Message.MessageID == reply.MessageID {
				if p.Message.Content != deltas.String() {
					t.Fatalf("published reply %q is not its deltas %q", p.Message.Content, deltas.String())
				}
				break
			}
		}
	})
	apptest.CheckClean(t, db)
	if lostDeltas == 0 {
		return // the cut reply went on after the gap (see above)
	}
	// The reply cut by the write-past with deltas lost: its seqs before the
	// hole are all written, none after it (the holder stopped it).
	var after int
	if err := raw.QueryRow(`SELECT COUNT(*) FROM stream_batches b WHERE b.thread_id = $1 AND b.first_seq > (SELECT MIN(first_seq) FROM stream_gaps g WHERE g.thread_id = $1)
		AND b.message_id IN (SELECT message_id FROM stream_messages WHERE run_id IN (SELECT run_id FROM runs WHERE thread_id = $1)
		AND message_id NOT IN (SELECT message_id FROM messages))`, threadID).Scan(&after); err != nil || after != 0 {
		t.Fatalf("%d batches of the unpublished reply were written after the hole (%v); want none", after, err)
	}
}

// waitFor polls cond until it reports true, at most waitLimit, and returns
// what it returned then.
func waitFor[T any](t *testing.T, what string, cond func() (T, bool)) T {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		v, ok := cond()
		if ok {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", waitLimit, what)
		}
		time.Sleep(10 * time.Millisecond) // polling the state through the API, bounded by the deadline
	}
}

// metric reads one counter from the gateway's /metrics.
func metric(t *testing.T, base, name string) int64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %q", name, v)
			}
			return n
		}
	}
	t.Fatalf("no %s in %s/metrics", name, base)
	return 0
}
