package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/a-h/templ"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/static"
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
// components

func TestThreadPageRendersSnapshot(t *testing.T) {
	snap := sampleSnapshot()
	links := []ThreadLink{{ID: "thr_other", Title: "Other"}, {ID: "thr_one", Title: "Trip planning"}}
	doc, _ := render(t, ThreadPage(snap, links))

	root := one(t, doc, byTestID("thread"))
	if got := attr(t, root, "data-thread-id"); got != snap.ThreadID {
		t.Errorf("data-thread-id = %q, want %q", got, snap.ThreadID)
	}
	if got := attr(t, root, "data-state-version"); got != "7" {
		t.Errorf("data-state-version = %q, want 7", got)
	}
	if got := attr(t, root, "data-last-seq"); got != "42" {
		t.Errorf("data-last-seq = %q, want 42", got)
	}

	// Every message, in order, with its id, role and kind.
	msgs := root.Find(byTestID("messages") + " > " + byTestID("message"))
	if msgs.Length() != len(snap.Messages) {
		t.Fatalf("rendered %d messages, want %d", msgs.Length(), len(snap.Messages))
	}
	msgs.Each(func(i int, s *goquery.Selection) {
		want := snap.Messages[i]
		if goquery.NodeName(s) != "li" {
			t.Errorf("message %d is <%s>, want <li>", i, goquery.NodeName(s))
		}
		for name, w := range map[string]string{"data-message-id": want.MessageID, "data-role": want.Role, "data-kind": want.Kind} {
			if got := attr(t, s, name); got != w {
				t.Errorf("message %d %s = %q, want %q", i, name, got, w)
			}
		}
		body := s.Find(byTestID("message-body"))
		if body.Length() != 1 {
			t.Fatalf("message %d: %d bodies, want 1", i, body.Length())
		}
		if got := body.Text(); got != want.Content {
			t.Errorf("message %d body = %q, want %q", i, got, want.Content)
		}
		isFragment := want.Kind == chat.KindFragment
		if n := s.Find(byTestID("fragment-label")).Length(); (n == 1) != isFragment || n > 1 {
			t.Errorf("message %d (%s): %d fragment labels", i, want.Kind, n)
		}
		if n := s.Find(byTestID("delete-draft")).Length(); (n == 1) != isFragment || n > 1 {
			t.Errorf("message %d (%s): %d delete-draft buttons", i, want.Kind, n)
		}
		isCard := want.Kind == chat.KindCard
		if got := goquery.NodeName(body); (got == "pre") != isCard {
			t.Errorf("message %d (%s): body is <%s>", i, want.Kind, got)
		}
		for _, c := range []string{"msg", "role-" + want.Role, "kind-" + want.Kind} {
			if !s.HasClass(c) {
				t.Errorf("message %d: class %q missing (class=%q)", i, c, s.AttrOr("class", ""))
			}
		}
	})

	// The fragment: label and a Delete draft button carrying its id.
	frag := one(t, doc, `[data-testid="message"][data-kind="fragment"]`)
	if got := strings.TrimSpace(frag.Find(byTestID("fragment-label")).Text()); got != "Saved fragment" {
		t.Errorf("fragment label = %q, want %q", got, "Saved fragment")
	}
	del := frag.Find(byTestID("delete-draft"))
	if got := strings.TrimSpace(del.Text()); got != "Delete fragment" {
		t.Errorf("delete button text = %q", got)
	}
	if got := attr(t, del, "data-message-id"); got != "msg_4" {
		t.Errorf("delete button data-message-id = %q, want msg_4", got)
	}
	if got := attr(t, del, "type"); got != "button" {
		t.Errorf("delete button type = %q, want button (it must not submit a form)", got)
	}
	if got := attr(t, del, "data-action"); got != "delete-draft" {
		t.Errorf("delete button data-action = %q", got)
	}

	// The card: its JSON in a <pre>, still valid JSON as text.
	card := one(t, doc, `[data-testid="message"][data-kind="card"] pre`)
	var cardJSON map[string]any
	if err := json.Unmarshal([]byte(card.Text()), &cardJSON); err != nil {
		t.Errorf("card <pre> text is not the JSON: %v (%q)", err, card.Text())
	}

	// Composer, Send, hidden Cancel, hidden conflict banner, status.
	composer := one(t, doc, byTestID("composer"))
	if goquery.NodeName(composer) != "form" {
		t.Errorf("composer is <%s>, want <form>", goquery.NodeName(composer))
	}
	input := one(t, doc, byTestID("composer-input"))
	if goquery.NodeName(input) != "textarea" || attr(t, input, "id") != "composer-input" {
		t.Errorf("composer input: <%s id=%q>", goquery.NodeName(input), input.AttrOr("id", ""))
	}
	if one(t, doc, `label[for="composer-input"]`).Length() != 1 {
		t.Error("composer input has no label")
	}
	send := one(t, doc, byTestID("send"))
	if attr(t, send, "type") != "submit" || strings.TrimSpace(send.Text()) != "Send" || hasAttr(send, "hidden") {
		t.Errorf("send button: type=%q text=%q hidden=%v", send.AttrOr("type", ""), send.Text(), hasAttr(send, "hidden"))
	}
	if composer.Find(byTestID("send")).Length() != 1 || composer.Find(byTestID("cancel")).Length() != 1 {
		t.Error("send and cancel should be inside the composer")
	}
	cancel := one(t, doc, byTestID("cancel"))
	if attr(t, cancel, "type") != "button" || !hasAttr(cancel, "hidden") || strings.TrimSpace(cancel.Text()) != "Cancel" {
		t.Errorf("cancel button: type=%q hidden=%v text=%q", cancel.AttrOr("type", ""), hasAttr(cancel, "hidden"), cancel.Text())
	}
	banner := one(t, doc, byTestID("conflict-banner"))
	if !hasAttr(banner, "hidden") {
		t.Error("conflict banner should be hidden on first paint")
	}
	if banner.Find(byTestID("conflict-reload")).Length() != 1 || banner.Find(byTestID("conflict-fork")).Length() != 1 {
		t.Error("conflict banner lacks its Reload / Fork buttons")
	}
	conn := one(t, doc, byTestID("conn-status"))
	if attr(t, conn, "role") != "status" || attr(t, conn, "data-state") != "connecting" {
		t.Errorf("conn status: role=%q data-state=%q", conn.AttrOr("role", ""), conn.AttrOr("data-state", ""))
	}

	// Rename form posts to /t/{id}/rename with the current title.
	rename := one(t, doc, "form.rename")
	if got := attr(t, rename, "action"); got != "/t/thr_one/rename" {
		t.Errorf("rename action = %q", got)
	}
	if got := strings.ToLower(attr(t, rename, "method")); got != "post" {
		t.Errorf("rename method = %q", got)
	}
	if got := attr(t, one(t, doc, byTestID("title-input")), "value"); got != snap.Title {
		t.Errorf("title input value = %q, want %q", got, snap.Title)
	}

	// The snapshot JSON decodes back to the snapshot, inside the thread root.
	if root.Find("script#snapshot").Length() != 1 {
		t.Error("snapshot script is not inside the thread root")
	}
	if got := snapshotJSON(t, doc); !reflect.DeepEqual(got, snap) {
		t.Errorf("snapshot JSON round trip:\n got %+v\nwant %+v", got, snap)
	}

	// Page title names the thread.
	if got := doc.Find("head title").Text(); !strings.HasPrefix(got, snap.Title) {
		t.Errorf("<title> = %q, want it to start with %q", got, snap.Title)
	}
}

func TestThreadPageEmptySnapshot(t *testing.T) {
	snap := chat.Snapshot{ThreadID: "thr_empty", Title: "New conversation", Messages: []chat.Message{}}
	doc, _ := render(t, ThreadPage(snap, nil))
	if n := doc.Find(byTestID("message")).Length(); n != 0 {
		t.Errorf("%d messages rendered for an empty thread", n)
	}
	one(t, doc, byTestID("messages"))
	root := one(t, doc, byTestID("thread"))
	if attr(t, root, "data-state-version") != "0" || attr(t, root, "data-last-seq") != "0" {
		t.Errorf("root versions: %q %q", root.AttrOr("data-state-version", ""), root.AttrOr("data-last-seq", ""))
	}
	if got := snapshotJSON(t, doc); !reflect.DeepEqual(got, snap) {
		t.Errorf("snapshot JSON round trip:\n got %+v\nwant %+v", got, snap)
	}
	if n := doc.Find(byTestID("thread-link")).Length(); n != 0 {
		t.Errorf("%d sidebar links with no threads", n)
	}
}

func TestThreadPageEscaping(t *testing.T) {
	const (
		scriptTag = `<script>alert(1)</script>`
		imgTag    = `"><img src=x onerror=alert(1)>`
		closer    = `</script><script>alert(2)</script>`
		comment   = `<!-- </script> -->`
		entity    = `&lt;b&gt; & <b>bold</b>`
	)
	title := scriptTag + imgTag + `'single'`
	snap := chat.Snapshot{
		ThreadID:     "thr_x",
		Title:        title,
		StateVersion: 3,
		LastSeq:      9,
		Messages: []chat.Message{
			{MessageID: "msg_a", ThreadID: "thr_x", Role: chat.RoleUser, Kind: chat.KindText, Content: scriptTag, CreatedAt: t0},
			{MessageID: "msg_b", ThreadID: "thr_x", Role: chat.RoleAssistant, Kind: chat.KindText, Content: imgTag, CreatedAt: t0},
			{MessageID: "msg_c", ThreadID: "thr_x", Role: chat.RoleAssistant, Kind: chat.KindFragment, Content: closer, CreatedAt: t0},
			{MessageID: "msg_d", ThreadID: "thr_x", Role: chat.RoleTool, Kind: chat.KindCard, Content: `{"html":"` + strings.ReplaceAll(closer, `"`, `\"`) + `"}` + comment, CreatedAt: t0},
			{MessageID: "msg_e", ThreadID: "thr_x", Role: chat.RoleUser, Kind: chat.KindText, Content: entity + "\u2028\u2029", CreatedAt: t0},
			// Attributes: a hostile message id must stay inside its attributes.
			{MessageID: `msg_f"` + imgTag, ThreadID: "thr_x", Role: chat.RoleAssistant, Kind: chat.KindFragment, Content: "frag", CreatedAt: t0},
		},
		ActiveRun: &chat.ActiveRun{RunID: "run_x", Status: chat.RunRunning, PartialText: closer},
	}
	links := []ThreadLink{{ID: "thr_x", Title: title}, {ID: "thr_y", Title: imgTag}}
	doc, raw := render(t, ThreadPage(snap, links))

	// No element came from user text.
	if n := doc.Find("img").Length(); n != 0 {
		t.Errorf("%d <img> elements in the page", n)
	}
	if n := doc.Find("b").Length(); n != 0 {
		t.Errorf("%d <b> elements in the page", n)
	}
	if n := doc.Find("[onerror]").Length(); n != 0 {
		t.Errorf("%d elements with onerror", n)
	}
	scripts := doc.Find("script")
	if scripts.Length() != 2 {
		t.Errorf("%d <script> elements, want 2 (module + snapshot)", scripts.Length())
		scripts.Each(func(i int, s *goquery.Selection) {
			h, _ := goquery.OuterHtml(s)
			t.Logf("script %d: %s", i, h)
		})
	}
	mod := one(t, doc, `head script[type="module"]`)
	if got := attr(t, mod, "src"); got != static.Path("app.js") {
		t.Errorf("module script src = %q, want %q", got, static.Path("app.js"))
	}
	if strings.TrimSpace(mod.Text()) != "" {
		t.Errorf("module script has inline content %q", mod.Text())
	}
	for _, bad := range []string{"<script>alert", "<img", "</script><script>", "<b>bold"} {
		if strings.Contains(raw, bad) {
			t.Errorf("raw HTML contains %q unescaped", bad)
		}
	}

	// User text reads back as text.
	msgs := doc.Find(byTestID("message"))
	if msgs.Length() != len(snap.Messages) {
		t.Fatalf("%d messages, want %d", msgs.Length(), len(snap.Messages))
	}
	msgs.Each(func(i int, s *goquery.Selection) {
		want := snap.Messages[i]
		if got := s.Find(byTestID("message-body")).Text(); got != want.Content {
			t.Errorf("message %d body text = %q, want %q", i, got, want.Content)
		}
		if got := s.AttrOr("data-message-id", ""); got != want.MessageID {
			t.Errorf("message %d data-message-id = %q, want %q", i, got, want.MessageID)
		}
	})
	del := one(t, doc, `[data-testid="message"][data-kind="fragment"]:last-child `+byTestID("delete-draft"))
	if got := del.AttrOr("data-message-id", ""); got != snap.Messages[5].MessageID {
		t.Errorf("delete-draft data-message-id = %q, want %q", got, snap.Messages[5].MessageID)
	}

	// Titles: <title>, the rename input and the sidebar.
	if got := doc.Find("head title").Text(); got != title+" · gateway" {
		t.Errorf("<title> = %q", got)
	}
	if got := attr(t, one(t, doc, byTestID("title-input")), "value"); got != title {
		t.Errorf("title input value = %q, want %q", got, title)
	}
	sideLinks := doc.Find(byTestID("thread-link"))
	if sideLinks.Length() != 2 {
		t.Fatalf("%d sidebar links, want 2", sideLinks.Length())
	}
	if got := sideLinks.Eq(0).Text(); got != title {
		t.Errorf("sidebar title 0 = %q, want %q", got, title)
	}
	if got := sideLinks.Eq(1).Text(); got != imgTag {
		t.Errorf("sidebar title 1 = %q, want %q", got, imgTag)
	}

	// The JSON script cannot be broken out of: all of it is one script's
	// text and decodes back to the snapshot, </script> content included.
	got := snapshotJSON(t, doc)
	if !reflect.DeepEqual(got, snap) {
		t.Errorf("snapshot JSON round trip:\n got %+v\nwant %+v", got, snap)
	}
	if txt := one(t, doc, "script#snapshot").Text(); strings.Contains(strings.ToLower(txt), "</script") || strings.Contains(txt, "<!--") {
		t.Errorf("snapshot JSON contains a raw closer or comment opener: %q", txt)
	}
}

func TestLayoutSidebar(t *testing.T) {
	links := []ThreadLink{
		{ID: "thr_a", Title: "Alpha"},
		{ID: "thr_b", Title: "Beta"},
		{ID: "thr_c", Title: "Gamma"},
	}
	check := func(t *testing.T, doc *goquery.Document, current string) {
		t.Helper()
		list := one(t, doc, "nav "+byTestID("thread-list"))
		items := list.Find("li > " + byTestID("thread-link"))
		if items.Length() != len(links) {
			t.Fatalf("%d sidebar links, want %d", items.Length(), len(links))
		}
		items.Each(func(i int, s *goquery.Selection) {
			want := links[i]
			if got := s.AttrOr("href", ""); got != "/t/"+want.ID {
				t.Errorf("link %d href = %q, want /t/%s", i, got, want.ID)
			}
			if got := s.Text(); got != want.Title {
				t.Errorf("link %d text = %q, want %q", i, got, want.Title)
			}
			cur, has := s.Attr("aria-current")
			if want.ID == current {
				if cur != "page" {
					t.Errorf("link %d (current) aria-current = %q, want page", i, cur)
				}
			} else if has {
				t.Errorf("link %d (not current) has aria-current=%q", i, cur)
			}
		})
		if n := doc.Find(`[aria-current]`).Length(); current == "" && n != 0 {
			t.Errorf("%d aria-current with no current thread", n)
		}

		css := one(t, doc, `head link[rel="stylesheet"]`)
		if got := attr(t, css, "href"); got != static.Path("app.css") {
			t.Errorf("stylesheet href = %q, want %q", got, static.Path("app.css"))
		}
		js := one(t, doc, `head script[type="module"]`)
		if got := attr(t, js, "src"); got != static.Path("app.js") {
			t.Errorf("module src = %q, want %q", got, static.Path("app.js"))
		}
		for _, p := range []string{css.AttrOr("href", ""), js.AttrOr("src", "")} {
			rest, ok := strings.CutPrefix(p, "/static/")
			hash, _, _ := strings.Cut(rest, "/")
			if !ok || len(hash) != 12 || strings.Trim(hash, "0123456789abcdef") != "" {
				t.Errorf("static path %q is not /static/<12 hex>/...", p)
			}
		}
		newThread := one(t, doc, "nav "+byTestID("new-thread"))
		form := newThread.Closest("form")
		if form.AttrOr("action", "") != "/threads" || strings.ToLower(form.AttrOr("method", "")) != "post" {
			t.Errorf("new-thread form: action=%q method=%q", form.AttrOr("action", ""), form.AttrOr("method", ""))
		}
		if got := doc.Find("html").AttrOr("lang", ""); got != "en" {
			t.Errorf("html lang = %q", got)
		}
		one(t, doc, "main.main")
	}

	t.Run("thread", func(t *testing.T) {
		doc, _ := render(t, ThreadPage(chat.Snapshot{ThreadID: "thr_b", Title: "Beta"}, links))
		check(t, doc, "thr_b")
	})
	t.Run("home", func(t *testing.T) {
		doc, _ := render(t, Home(links, ""))
		check(t, doc, "")
	})
	t.Run("not found", func(t *testing.T) {
		doc, _ := render(t, NotFound(links))
		check(t, doc, "")
	})
	t.Run("layout", func(t *testing.T) {
		doc, _ := render(t, Layout("T", links, "thr_c", ""))
		check(t, doc, "thr_c")
	})
}

func TestHomeAndNotFound(t *testing.T) {
	t.Run("home", func(t *testing.T) {
		doc, _ := render(t, Home(nil, ""))
		home := one(t, doc, "main "+byTestID("home"))
		if home.Find(`form[action="/threads"] button[type="submit"]`).Length() != 1 {
			t.Error("home has no New conversation form")
		}
		if doc.Find(byTestID("not-found")).Length() != 0 || doc.Find(byTestID("thread")).Length() != 0 {
			t.Error("home renders other sections")
		}
		if got := doc.Find("head title").Text(); got != "Conversations · gateway" {
			t.Errorf("<title> = %q", got)
		}
		if n := doc.Find("script#snapshot").Length(); n != 0 {
			t.Errorf("home has %d snapshot scripts", n)
		}
	})
	t.Run("not found", func(t *testing.T) {
		doc, _ := render(t, NotFound(nil))
		nf := one(t, doc, "main "+byTestID("not-found"))
		if !strings.Contains(nf.Find("h1").Text(), "No such conversation") {
			t.Errorf("not-found heading = %q", nf.Find("h1").Text())
		}
		if doc.Find(byTestID("home")).Length() != 0 || doc.Find(byTestID("thread")).Length() != 0 {
			t.Error("not-found renders other sections")
		}
		if got := doc.Find("head title").Text(); got != "Not found · gateway" {
			t.Errorf("<title> = %q", got)
		}
	})
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
