// The page components rendered from snapshots: the thread page, escaping,
// the layout's sidebar, and the home and not-found pages.

package web

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/static"
)

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

	// The title is the page's h1, in view; Rename (a details, so that it
	// opens without the script too) holds the form that posts to
	// /t/{id}/rename with the current title.
	if h := one(t, doc, "h1"+byTestID("thread-heading")); h.Text() != snap.Title || h.HasClass("visually-hidden") {
		t.Errorf("heading %q (class %q), want the title, shown", h.Text(), h.AttrOr("class", ""))
	}
	if got := one(t, doc, "details"+byTestID("rename")+" > summary").Text(); got != "Rename" {
		t.Errorf("rename summary = %q", got)
	}
	rename := one(t, doc, "details "+byTestID("rename-form"))
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
		// The box: a plain form that posts the first message to /threads,
		// with the focus in it on load.
		form := one(t, doc, `main form[action="/threads"][method="post"]`+byTestID("home-composer"))
		box := form.Find("textarea" + byTestID("home-input"))
		if box.Length() != 1 || box.AttrOr("name", "") != "message" || !hasAttr(box, "autofocus") {
			t.Errorf("home box: name %q, autofocus %v", box.AttrOr("name", ""), hasAttr(box, "autofocus"))
		}
		if form.Find(`button[type="submit"]`).Length() != 1 || form.Find(`label[for="home-input"]`).Length() != 1 {
			t.Error("home box has no Send button or no label")
		}
		if home.Find(`form[action="/threads"]`).Length() != 1 {
			t.Error("home has no form that starts a conversation")
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
