package web

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/honestcancel/gateway/chat"
)

// multipartBody streams a multipart/form-data body of about size bytes
// (one "title" field and one file part of filler) without holding it in
// memory.
type multipartBody struct {
	head, tail []byte
	filler     int64 // bytes of the file part still to send
}

const testBoundary = "gatewaytestboundary"

func newMultipartBody(size int64) *multipartBody {
	head := []byte("--" + testBoundary + "\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\npwned\r\n" +
		"--" + testBoundary + "\r\nContent-Disposition: form-data; name=\"upload\"; filename=\"big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n")
	tail := []byte("\r\n--" + testBoundary + "--\r\n")
	return &multipartBody{head: head, tail: tail, filler: max(0, size-int64(len(head)+len(tail)))}
}

func (m *multipartBody) Len() int64 { return int64(len(m.head)+len(m.tail)) + m.filler }

func (m *multipartBody) Read(p []byte) (int, error) {
	switch {
	case len(m.head) > 0:
		n := copy(p, m.head)
		m.head = m.head[n:]
		return n, nil
	case m.filler > 0:
		n := int(min(int64(len(p)), m.filler))
		for i := range p[:n] {
			p[i] = 'x'
		}
		m.filler -= int64(n)
		return n, nil
	case len(m.tail) > 0:
		n := copy(p, m.tail)
		m.tail = m.tail[n:]
		return n, nil
	}
	return 0, io.EOF
}

// countingLimiter allows the first allow commands, then refuses each as
// the gateway does; it records whom it charged.
type countingLimiter struct {
	mu      sync.Mutex
	allow   int
	charged []string
}

func (l *countingLimiter) ChargeCommand(userID string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.charged = append(l.charged, userID)
	if len(l.charged) > l.allow {
		return chat.Errorf(chat.CodeRateLimited, "too many commands from your account: wait 3 s and retry this one").With("retry_after_seconds", 3)
	}
	return nil
}

func (l *countingLimiter) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.charged)
}

// rawPost sends a POST with the given content type and body (length -1:
// unknown, sent chunked) to h.
func rawPost(t *testing.T, h http.Handler, path, contentType string, body io.Reader, length int64) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, path, body)
	r.ContentLength = length
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// wantRefusedPage checks a FormRefused answer: status, the page, its code.
func wantRefusedPage(t *testing.T, w *httptest.ResponseRecorder, status int, code string) *httptest.ResponseRecorder {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d: %.300s", w.Code, status, w.Body)
	}
	checkPageHeaders(t, w)
	doc := parse(t, w.Body.String())
	page := one(t, doc, byTestID("form-refused"))
	if got := page.AttrOr("data-error", ""); got != code {
		t.Errorf("data-error %q, want %q", got, code)
	}
	if strings.TrimSpace(page.Find(`[role="alert"]`).Text()) == "" {
		t.Error("the refusal says nothing")
	}
	return w
}

// emptyDir fails unless dir holds nothing.
func emptyDir(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		info, _ := e.Info()
		t.Errorf("left in the temporary folder: %s (%d bytes)", e.Name(), info.Size())
	}
}

// Every form route refuses bodies that are not short and URL-encoded
// before it acts: 415 before reading a multipart (or any other) body, 413
// past 16 KiB. Nothing changes, nothing is written to the temporary
// folder, and the refusal is a page saying why.
func TestFormBodiesRefused(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // where ParseMultipartForm would spill

	big := url.Values{"title": {strings.Repeat("a", 17<<10)}}.Encode()
	attacks := []struct {
		name        string
		contentType string
		body        func() (io.Reader, int64)
		status      int
	}{
		// Over the 32 MiB ParseMultipartForm keeps in memory: it would spill.
		{"multipart 40 MiB", "multipart/form-data; boundary=" + testBoundary, func() (io.Reader, int64) { m := newMultipartBody(40 << 20); return m, m.Len() }, http.StatusUnsupportedMediaType},
		{"multipart 40 MiB chunked", "multipart/form-data; boundary=" + testBoundary, func() (io.Reader, int64) { return newMultipartBody(40 << 20), -1 }, http.StatusUnsupportedMediaType},
		{"multipart small", "multipart/form-data; boundary=" + testBoundary, func() (io.Reader, int64) { m := newMultipartBody(0); return m, m.Len() }, http.StatusUnsupportedMediaType},
		{"multipart in capitals", "Multipart/Form-Data; boundary=" + testBoundary, func() (io.Reader, int64) { m := newMultipartBody(0); return m, m.Len() }, http.StatusUnsupportedMediaType},
		{"17 KiB URL-encoded", formType, func() (io.Reader, int64) { return strings.NewReader(big), int64(len(big)) }, http.StatusRequestEntityTooLarge},
		{"17 KiB URL-encoded chunked", formType, func() (io.Reader, int64) { return strings.NewReader(big), -1 }, http.StatusRequestEntityTooLarge},
		{"text/plain", "text/plain", func() (io.Reader, int64) { return strings.NewReader("title=pwned"), 11 }, http.StatusUnsupportedMediaType},
		{"JSON", "application/json", func() (io.Reader, int64) { return strings.NewReader(`{"title":"pwned"}`), 17 }, http.StatusUnsupportedMediaType},
		{"no type, with a body", "", func() (io.Reader, int64) { return strings.NewReader("title=pwned"), 11 }, http.StatusUnsupportedMediaType},
		{"malformed type", "application/x-www-form-urlencoded; =", func() (io.Reader, int64) { return strings.NewReader("title=pwned"), 11 }, http.StatusUnsupportedMediaType},
	}
	routes := []string{"/threads", "/t/thr_one/rename", "/login", "/logout"}
	for _, route := range routes {
		for _, a := range attacks {
			t.Run(route+"/"+a.name, func(t *testing.T) {
				st := newFakeStore(sampleSnapshot())
				limits := &countingLimiter{allow: 1000}
				mux := http.NewServeMux()
				New(st, nil, limits, nil).Routes(mux)
				body, n := a.body()
				w := wantRefusedPage(t, rawPost(t, mux, route, a.contentType, body, n), a.status, chat.CodeInvalidRequest)
				if a.status == http.StatusUnsupportedMediaType {
					if got := w.Header().Get("Accept-Post"); got != formType {
						t.Errorf("Accept-Post %q, want %q", got, formType)
					}
					if limits.count() != 0 {
						t.Errorf("a body refused unread was charged %d commands", limits.count())
					}
				}
				if c, r := st.counts(); c != 0 || r != 0 {
					t.Errorf("store saw %d creates and %d renames", c, r)
				}
				if got := st.snaps["thr_one"].Title; got != sampleSnapshot().Title {
					t.Errorf("title changed to %q", got)
				}
				emptyDir(t, tmp)
			})
		}
	}
}

// What a browser sends is taken: URL-encoded with or without a charset,
// and an empty post without a type.
func TestFormBodiesAccepted(t *testing.T) {
	st := newFakeStore(sampleSnapshot())
	h := newServer(t, st)
	for _, ct := range []string{formType, formType + "; charset=UTF-8", "Application/X-WWW-Form-Urlencoded"} {
		w := rawPost(t, h, "/t/thr_one/rename", ct, strings.NewReader("title=Lisbon"), 12)
		if w.Code != http.StatusSeeOther {
			t.Errorf("%s: status %d, want 303: %s", ct, w.Code, w.Body)
		}
	}
	if w := rawPost(t, h, "/threads", "", http.NoBody, 0); w.Code != http.StatusSeeOther {
		t.Errorf("empty post without a type: status %d, want 303", w.Code)
	}
	// Just under the limit is read (and then judged on its fields).
	almost := "title=x&pad=" + strings.Repeat("p", maxFormBytes-len("title=x&pad="))
	if w := rawPost(t, h, "/t/thr_one/rename", formType, strings.NewReader(almost), int64(len(almost))); w.Code != http.StatusSeeOther {
		t.Errorf("a %d-byte form: status %d, want 303", len(almost), w.Code)
	}
}

// A field given twice, or a title the chat rules refuse, is a 400 page
// naming the problem; nothing changes.
func TestFormFieldsRefused(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"title twice", "title=a&title=b", `"title" more than once`},
		{"line break", "title=" + url.QueryEscape("two\nlines"), "U+000A"},
		{"tab", "title=" + url.QueryEscape("tab\there"), "U+0009"},
		{"NUL", "title=a%00b", "U+0000"},
		{"escape sequence", "title=" + url.QueryEscape("\x1b[31mred"), "U+001B"},
		{"DEL", "title=del%7F", "U+007F"},
		{"bidi override", "title=" + url.QueryEscape("invoice\u202efdp.exe"), "U+202E"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newFakeStore(sampleSnapshot())
			w := rawPost(t, newServer(t, st), "/t/thr_one/rename", formType, strings.NewReader(tc.body), int64(len(tc.body)))
			wantRefusedPage(t, w, http.StatusBadRequest, chat.CodeInvalidRequest)
			if msg := parse(t, w.Body.String()).Find(`[role="alert"]`).Text(); !strings.Contains(msg, tc.want) || !strings.Contains(msg, "title") {
				t.Errorf("message %q does not name the field and %q", msg, tc.want)
			}
			if _, n := st.counts(); n != 0 {
				t.Errorf("store saw %d renames", n)
			}
		})
	}
}

// The forms that change conversations are charged to the user's command
// budget; over it they are a 429 page with Retry-After, and change
// nothing. Sign-in and sign-out are not charged.
func TestFormsChargedToTheCommandBudget(t *testing.T) {
	st := newFakeStore(sampleSnapshot())
	limits := &countingLimiter{allow: 2}
	mux := http.NewServeMux()
	New(st, nil, limits, nil).Routes(mux)
	post := func(path, body string) *httptest.ResponseRecorder {
		return rawPost(t, mux, path, formType, strings.NewReader(body), int64(len(body)))
	}
	if w := post("/threads", ""); w.Code != http.StatusSeeOther {
		t.Fatalf("first create: %d", w.Code)
	}
	if w := post("/t/thr_one/rename", "title=first"); w.Code != http.StatusSeeOther {
		t.Fatalf("first rename: %d", w.Code)
	}
	for _, tc := range []struct{ path, body string }{{"/threads", ""}, {"/t/thr_one/rename", "title=second"}} {
		w := wantRefusedPage(t, post(tc.path, tc.body), http.StatusTooManyRequests, chat.CodeRateLimited)
		if got := w.Header().Get("Retry-After"); got != "3" {
			t.Errorf("%s: Retry-After %q, want 3", tc.path, got)
		}
	}
	if c, r := st.counts(); c != 1 || r != 1 {
		t.Errorf("store saw %d creates and %d renames, want 1 and 1", c, r)
	}
	if got := st.snaps["thr_one"].Title; got != "first" {
		t.Errorf("title %q, want first", got)
	}
	for _, path := range []string{"/login", "/logout"} {
		if w := post(path, ""); w.Code != http.StatusSeeOther {
			t.Errorf("%s over the budget: status %d, want 303 (never charged)", path, w.Code)
		}
	}
	charged := fmt.Sprint(limits.charged)
	if want := fmt.Sprint([]string{chat.LocalUserID, chat.LocalUserID, chat.LocalUserID, chat.LocalUserID}); charged != want {
		t.Errorf("charged %s, want %s", charged, want)
	}
}

// The refusal page escapes what it shows.
func TestFormRefusedEscapes(t *testing.T) {
	doc, raw := render(t, FormRefused(Refusal{Code: "x\"><b>", Message: "<script>alert(1)</script>"}))
	if strings.Contains(raw, "<script>alert") || strings.Contains(raw, "<b>") {
		t.Errorf("unescaped: %s", raw)
	}
	if got := one(t, doc, byTestID("form-refused")).Find(`[role="alert"]`).Text(); got != "<script>alert(1)</script>" {
		t.Errorf("message %q", got)
	}
}
