package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
)

// GET /api/threads/{id}/messages pages back over the head's history:
// the latest messages first, then, by next_before, the older ones, each
// message once and as the snapshot holds it; next_before is null on the
// page that starts the history. Bad paging parameters are invalid_request,
// a before that is not in the history not_found.
func TestHistoryPagesOverHTTP(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	th := h.createThread("")
	for range 4 {
		h.runToEnd(th.ThreadID, h.snapshot(th.ThreadID).StateVersion, "short hello")
	}
	snap := h.snapshot(th.ThreadID)
	if len(snap.Messages) != 8 {
		t.Fatalf("%d messages after four exchanges", len(snap.Messages))
	}

	r := h.call(http.MethodGet, "/api/threads/"+th.ThreadID+"/messages?limit=3", nil, http.StatusOK, nil)
	raw := rawFields(t, r.body)
	for _, k := range []string{"thread_id", "head_checkpoint_id", "state_version", "messages", "next_before"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("a history page lacks %q: %s", k, r.body)
		}
	}
	var got []chat.Message
	path := "/api/threads/" + th.ThreadID + "/messages?limit=3"
	for pages := 0; ; pages++ {
		if pages > 4 {
			t.Fatal("paging does not end")
		}
		var page chat.HistoryPage
		h.call(http.MethodGet, path, nil, http.StatusOK, &page)
		if page.ThreadID != th.ThreadID || page.HeadCheckpointID != snap.HeadCheckpointID || page.StateVersion != snap.StateVersion || len(page.Messages) == 0 || len(page.Messages) > 3 {
			t.Fatalf("%s: %+v", path, page)
		}
		got = append(page.Messages, got...)
		if page.NextBefore == nil {
			break
		}
		path = "/api/threads/" + th.ThreadID + "/messages?limit=3&before=" + *page.NextBefore
	}
	want, _ := json.Marshal(snap.Messages)
	if paged, _ := json.Marshal(got); string(paged) != string(want) {
		t.Fatalf("the pages hold\n%s\nthe snapshot\n%s", paged, want)
	}
	// Without a limit: the default page holds all eight.
	var all chat.HistoryPage
	h.call(http.MethodGet, "/api/threads/"+th.ThreadID+"/messages", nil, http.StatusOK, &all)
	if len(all.Messages) != 8 || all.NextBefore != nil {
		t.Fatalf("the default page: %d messages, next %v", len(all.Messages), all.NextBefore)
	}

	for _, q := range []string{"limit=0", "limit=201", "limit=abc", "before=", "before=msg_" + strings.Repeat("x", 62)} {
		h.wantError(t, h.do(http.MethodGet, "/api/threads/"+th.ThreadID+"/messages?"+q, nil), http.StatusBadRequest, chat.CodeInvalidRequest)
	}
	h.wantError(t, h.do(http.MethodGet, "/api/threads/"+th.ThreadID+"/messages?before=msg_nothere", nil), http.StatusNotFound, chat.CodeNotFound)
	h.wantError(t, h.do(http.MethodGet, "/api/threads/thr_nothere/messages", nil), http.StatusNotFound, chat.CodeNotFound)
}

// GET /api/threads/{id}/messages?ids= answers messages by id, in the
// order asked, without paging; ids that are not the thread's are left
// out, and a malformed or oversized list is invalid_request (never a page
// of the history instead).
func TestMessagesByIDOverHTTP(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	th := h.createThread("")
	h.runToEnd(th.ThreadID, h.snapshot(th.ThreadID).StateVersion, "short hello")
	snap := h.snapshot(th.ThreadID)
	u, a := snap.Messages[0].MessageID, snap.Messages[1].MessageID
	var got struct {
		ThreadID string         `json:"thread_id"`
		Messages []chat.Message `json:"messages"`
	}
	h.call(http.MethodGet, "/api/threads/"+th.ThreadID+"/messages?ids="+a+",msg_nothere,"+u, nil, http.StatusOK, &got)
	if got.ThreadID != th.ThreadID || len(got.Messages) != 2 || got.Messages[0].MessageID != a || got.Messages[1].MessageID != u || got.Messages[1].Content != "short hello" {
		t.Fatalf("by id: %+v", got)
	}
	many := strings.TrimSuffix(strings.Repeat(u+",", 21), ",")
	for _, q := range []string{"ids=", "ids=" + u + ",", "ids=" + many, "ids=" + u + "&limit=3", "ids=" + u + "&before=" + a, "ids=msg_" + strings.Repeat("x", 62)} {
		h.wantError(t, h.do(http.MethodGet, "/api/threads/"+th.ThreadID+"/messages?"+q, nil), http.StatusBadRequest, chat.CodeInvalidRequest)
	}
	h.wantError(t, h.do(http.MethodGet, "/api/threads/thr_nothere/messages?ids="+u, nil), http.StatusNotFound, chat.CodeNotFound)
}
