package store_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// A reply cut at the size limit says so (truncated: size_limit) in the
// snapshot, in its message.published event (live and replayed) and after
// the store is opened again; its text is still exactly its deltas, and
// the other messages say nothing.
func TestTruncatedReplySurvivesSnapshotEventsAndRestart(t *testing.T) {
	log := &commitLog{}
	path := testDSN(t)
	st, err := store.Open(ctx, path, store.Options{Exclusive: true, StreamBuffer: true, OnCommit: log.add})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			st.Close()
		}
	})
	th := newThread(t, st)
	runID := startAndClaim(t, st, th.ThreadID, "write forever")
	msgID := chat.NewID(chat.PrefixMessage)
	deltas := []string{"one ", "two ", "thr"}
	if err := st.AppendDeltas(ctx, leaseW(runID), msgID, deltas); err != nil {
		t.Fatal(err)
	}
	out := chat.StepOutput{Step: pendingStep(t, st, runID), MessageID: msgID, Kind: chat.KindText,
		Content: strings.Join(deltas, ""), Truncated: chat.TruncatedSizeLimit}
	if err := st.CompleteWith(ctx, leaseW(runID), out); err != nil {
		t.Fatal(err)
	}
	wantMessages := func(when string, msgs []chat.Message) {
		t.Helper()
		if len(msgs) != 2 || msgs[1].MessageID != msgID || msgs[1].Content != "one two thr" || msgs[1].Truncated != chat.TruncatedSizeLimit || msgs[0].Truncated != "" {
			t.Fatalf("%s: messages %+v, want the request, then the reply cut at the size limit", when, msgs)
		}
	}
	snap, err := st.Snapshot(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	wantMessages("snapshot", snap.Messages)

	published := func(events []*chat.Event) *chat.Message {
		for _, ev := range events {
			if ev.Type != chat.EventMessagePublished {
				continue
			}
			if ev.Raw == nil {
				if err := ev.Encode(); err != nil {
					t.Fatal(err)
				}
			}
			var body struct {
				Message chat.Message `json:"message"`
			}
			if err := json.Unmarshal(ev.Raw, &body); err != nil {
				t.Fatal(err)
			}
			if body.Message.MessageID == msgID {
				return &body.Message
			}
		}
		return nil
	}
	log.mu.Lock()
	var live []*chat.Event
	for _, c := range log.commits {
		live = append(live, c...)
	}
	log.mu.Unlock()
	if m := published(live); m == nil || m.Truncated != chat.TruncatedSizeLimit {
		t.Fatalf("the live message.published carries %+v, want truncated %q", m, chat.TruncatedSizeLimit)
	}
	replay, err := st.Events(ctx, user, th.ThreadID, 0)
	if err != nil || !replay.Complete {
		t.Fatalf("replay = %+v, %v", replay, err)
	}
	if m := published(replay.Events); m == nil || m.Truncated != chat.TruncatedSizeLimit || m.Content != "one two thr" {
		t.Fatalf("the replayed message.published carries %+v, want truncated %q", m, chat.TruncatedSizeLimit)
	}

	st.Close()
	closed = true
	again, err := store.Open(ctx, path, store.Options{Exclusive: true, StreamBuffer: true})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	snap, err = again.Snapshot(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	wantMessages("after a restart", snap.Messages)
	mustCheck(t, again, "after a restart")
}

// The page's first paint reads only the latest messages, up to a count
// and a size (the latest one whatever its size); History pages back over
// the rest, each message exactly once, oldest first, and says where the
// history starts. A before that is not in the head's history, and another
// user's thread, answer not_found.
func TestHistoryPagesBackwardsBySizeAndCount(t *testing.T) {
	st, _ := open(t)
	th := newThread(t, st)
	// Ten exchanges: requests of 1 byte, replies of 100 bytes but the
	// eighth, of 1,000 bytes (message 15).
	for i := range 10 {
		answer := strings.Repeat("a", 100)
		if i == 7 {
			answer = strings.Repeat("b", 1000)
		}
		completeRun(t, st, th.ThreadID, "q", answer)
	}
	full, err := st.Snapshot(ctx, user, th.ThreadID)
	if err != nil || len(full.Messages) != 20 || full.EarlierMessages != 0 {
		t.Fatalf("the full snapshot: %d messages, earlier %d, %v", len(full.Messages), full.EarlierMessages, err)
	}
	all := full.Messages
	ids := func(ms []chat.Message) string {
		var out []string
		for _, m := range ms {
			out = append(out, m.MessageID)
		}
		return strings.Join(out, " ")
	}

	// By count: the last 5.
	snap, err := st.SnapshotLatest(ctx, user, th.ThreadID, 5, 1<<20)
	if err != nil || ids(snap.Messages) != ids(all[15:]) || snap.EarlierMessages != 15 {
		t.Fatalf("latest 5: %d messages, earlier %d, %v", len(snap.Messages), snap.EarlierMessages, err)
	}
	if snap.StateVersion != full.StateVersion || snap.LastSeq != full.LastSeq || snap.LastRun == nil {
		t.Fatalf("a windowed snapshot is otherwise the snapshot: %+v", snap)
	}
	// By size: 300 bytes hold the last reply, its request, the reply before
	// and its request (202 bytes); the 1,000-byte reply does not fit.
	snap, _ = st.SnapshotLatest(ctx, user, th.ThreadID, 50, 300)
	if ids(snap.Messages) != ids(all[16:]) || snap.EarlierMessages != 16 {
		t.Fatalf("latest within 300 bytes: %d messages (want 4), earlier %d", len(snap.Messages), snap.EarlierMessages)
	}
	// The latest message is always there, whatever its size.
	snap, _ = st.SnapshotLatest(ctx, user, th.ThreadID, 50, 10)
	if ids(snap.Messages) != ids(all[19:]) || snap.EarlierMessages != 19 {
		t.Fatalf("latest within 10 bytes: %d messages (want the latest one), earlier %d", len(snap.Messages), snap.EarlierMessages)
	}

	// Paging back over the whole history by 300 bytes.
	var got []chat.Message
	before := all[16].MessageID
	for pages := 0; ; pages++ {
		if pages > 20 {
			t.Fatal("History never reached the start")
		}
		page, err := st.History(ctx, user, th.ThreadID, before, 50, 300)
		if err != nil {
			t.Fatal(err)
		}
		if page.HeadCheckpointID != full.HeadCheckpointID || page.StateVersion != full.StateVersion || len(page.Messages) == 0 {
			t.Fatalf("page before %s: %+v", before, page)
		}
		got = append(page.Messages, got...)
		if page.NextBefore == nil {
			break
		}
		if *page.NextBefore != page.Messages[0].MessageID {
			t.Fatalf("next_before %s is not the page's oldest message %s", *page.NextBefore, page.Messages[0].MessageID)
		}
		before = *page.NextBefore
	}
	if ids(got) != ids(all[:16]) {
		t.Fatalf("paged back: %d messages, want the 16 before the window, each once, in order", len(got))
	}
	for i, m := range got {
		if m.Content != all[i].Content {
			t.Fatalf("message %d differs when paged: %q", i, m.Content)
		}
	}
	// The latest page, with before empty, is SnapshotLatest's.
	if page, _ := st.History(ctx, user, th.ThreadID, "", 5, 1<<20); ids(page.Messages) != ids(all[15:]) || page.NextBefore == nil || *page.NextBefore != all[15].MessageID {
		t.Fatalf("the latest page of 5: %s, next %v", ids(page.Messages), page.NextBefore)
	}
	// Before the first message: nothing, and nothing more.
	if page, err := st.History(ctx, user, th.ThreadID, all[0].MessageID, 5, 1<<20); err != nil || len(page.Messages) != 0 || page.NextBefore != nil {
		t.Fatalf("before the first message: %+v, %v", page, err)
	}

	if _, err := st.History(ctx, user, th.ThreadID, "msg_nope", 5, 1<<20); code(err) != chat.CodeNotFound {
		t.Fatalf("a before that is not in the history = %v, want not_found", err)
	}
	if _, err := st.History(ctx, "usr_other", th.ThreadID, "", 5, 1<<20); code(err) != chat.CodeNotFound {
		t.Fatalf("another user's thread = %v, want not_found", err)
	}
	if _, err := st.SnapshotLatest(ctx, "usr_other", th.ThreadID, 5, 1<<20); code(err) != chat.CodeNotFound {
		t.Fatalf("another user's thread = %v, want not_found", err)
	}
}
