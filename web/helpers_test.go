// Shared helpers for the web package's tests: rendering a component and
// querying its HTML, a sample snapshot, and a fake store behind a test
// server whose pages are fetched and checked.

package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/a-h/templ"

	"github.com/honestcancel/gateway/chat"
)

// ---------------------------------------------------------------------------
// helpers

// render renders c into a buffer and parses it.
func render(t *testing.T, c templ.Component) (*goquery.Document, string) {
	t.Helper()
	var buf bytes.Buffer
	if err := c.Render(context.Background(), &buf); err != nil {
		t.Fatalf("render: %v", err)
	}
	raw := buf.String()
	doc, err := goquery.NewDocumentFromReader(strings.NewReader(raw))
	if err != nil {
		t.Fatalf("parse html: %v", err)
	}
	return doc, raw
}

func parse(t *testing.T, body string) *goquery.Document {
	t.Helper()
	doc, err := goquery.NewDocumentFromReader(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse html: %v", err)
	}
	return doc
}

func byTestID(id string) string { return `[data-testid="` + id + `"]` }

// one returns the single element matching sel, failing otherwise.
func one(t *testing.T, doc *goquery.Document, sel string) *goquery.Selection {
	t.Helper()
	s := doc.Find(sel)
	if s.Length() != 1 {
		t.Fatalf("%s: found %d elements, want 1", sel, s.Length())
	}
	return s
}

func attr(t *testing.T, s *goquery.Selection, name string) string {
	t.Helper()
	v, ok := s.Attr(name)
	if !ok {
		t.Fatalf("attribute %s missing on <%s>", name, goquery.NodeName(s))
	}
	return v
}

func hasAttr(s *goquery.Selection, name string) bool {
	_, ok := s.Attr(name)
	return ok
}

func ptr[T any](v T) *T { return &v }

var t0 = time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)

func sampleSnapshot() chat.Snapshot {
	return chat.Snapshot{
		ThreadID:         "thr_one",
		Title:            "Trip planning",
		StateVersion:     7,
		HeadCheckpointID: "cp_head",
		LastSeq:          42,
		Messages: []chat.Message{
			{MessageID: "msg_1", ThreadID: "thr_one", Role: chat.RoleUser, Kind: chat.KindText, Content: "Plan a trip to Lisbon", StateVersion: 1, CheckpointID: "cp_1", CreatedAt: t0},
			{MessageID: "msg_2", ThreadID: "thr_one", Role: chat.RoleAssistant, Kind: chat.KindText, Content: "Sure — how many days?", StateVersion: 2, CheckpointID: "cp_2", RunID: ptr("run_1"), CreatedAt: t0.Add(time.Second)},
			{MessageID: "msg_3", ThreadID: "thr_one", Role: chat.RoleTool, Kind: chat.KindCard, Content: `{"tool":"search","results":[{"title":"Belém","score":0.9}]}`, StateVersion: 3, CheckpointID: "cp_3", RunID: ptr("run_2"), CreatedAt: t0.Add(2 * time.Second)},
			{MessageID: "msg_4", ThreadID: "thr_one", Role: chat.RoleAssistant, Kind: chat.KindFragment, Content: "Day 1: Alfama, then", StateVersion: 4, CheckpointID: "cp_4", RunID: ptr("run_2"), FragmentOf: &chat.FragmentOf{RunID: "run_2", MessageID: "msg_x", LastSeq: 40}, CreatedAt: t0.Add(3 * time.Second)},
			{MessageID: "msg_5", ThreadID: "thr_one", Role: chat.RoleUser, Kind: chat.KindText, Content: "Go on", StateVersion: 5, CheckpointID: "cp_5", CreatedAt: t0.Add(4 * time.Second)},
		},
		ActiveRun: &chat.ActiveRun{RunID: "run_3", Status: chat.RunRunning, MessageID: ptr("msg_6"), PartialText: "Day 2", LastSeq: 42},
	}
}

// snapshotJSON decodes the <script id="snapshot"> of doc.
func snapshotJSON(t *testing.T, doc *goquery.Document) chat.Snapshot {
	t.Helper()
	s := one(t, doc, "script#snapshot")
	if got := attr(t, s, "type"); got != "application/json" {
		t.Fatalf("snapshot script type = %q, want application/json", got)
	}
	var got chat.Snapshot
	dec := json.NewDecoder(strings.NewReader(s.Text()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decode snapshot JSON %q: %v", s.Text(), err)
	}
	return got
}

// ---------------------------------------------------------------------------
// HTTP

// boomID makes every fakeStore method fail with an internal error.
const boomID = "thr_boom"

type renameCall struct{ threadID, title string }

// fakeStore is an in-memory Store that can misbehave: unknown ids are
// chat.NotFound, boomID is an internal error, listErr fails the list.
type fakeStore struct {
	mu      sync.Mutex
	order   []string
	snaps   map[string]chat.Snapshot
	created []string // titles passed to CreateThread
	renames []renameCall
	listErr error
	next    int
	users   map[string]bool // user ids seen
	window  [2]int64        // the limit and size SnapshotLatest was last asked for
}

func newFakeStore(snaps ...chat.Snapshot) *fakeStore {
	f := &fakeStore{snaps: map[string]chat.Snapshot{}, users: map[string]bool{}}
	for _, s := range snaps {
		f.order = append(f.order, s.ThreadID)
		f.snaps[s.ThreadID] = s
	}
	return f
}

func (f *fakeStore) ListThreads(_ context.Context, userID string, limit int, cursor, search string) ([]chat.Thread, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.users[userID] = true
	if f.listErr != nil {
		return nil, "", f.listErr
	}
	if limit <= 0 || cursor != "" {
		return nil, "", chat.Invalid("bad page: limit %d cursor %q", limit, cursor)
	}
	var out []chat.Thread
	for _, id := range f.order {
		if len(out) == limit {
			break
		}
		s := f.snaps[id]
		out = append(out, chat.Thread{ThreadID: s.ThreadID, Title: s.Title, StateVersion: s.StateVersion, LastSeq: s.LastSeq})
	}
	return out, "", nil
}

// SnapshotLatest answers the snapshot as it was given (a test that needs
// earlier messages left out says so in it) and records the window asked
// for.
func (f *fakeStore) SnapshotLatest(_ context.Context, userID, threadID string, limit int, maxBytes int64) (chat.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.users[userID] = true
	f.window = [2]int64{int64(limit), maxBytes}
	if threadID == boomID {
		return chat.Snapshot{}, errors.New("disk on fire")
	}
	s, ok := f.snaps[threadID]
	if !ok {
		return chat.Snapshot{}, chat.NotFound("thread", threadID)
	}
	return s, nil
}

func (f *fakeStore) CreateThread(_ context.Context, userID, title string) (chat.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.users[userID] = true
	f.next++
	id := "thr_new" + string(rune('0'+f.next))
	s := chat.Snapshot{ThreadID: id, Title: title, Messages: []chat.Message{}}
	f.snaps[id] = s
	f.order = append([]string{id}, f.order...)
	f.created = append(f.created, title)
	return s, nil
}

func (f *fakeStore) RenameThread(_ context.Context, userID, threadID, title string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.users[userID] = true
	if threadID == boomID {
		return errors.New("disk on fire")
	}
	s, ok := f.snaps[threadID]
	if !ok {
		return chat.NotFound("thread", threadID)
	}
	s.Title = title
	f.snaps[threadID] = s
	f.renames = append(f.renames, renameCall{threadID, title})
	return nil
}

func (f *fakeStore) counts() (created, renamed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.created), len(f.renames)
}

func newServer(t *testing.T, st *fakeStore) http.Handler {
	t.Helper()
	mux := http.NewServeMux()
	New(st, nil, nil, nil).Routes(mux)
	return mux
}

// page GETs path from a server on st, checks its status is want and its
// headers are a page's, and returns it parsed.
func page(t *testing.T, st *fakeStore, path string, want int) *goquery.Document {
	t.Helper()
	w := do(t, newServer(t, st), req{method: "GET", path: path})
	if w.Code != want {
		t.Fatalf("GET %s: status %d, want %d: %s", path, w.Code, want, w.Body)
	}
	checkPageHeaders(t, w)
	return parse(t, w.Body.String())
}

func checkPageHeaders(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	h := w.Header()
	if got := h.Get("Content-Type"); got != "text/html; charset=utf-8" {
		t.Errorf("Content-Type = %q", got)
	}
	if got := h.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options = %q, want nosniff", got)
	}
	csp := h.Get("Content-Security-Policy")
	if csp == "" {
		t.Fatal("no Content-Security-Policy")
	}
	directives := map[string]string{}
	for _, d := range strings.Split(csp, ";") {
		d = strings.TrimSpace(d)
		name, val, _ := strings.Cut(d, " ")
		directives[name] = val
	}
	script, ok := directives["script-src"]
	if !ok {
		t.Errorf("CSP %q has no script-src", csp)
	}
	for _, bad := range []string{"'unsafe-inline'", "'unsafe-eval'", "*", "data:"} {
		if strings.Contains(script, bad) {
			t.Errorf("CSP script-src %q allows %s", script, bad)
		}
	}
	if !strings.Contains(directives["frame-ancestors"], "'none'") {
		t.Errorf("CSP %q lacks frame-ancestors 'none'", csp)
	}
	if got := h.Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", got)
	}
	if got := h.Get("Cross-Origin-Opener-Policy"); got != "same-origin" {
		t.Errorf("Cross-Origin-Opener-Policy = %q, want same-origin", got)
	}
	pp := h.Get("Permissions-Policy")
	for _, feature := range []string{"camera=()", "microphone=()", "geolocation=()"} {
		if !strings.Contains(pp, feature) {
			t.Errorf("Permissions-Policy %q lacks %s", pp, feature)
		}
	}
}
