package web

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/PuerkitoBio/goquery"

	"github.com/honestcancel/gateway/chat"
)

// fakeRuns records the runs started, and refuses them with err when set.
type fakeRuns struct {
	mu      sync.Mutex
	started []chat.StartRun
	err     error
}

func (f *fakeRuns) StartRun(_ context.Context, p chat.StartRun) (chat.RunStartAck, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return chat.RunStartAck{}, f.err
	}
	f.started = append(f.started, p)
	return chat.RunStartAck{RunID: "run_1", Status: chat.RunQueued, StateVersion: p.ExpectedStateVersion + 1}, nil
}

func homeServer(st *fakeStore, o Options) http.Handler {
	mux := http.NewServeMux()
	New(st, nil, nil, nil).With(o).Routes(mux)
	return mux
}

// The home page's box posted without the script: the conversation is
// created and its first request sent, as typed (a browser's CR LF line
// breaks as LF); what cannot be sent is refused before anything is
// created, saying what to do; a refusal of the run once the conversation
// exists says so, with the way to it.
func TestHomeBoxWithoutTheScript(t *testing.T) {
	t.Run("sent", func(t *testing.T) {
		st, runs := newFakeStore(), &fakeRuns{}
		w := do(t, homeServer(st, Options{Runs: runs}), req{method: "POST", path: "/threads", form: url.Values{"message": {"Plan a trip\r\nto Porto"}}, header: sameOrigin})
		if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/t/thr_new1" {
			t.Fatalf("status %d, Location %q: %s", w.Code, w.Header().Get("Location"), w.Body)
		}
		if len(runs.started) != 1 {
			t.Fatalf("%d runs started, want 1", len(runs.started))
		}
		p := runs.started[0]
		if p.ThreadID != "thr_new1" || p.UserID != chat.LocalUserID || p.UserMessage == nil || *p.UserMessage != "Plan a trip\nto Porto" {
			t.Errorf("started %+v (message %q)", p, *p.UserMessage)
		}
	})
	t.Run("empty: a new conversation, nothing sent", func(t *testing.T) {
		st, runs := newFakeStore(), &fakeRuns{}
		w := do(t, homeServer(st, Options{Runs: runs}), req{method: "POST", path: "/threads", form: url.Values{"message": {" \r\n "}}, header: sameOrigin})
		if w.Code != http.StatusSeeOther || len(st.created) != 1 || len(runs.started) != 0 {
			t.Errorf("status %d, %d created, %d started", w.Code, len(st.created), len(runs.started))
		}
	})
	for _, tc := range []struct {
		name, message string
		runs          Runs
		status        int
		says          string
	}{
		{"over the form's size", strings.Repeat("é", maxFormBytes/6+1), &fakeRuns{}, http.StatusRequestEntityTooLarge, "go back, shorten what you typed, and send it again"},
		{"not UTF-8", "ab\xffcd", &fakeRuns{}, http.StatusBadRequest, "not valid UTF-8. Go back: your text is still in the box."},
		{"no way to send", "hello", nil, http.StatusServiceUnavailable, "turn JavaScript on for this site"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newFakeStore()
			w := wantRefusedPage(t, do(t, homeServer(st, Options{Runs: tc.runs}), req{method: "POST", path: "/threads", form: url.Values{"message": {tc.message}}, header: sameOrigin}), tc.status, map[int]string{400: chat.CodeInvalidRequest, 413: chat.CodeInvalidRequest, 503: chat.CodeInternal}[tc.status])
			if msg := parse(t, w.Body.String()).Find(`[role="alert"]`).Text(); !strings.Contains(msg, tc.says) {
				t.Errorf("message %q, want it to say %q", msg, tc.says)
			}
			if len(st.created) != 0 {
				t.Errorf("%d conversations created", len(st.created))
			}
		})
	}
	t.Run("the run refused", func(t *testing.T) {
		st := newFakeStore()
		runs := &fakeRuns{err: chat.Errorf(chat.CodeRateLimited, "too many replies at once: wait 2 s.").With("retry_after_seconds", 2)}
		w := wantRefusedPage(t, do(t, homeServer(st, Options{Runs: runs}), req{method: "POST", path: "/threads", form: url.Values{"message": {"hello"}}, header: sameOrigin}), http.StatusTooManyRequests, chat.CodeRateLimited)
		msg := parse(t, w.Body.String()).Find(`[role="alert"]`).Text()
		if !strings.Contains(msg, "/t/thr_new1") || !strings.Contains(msg, "too many replies at once") || !strings.Contains(msg, "your text is still in the box") {
			t.Errorf("message %q", msg)
		}
		if w.Header().Get("Retry-After") != "2" {
			t.Errorf("Retry-After %q", w.Header().Get("Retry-After"))
		}
	})
}

// The page script posts the rename form asking for JSON: the saved title,
// or the refusal as the API words it; without the header, a page.
func TestRenameAnswersJSONToTheScript(t *testing.T) {
	asJSON := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://example.com", "Accept": "application/json"}
	decode := func(t *testing.T, body string) map[string]string {
		t.Helper()
		var m map[string]string
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("not JSON: %q", body)
		}
		return m
	}
	st := newFakeStore(sampleSnapshot())
	h := newServer(t, st)
	w := do(t, h, req{method: "POST", path: "/t/thr_one/rename", form: url.Values{"title": {"  Porto in June "}}, header: asJSON})
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, type %q: %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	if got := decode(t, w.Body.String()); got["title"] != "Porto in June" || got["thread_id"] != "thr_one" {
		t.Errorf("answer %v", got)
	}
	for _, tc := range []struct {
		name, path, title string
		status            int
		code, says        string
	}{
		{"refused", "/t/thr_one/rename", "a\u202eb", http.StatusBadRequest, chat.CodeInvalidRequest, "U+202E"},
		{"empty", "/t/thr_one/rename", "  ", http.StatusBadRequest, chat.CodeInvalidRequest, "title"},
		{"unknown", "/t/thr_missing/rename", "x", http.StatusNotFound, chat.CodeNotFound, "thr_missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := do(t, h, req{method: "POST", path: tc.path, form: url.Values{"title": {tc.title}}, header: asJSON})
			got := decode(t, w.Body.String())
			if w.Code != tc.status || got["type"] != "error" || got["error"] != tc.code || !strings.Contains(got["message"], tc.says) {
				t.Errorf("status %d, answer %v", w.Code, got)
			}
		})
	}
	if st.snaps["thr_one"].Title != "Porto in June" {
		t.Errorf("title %q", st.snaps["thr_one"].Title)
	}
	// A form's own post (no Accept: JSON) still gets pages.
	if w := do(t, h, req{method: "POST", path: "/t/thr_one/rename", form: url.Values{"title": {"x"}}, header: sameOrigin}); w.Code != http.StatusSeeOther {
		t.Errorf("plain post: %d", w.Code)
	}
}

// An empty conversation says what the configured model can do: the demo
// model's tools and cards, and for any other model nothing a model might
// not do.
func TestStarterHint(t *testing.T) {
	empty := chat.Snapshot{ThreadID: "thr_empty", Title: "New conversation", StateVersion: 1, LastSeq: 1, Messages: []chat.Message{}}
	for _, tc := range []struct {
		model        string
		says, denies []string
	}{
		{"demo", []string{"demo model", "Markdown", "order on a card", "catalog", "email", "confirm"}, nil},
		{"openai", []string{"Ask anything"}, []string{"demo", "catalog", "email", "Markdown"}},
		{"", []string{"Ask anything"}, []string{"demo", "catalog"}},
	} {
		t.Run(tc.model, func(t *testing.T) {
			st := newFakeStore(empty)
			w := do(t, homeServer(st, Options{Model: tc.model}), req{method: "GET", path: "/t/thr_empty"})
			doc := parse(t, w.Body.String())
			hint := one(t, doc, byTestID("starter"))
			text := hint.Text()
			for _, s := range tc.says {
				if !strings.Contains(text, s) {
					t.Errorf("the hint does not say %q: %q", s, text)
				}
			}
			for _, s := range tc.denies {
				if strings.Contains(text, s) {
					t.Errorf("the hint says %q for model %q: %q", s, tc.model, text)
				}
			}
			ex := hint.Find(byTestID("example"))
			if ex.Length() < 2 || ex.Length() > 4 {
				t.Errorf("%d examples, want 2 to 4", ex.Length())
			}
			ex.Each(func(_ int, b *goquery.Selection) {
				if b.AttrOr("type", "") != "button" || b.AttrOr("data-example", "") != b.Text() {
					t.Errorf("example %q: type %q, data-example %q", b.Text(), b.AttrOr("type", ""), b.AttrOr("data-example", ""))
				}
			})
			// Right after the (empty) list: the stylesheet hides it once the
			// list has a message (.messages:not(:empty) + .starter).
			if doc.Find(byTestID("messages")+" + "+byTestID("starter")).Length() != 1 {
				t.Error("the hint does not follow the message list")
			}
		})
	}
}
