package web

import (
	"net/http"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/chat"
)

// A conversation page holds its latest messages (the store's window: 50
// messages, 1 MiB: a first paint whose work does not grow with the
// conversation; the page brings older ones as the reader scrolls up) and
// offers the earlier ones; a reply cut at the size
// limit says so; of a reply longer than displayBytes the first paint shows
// the start, on a code point, and offers the whole, which the embedded
// snapshot holds.
func TestThreadPageShowsALongConversationInPart(t *testing.T) {
	long := strings.Repeat("é", displayBytes) // twice displayBytes in bytes
	snap := sampleSnapshot()
	snap.ActiveRun = nil
	snap.EarlierMessages = 12
	snap.Messages = append(snap.Messages,
		chat.Message{MessageID: "msg_cut", ThreadID: "thr_one", Role: chat.RoleAssistant, Kind: chat.KindText, Content: "and on and on",
			StateVersion: 6, CheckpointID: "cp_6", RunID: ptr("run_3"), CreatedAt: t0, Truncated: chat.TruncatedSizeLimit},
		chat.Message{MessageID: "msg_long", ThreadID: "thr_one", Role: chat.RoleAssistant, Kind: chat.KindText, Content: long,
			StateVersion: 7, CheckpointID: "cp_7", RunID: ptr("run_4"), CreatedAt: t0})
	st := newFakeStore(snap)
	doc := page(t, st, "/t/thr_one", http.StatusOK)
	if st.window != [2]int64{50, 1 << 20} {
		t.Errorf("the page asked the store for the latest %d messages within %d bytes, want 50 within 1 MiB", st.window[0], st.window[1])
	}

	earlier := one(t, doc, byTestID("earlier"))
	if hasAttr(earlier, "hidden") || strings.TrimSpace(earlier.Find(byTestID("show-earlier")).Text()) != "Show earlier messages (12 more)" {
		t.Errorf("the earlier messages are not offered: hidden %v, %q", hasAttr(earlier, "hidden"), earlier.Text())
	}
	notes := doc.Find(byTestID("cut-note"))
	if notes.Length() != 1 || notes.Closest(byTestID("message")).AttrOr("data-message-id", "") != "msg_cut" ||
		!strings.Contains(notes.Text(), "Cut at the size limit: the model was stopped after 13 bytes") {
		t.Errorf("%d cut notes (want one, on msg_cut): %q", notes.Length(), notes.Text())
	}

	item := one(t, doc, byTestID("message")+`[data-message-id="msg_long"]`)
	body := item.Find(byTestID("message-body")).Text()
	if len(body) > displayBytes || len(body) < displayBytes-3 || !strings.HasPrefix(long, body) || item.Find(byTestID("message-body")).AttrOr("data-clipped", "") != "true" {
		t.Errorf("the long reply shows %d bytes (want its start, at most %d)", len(body), displayBytes)
	}
	show := item.Find(byTestID("show-whole"))
	if show.Length() != 1 || show.AttrOr("data-message-id", "") != "msg_long" || !strings.Contains(item.Find(byTestID("clipped-note")).Text(), "Showing the first 256 KiB of 512 KiB") {
		t.Errorf("the long reply offers %d buttons, note %q", show.Length(), item.Find(byTestID("clipped-note")).Text())
	}
	if got := snapshotJSON(t, doc); got.EarlierMessages != 12 || got.Messages[len(got.Messages)-1].Content != long || got.Messages[len(got.Messages)-2].Truncated != chat.TruncatedSizeLimit {
		t.Errorf("the embedded snapshot: earlier %d, the long reply whole %v", got.EarlierMessages, got.Messages[len(got.Messages)-1].Content == long)
	}

	// A conversation that fits offers nothing more.
	doc = page(t, newFakeStore(sampleSnapshot()), "/t/thr_one", http.StatusOK)
	if !hasAttr(one(t, doc, byTestID("earlier")), "hidden") || doc.Find(byTestID("cut-note")).Length() != 0 || doc.Find(byTestID("show-whole")).Length() != 0 {
		t.Error("a short conversation offers earlier messages, a cut note or a whole reply")
	}
}
