package gateway_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
)

// A JSON body or WebSocket frame naming a key twice is refused as
// invalid_request, saying which key, and changes nothing: encoding/json
// would silently keep the last one, another parser on the way the first.
func TestDuplicateKeysRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	snap := h.createThread("main")
	before := h.snapshotBytes(snap.ThreadID)
	runs := "/api/threads/" + snap.ThreadID + "/runs"
	for _, tc := range []struct {
		name, path, body, key string
	}{
		{"run.start", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"a","user_message":"b"}`, snap.StateVersion), "user_message"},
		{"escaped twin", runs, fmt.Sprintf(`{"expected_state_version":%d,"user_message":"a","\u0075ser_message":"b"}`, snap.StateVersion), "user_message"},
		{"version twice", runs, fmt.Sprintf(`{"expected_state_version":0,"expected_state_version":%d,"user_message":"a"}`, snap.StateVersion), "expected_state_version"},
		{"title twice", "/api/threads", `{"title":"a","title":"b"}`, "title"},
		{"fork", "/api/threads/" + snap.ThreadID + "/fork", fmt.Sprintf(`{"from_checkpoint_id":%q,"from_checkpoint_id":%q}`, snap.HeadCheckpointID, snap.HeadCheckpointID), "from_checkpoint_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := h.with(t)
			body := h.wantError(t, h.do(http.MethodPost, tc.path, tc.body), http.StatusBadRequest, chat.CodeInvalidRequest)
			if msg, _ := body["message"].(string); !strings.Contains(msg, `"`+tc.key+`"`) || !strings.Contains(msg, "twice") {
				t.Errorf("message %q does not name the key %s given twice", msg, tc.key)
			}
			if got := h.snapshotBytes(snap.ThreadID); got != before {
				t.Errorf("the thread changed: %.300s", got)
			}
		})
	}
	if n := h.threadCount(""); n != 1 {
		t.Errorf("%d threads, want the 1 created", n)
	}

	ws := h.dial(t)
	ws.ack(map[string]any{"type": "hello", "tab_id": "tab-1"})
	ws.subscribe(snap.ThreadID, nil)
	for _, frame := range []string{
		fmt.Sprintf(`{"type":"run.start","id":"dup1","thread_id":%q,"expected_state_version":%d,"user_message":"a","user_message":"b"}`, snap.ThreadID, snap.StateVersion),
		fmt.Sprintf(`{"type":"run.start","id":"dup2","thread_id":"thr_other","thread_id":%q,"expected_state_version":%d,"user_message":"a"}`, snap.ThreadID, snap.StateVersion),
		fmt.Sprintf(`{"type":"thread.fork","id":"dup3","thread_id":%q,"from_checkpoint_id":%q,"from_checkpoint_id":%q}`, snap.ThreadID, snap.HeadCheckpointID, snap.HeadCheckpointID),
	} {
		ws.sendRaw(websocket.MessageText, []byte(frame))
	}
	for _, id := range []string{"dup1", "dup2", "dup3"} {
		a := ws.answer(id)
		if a["type"] != "error" || a["error"] != chat.CodeInvalidRequest || !strings.Contains(fmt.Sprint(a["message"]), "twice") {
			t.Errorf("frame %s answered %v, want invalid_request naming the key given twice", id, a)
		}
	}
	if seen := ws.sync(); len(seen) != 0 {
		t.Errorf("refused frames caused %d events: %v", len(seen), seen)
	}
	if got := h.snapshotBytes(snap.ThreadID); got != before {
		t.Errorf("the thread changed: %.300s", got)
	}
	if n := h.threadCount(""); n != 1 {
		t.Errorf("%d threads after the frames, want 1", n)
	}
}

// A title with a control character is refused on the API, naming the
// field and the character; nothing is created.
func TestTitleControlCharactersRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond)
	for _, title := range []string{"two\nlines", "tab\there", "nul\x00", "\x1b[2Jclear", "del\x7f", "c1\u009b", "rtl\u202eexe.pdf", "iso\u2066x\u2069"} {
		body := h.wantError(t, h.do(http.MethodPost, "/api/threads", map[string]any{"title": title}), http.StatusBadRequest, chat.CodeInvalidRequest)
		if msg, _ := body["message"].(string); !strings.HasPrefix(msg, "title ") || !strings.Contains(msg, "control character") {
			t.Errorf("title %q: message %q does not name the field and the rule", title, msg)
		}
	}
	if n := h.threadCount(""); n != 0 {
		t.Errorf("%d threads created from refused titles", n)
	}
	// What is allowed still is: joiners, right-to-left text, markup.
	for _, title := range []string{"👩‍💻 pairing", "عنوان", "<b>bold</b>"} {
		if s := h.createThread(title); s.Title != title {
			t.Errorf("title %q stored as %q", title, s.Title)
		}
	}
}
