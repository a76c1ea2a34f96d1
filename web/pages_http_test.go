// The pages served over HTTP with a fake store: listing, thread pages and
// their errors, create and rename, cross-origin posts, static files, and
// method and path mismatches.

package web

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/static"
)

type req struct {
	method, path string
	form         url.Values
	header       map[string]string
}

func do(t *testing.T, h http.Handler, r req) *httptest.ResponseRecorder {
	t.Helper()
	var body *strings.Reader
	if r.form != nil {
		body = strings.NewReader(r.form.Encode())
	} else {
		body = strings.NewReader("")
	}
	hr := httptest.NewRequest(r.method, r.path, body)
	if r.form != nil {
		hr.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, hr)
	return w
}

var sameOrigin = map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://example.com"}

func TestHTTP(t *testing.T) {
	snapA := sampleSnapshot()
	snapB := chat.Snapshot{ThreadID: "thr_two", Title: "Second <thread>", StateVersion: 3, LastSeq: 4, Messages: []chat.Message{}}
	// A "New conversation" nothing was sent in: not listed, but for on its own page.
	unused := chat.Snapshot{ThreadID: "thr_unused", Title: chat.DefaultTitle, StateVersion: 1, LastSeq: 1, Messages: []chat.Message{}}

	t.Run("a conversation never written to is listed only on its own page", func(t *testing.T) {
		st := newFakeStore(snapA, unused)
		home := parse(t, do(t, newServer(t, st), req{method: "GET", path: "/"}).Body.String())
		if n := home.Find(byTestID("thread-link") + `[href="/t/thr_unused"]`).Length(); n != 0 {
			t.Errorf("the unused conversation is listed on the home page (%d links)", n)
		}
		own := parse(t, do(t, newServer(t, st), req{method: "GET", path: "/t/thr_unused"}).Body.String())
		if n := own.Find(byTestID("thread-link") + `[href="/t/thr_unused"][aria-current="page"]`).Length(); n != 1 {
			t.Errorf("on its own page the unused conversation has %d current links, want 1", n)
		}
	})

	t.Run("home lists threads", func(t *testing.T) {
		st := newFakeStore(snapA, snapB)
		doc := page(t, st, "/", http.StatusOK)
		one(t, doc, byTestID("home"))
		links := doc.Find(byTestID("thread-link"))
		if links.Length() != 2 {
			t.Fatalf("%d links, want 2", links.Length())
		}
		if links.Eq(0).AttrOr("href", "") != "/t/thr_one" || links.Eq(1).AttrOr("href", "") != "/t/thr_two" {
			t.Errorf("hrefs %q %q", links.Eq(0).AttrOr("href", ""), links.Eq(1).AttrOr("href", ""))
		}
		if links.Eq(1).Text() != snapB.Title {
			t.Errorf("link text %q, want %q", links.Eq(1).Text(), snapB.Title)
		}
		if !st.users[chat.LocalUserID] || len(st.users) != 1 {
			t.Errorf("store saw users %v, want only %s", st.users, chat.LocalUserID)
		}
	})

	t.Run("home survives a failing list", func(t *testing.T) {
		st := newFakeStore(snapA)
		st.listErr = errors.New("list broke")
		w := do(t, newServer(t, st), req{method: "GET", path: "/"})
		if w.Code != http.StatusOK {
			t.Fatalf("status %d, want 200", w.Code)
		}
		doc := parse(t, w.Body.String())
		one(t, doc, byTestID("home"))
		if n := doc.Find(byTestID("thread-link")).Length(); n != 0 {
			t.Errorf("%d links", n)
		}
	})

	t.Run("thread page", func(t *testing.T) {
		st := newFakeStore(snapA, snapB)
		doc := page(t, st, "/t/thr_one", http.StatusOK)
		root := one(t, doc, byTestID("thread"))
		if root.AttrOr("data-thread-id", "") != "thr_one" {
			t.Errorf("data-thread-id = %q", root.AttrOr("data-thread-id", ""))
		}
		if n := doc.Find(byTestID("message")).Length(); n != len(snapA.Messages) {
			t.Errorf("%d messages, want %d", n, len(snapA.Messages))
		}
		if got := snapshotJSON(t, doc); !reflect.DeepEqual(got, snapA) {
			t.Errorf("snapshot JSON:\n got %+v\nwant %+v", got, snapA)
		}
		cur := doc.Find(`[data-testid="thread-link"][aria-current="page"]`)
		if cur.Length() != 1 || cur.AttrOr("href", "") != "/t/thr_one" {
			t.Errorf("current link: %d, href %q", cur.Length(), cur.AttrOr("href", ""))
		}
		// Inline scripts would be blocked by the CSP: the only scripts are
		// the external module and the JSON data block.
		doc.Find("script").Each(func(i int, s *goquery.Selection) {
			typ := s.AttrOr("type", "")
			switch {
			case typ == "application/json":
			case hasAttr(s, "src") && strings.TrimSpace(s.Text()) == "":
			default:
				t.Errorf("script %d (type %q) would need 'unsafe-inline'", i, typ)
			}
		})
		if n := doc.Find("[style]").Length(); n != 0 {
			t.Errorf("%d inline style attributes (CSP style-src 'self' blocks them)", n)
		}
		if n := doc.Find("style").Length(); n != 0 {
			t.Errorf("%d <style> elements (CSP style-src 'self' blocks them)", n)
		}
	})

	t.Run("unknown thread is the 404 page", func(t *testing.T) {
		st := newFakeStore(snapA)
		doc := page(t, st, "/t/thr_missing", http.StatusNotFound)
		one(t, doc, byTestID("not-found"))
		if n := doc.Find(byTestID("thread-link")).Length(); n != 1 {
			t.Errorf("404 page sidebar has %d links, want 1", n)
		}
		if doc.Find(byTestID("thread")).Length() != 0 {
			t.Error("404 page renders a thread")
		}
	})

	t.Run("store failure is a 500 without details", func(t *testing.T) {
		st := newFakeStore(snapA)
		w := do(t, newServer(t, st), req{method: "GET", path: "/t/" + boomID})
		if w.Code != http.StatusInternalServerError {
			t.Fatalf("status %d, want 500", w.Code)
		}
		if strings.Contains(w.Body.String(), "disk on fire") {
			t.Errorf("500 body leaks the internal error: %q", w.Body)
		}
	})

	t.Run("create redirects to the new thread", func(t *testing.T) {
		st := newFakeStore(snapA)
		h := newServer(t, st)
		w := do(t, h, req{method: "POST", path: "/threads", form: url.Values{}, header: sameOrigin})
		if w.Code != http.StatusSeeOther {
			t.Fatalf("status %d, want 303: %s", w.Code, w.Body)
		}
		if got := w.Header().Get("Location"); got != "/t/thr_new1" {
			t.Errorf("Location = %q, want /t/thr_new1", got)
		}
		if len(st.created) != 1 || st.created[0] == "" {
			t.Errorf("created %q", st.created)
		}
		// Following the redirect shows the new, empty thread.
		w = do(t, h, req{method: "GET", path: "/t/thr_new1"})
		if w.Code != http.StatusOK {
			t.Fatalf("GET new thread: %d", w.Code)
		}
		doc := parse(t, w.Body.String())
		if got := one(t, doc, byTestID("thread")).AttrOr("data-thread-id", ""); got != "thr_new1" {
			t.Errorf("data-thread-id = %q", got)
		}
		// A plain form post without fetch metadata (old browser, curl) is
		// allowed too.
		w = do(t, h, req{method: "POST", path: "/threads", form: url.Values{}})
		if w.Code != http.StatusSeeOther {
			t.Errorf("post without Sec-Fetch-Site/Origin: %d, want 303", w.Code)
		}
	})

	t.Run("rename", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			title string
			saved string
		}{
			{"plain", "Lisbon in May", "Lisbon in May"},
			{"trimmed", "  spaced out \n", "spaced out"},
			{"markup", `<script>alert(1)</script>`, `<script>alert(1)</script>`},
			{"200 bytes", strings.Repeat("a", 200), strings.Repeat("a", 200)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				st := newFakeStore(snapA)
				h := newServer(t, st)
				w := do(t, h, req{method: "POST", path: "/t/thr_one/rename", form: url.Values{"title": {tc.title}}, header: sameOrigin})
				if w.Code != http.StatusSeeOther {
					t.Fatalf("status %d, want 303: %s", w.Code, w.Body)
				}
				if got := w.Header().Get("Location"); got != "/t/thr_one" {
					t.Errorf("Location = %q, want /t/thr_one", got)
				}
				if want := []renameCall{{"thr_one", tc.saved}}; !reflect.DeepEqual(st.renames, want) {
					t.Errorf("store saw %q, want %q", st.renames, want)
				}
				// The new title is shown, as text.
				doc := parse(t, do(t, h, req{method: "GET", path: "/t/thr_one"}).Body.String())
				if got := one(t, doc, byTestID("title-input")).AttrOr("value", ""); got != tc.saved {
					t.Errorf("title input after rename = %q, want %q", got, tc.saved)
				}
				if n := doc.Find("script").Length(); n != 2 {
					t.Errorf("%d scripts after rename", n)
				}
			})
		}

		for _, tc := range []struct {
			name string
			form url.Values
		}{
			{"empty", url.Values{"title": {""}}},
			{"blank", url.Values{"title": {" \t\n "}}},
			{"missing", url.Values{}},
			{"201 bytes", url.Values{"title": {strings.Repeat("a", 201)}}},
			{"invalid utf-8", url.Values{"title": {"ab\xffcd"}}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				st := newFakeStore(snapA)
				w := do(t, newServer(t, st), req{method: "POST", path: "/t/thr_one/rename", form: tc.form, header: sameOrigin})
				if w.Code != http.StatusBadRequest {
					t.Fatalf("status %d, want 400", w.Code)
				}
				if _, n := st.counts(); n != 0 {
					t.Errorf("store saw %d renames: %q", n, st.renames)
				}
				if st.snaps["thr_one"].Title != snapA.Title {
					t.Errorf("title changed to %q", st.snaps["thr_one"].Title)
				}
			})
		}

		t.Run("unknown thread", func(t *testing.T) {
			st := newFakeStore(snapA)
			w := do(t, newServer(t, st), req{method: "POST", path: "/t/thr_missing/rename", form: url.Values{"title": {"x"}}, header: sameOrigin})
			if w.Code != http.StatusNotFound {
				t.Fatalf("status %d, want 404", w.Code)
			}
			one(t, parse(t, w.Body.String()), byTestID("not-found"))
		})

		t.Run("store failure", func(t *testing.T) {
			st := newFakeStore(snapA)
			w := do(t, newServer(t, st), req{method: "POST", path: "/t/" + boomID + "/rename", form: url.Values{"title": {"x"}}, header: sameOrigin})
			if w.Code != http.StatusInternalServerError {
				t.Fatalf("status %d, want 500", w.Code)
			}
		})
	})

	t.Run("cross-origin posts are refused", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			header map[string]string
		}{
			{"sec-fetch-site cross-site", map[string]string{"Sec-Fetch-Site": "cross-site"}},
			{"sec-fetch-site same-site", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "http://sub.example.com"}},
			{"origin of another host", map[string]string{"Origin": "https://evil.example"}},
			{"origin of another port", map[string]string{"Origin": "http://example.com:8081"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				st := newFakeStore(snapA)
				h := newServer(t, st)
				w := do(t, h, req{method: "POST", path: "/threads", form: url.Values{}, header: tc.header})
				if w.Code != http.StatusForbidden {
					t.Errorf("create: status %d, want 403", w.Code)
				}
				w = do(t, h, req{method: "POST", path: "/t/thr_one/rename", form: url.Values{"title": {"pwned"}}, header: tc.header})
				if w.Code != http.StatusForbidden {
					t.Errorf("rename: status %d, want 403", w.Code)
				}
				if c, r := st.counts(); c != 0 || r != 0 {
					t.Errorf("store saw %d creates, %d renames", c, r)
				}
				if st.snaps["thr_one"].Title != snapA.Title {
					t.Errorf("title changed to %q", st.snaps["thr_one"].Title)
				}
			})
		}
	})

	t.Run("static files", func(t *testing.T) {
		h := newServer(t, newFakeStore())
		for _, name := range []string{"app.js", "app.css"} {
			w := do(t, h, req{method: "GET", path: static.Path(name)})
			if w.Code != http.StatusOK {
				t.Fatalf("GET %s: status %d, want 200", static.Path(name), w.Code)
			}
			if cc := w.Header().Get("Cache-Control"); !strings.Contains(cc, "immutable") || !strings.Contains(cc, "max-age=") {
				t.Errorf("%s Cache-Control = %q, want immutable with max-age", name, cc)
			}
			if w.Body.Len() == 0 {
				t.Errorf("%s is empty", name)
			}
		}
		if ct := do(t, h, req{method: "GET", path: static.Path("app.js")}).Header().Get("Content-Type"); !strings.Contains(ct, "javascript") {
			t.Errorf("app.js Content-Type = %q", ct)
		}
		for _, p := range []string{
			"/static/000000000000/app.js",
			strings.Replace(static.Path("app.js"), "/static/", "/static/x", 1),
			static.Path("nope.js"),
			static.Path(""),
		} {
			if w := do(t, h, req{method: "GET", path: p}); w.Code != http.StatusNotFound {
				t.Errorf("GET %s: status %d, want 404", p, w.Code)
			}
		}
	})

	t.Run("method and path mismatches", func(t *testing.T) {
		h := newServer(t, newFakeStore(snapA))
		if w := do(t, h, req{method: "GET", path: "/threads"}); w.Code != http.StatusMethodNotAllowed {
			t.Errorf("GET /threads: %d, want 405", w.Code)
		}
		if w := do(t, h, req{method: "GET", path: "/t/thr_one/rename"}); w.Code != http.StatusMethodNotAllowed {
			t.Errorf("GET rename: %d, want 405", w.Code)
		}
		if w := do(t, h, req{method: "POST", path: "/t/thr_one", form: url.Values{}}); w.Code != http.StatusMethodNotAllowed {
			t.Errorf("POST thread: %d, want 405", w.Code)
		}
	})
}
