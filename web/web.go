// Package web serves the browser pages: templ components rendered on the
// server for the first paint (the client script in static/ then keeps them
// live over the WebSocket), and the form posts that create and rename
// conversations.
package web

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"

	"github.com/a-h/templ"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/static"
)

//go:generate go tool templ generate

// Store is what the pages read and the forms change.
type Store interface {
	ListThreads(ctx context.Context, userID string, limit int, cursor, search string) ([]chat.Thread, string, error)
	// SnapshotLatest is a snapshot with only the latest messages of the
	// history (store.SnapshotLatest): the page's first paint.
	SnapshotLatest(ctx context.Context, userID, threadID string, limit int, maxBytes int64) (chat.Snapshot, error)
	CreateThread(ctx context.Context, userID, title string) (chat.Snapshot, error)
	RenameThread(ctx context.Context, userID, threadID, title string) error
}

// Auth signs users in and out and tells who is calling (package auth).
type Auth interface {
	Authenticate(r *http.Request) (chat.Principal, error)
	// PasswordSignIn reports whether users sign in on /login (auth mode
	// password); otherwise identity comes from elsewhere (none, header).
	PasswordSignIn() bool
	SignIn(w http.ResponseWriter, r *http.Request, name, password string) (chat.User, error)
	SignOut(w http.ResponseWriter, r *http.Request) error
}

// Pages serves the browser UI. Safe for concurrent use.
type Pages struct {
	store  Store
	auth   Auth
	limits Limiter
	log    *slog.Logger
	opts   Options // With (home.go)
}

// New returns the pages over store; auth nil serves everyone as the one
// local user (auth mode none). limits charges the forms that change
// something to their user's command budget (nil: no limit).
func New(store Store, auth Auth, limits Limiter, log *slog.Logger) *Pages {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if auth == nil {
		auth = localAuth{}
	}
	if limits == nil {
		limits = noLimit{}
	}
	return &Pages{store: store, auth: auth, limits: limits, log: log}
}

// Routes registers the pages and the static files on mux. Pages need a
// signed-in user (others are sent to /login, or refused when identity comes
// from a proxy); form posts are refused cross-origin, and taken only as
// short URL-encoded bodies (forms.go). The forms that change a user's
// conversations are charged to the user's command budget; sign-in has its
// own brake (package auth), and sign-out is never refused for the budget:
// ending a session must always work.
func (p *Pages) Routes(mux *http.ServeMux) {
	forms := http.NewCrossOriginProtection()
	mux.Handle("GET /static/", static.Handler())
	mux.HandleFunc("GET /login", p.loginPage)
	mux.Handle("POST /login", forms.Handler(p.post(false, p.login)))
	mux.HandleFunc("GET /auth/oidc/start", p.oidcStart)
	mux.HandleFunc("GET /auth/oidc/callback", p.oidcCallback)
	mux.Handle("POST /logout", forms.Handler(p.post(false, p.logout)))
	mux.Handle("GET /{$}", p.signedIn(p.home))
	mux.Handle("GET /t/{id}", p.signedIn(p.thread))
	mux.Handle("POST /threads", forms.Handler(p.post(true, p.create)))
	mux.Handle("POST /t/{id}/rename", forms.Handler(p.post(true, p.rename)))
}

// signedIn runs h with the caller in the request's context. Without one, a
// server with a sign-in page (password, provider) sends the browser to
// /login (and back here afterwards); other modes show why the request was
// refused.
func (p *Pages) signedIn(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, err := p.auth.Authenticate(r)
		if err == nil {
			h(w, r.WithContext(chat.NewContextWithPrincipal(r.Context(), who)))
			return
		}
		p.notSignedIn(w, r, err)
	})
}

// notSignedIn answers a request whose caller did not authenticate (err):
// a server with a sign-in page sends the browser to /login (and back here
// afterwards); other modes show why the request was refused.
func (p *Pages) notSignedIn(w http.ResponseWriter, r *http.Request, err error) {
	if chat.ErrorCode(err) == chat.CodeUnauthorized && p.signInPage() {
		next := r.URL.Path
		if r.Method != http.MethodGet {
			next = "/"
		}
		http.Redirect(w, r, "/login?next="+url.QueryEscape(next), http.StatusSeeOther)
		return
	}
	p.refuse(w, r, err)
}

// refuse shows an authentication error as a page.
func (p *Pages) refuse(w http.ResponseWriter, r *http.Request, err error) {
	var e *chat.Error
	if !errors.As(err, &e) {
		p.fail(w, err)
		return
	}
	p.render(w, r, chat.HTTPStatus(e.Code), Refused(e.Message))
}

// localNext keeps a post-sign-in redirect on this site: a path of this
// server with an optional query, nothing a browser could read as another
// host ("//host", "/\host", control characters it strips).
func localNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || next == "" || next[0] != '/' || u.Scheme != "" || u.Host != "" || u.Opaque != "" ||
		strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\") ||
		strings.IndexFunc(next, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
		return "/"
	}
	return next
}

func (p *Pages) loginPage(w http.ResponseWriter, r *http.Request) {
	next := localNext(r.URL.Query().Get("next"))
	if !p.signInPage() {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	if _, err := p.auth.Authenticate(r); err == nil {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	p.render(w, r, http.StatusOK, Login(p.loginForm(next)))
}

func (p *Pages) login(w http.ResponseWriter, r *http.Request) {
	name, password := r.PostForm.Get("name"), r.PostForm.Get("password")
	form := p.loginForm(localNext(r.PostForm.Get("next")))
	form.Name = name
	if !p.auth.PasswordSignIn() {
		if p.opts.OIDC != nil { // (a provider only: no password is taken)
			p.loginRefused(w, r, form, chat.Errorf(chat.CodeInvalidRequest,
				"This server takes no passwords: sign in with %s.", form.Provider))
			return
		}
		http.Redirect(w, r, form.Next, http.StatusSeeOther)
		return
	}
	_, err := p.auth.SignIn(w, r, name, password)
	if err == nil {
		http.Redirect(w, r, form.Next, http.StatusSeeOther)
		return
	}
	p.loginRefused(w, r, form, err)
}

func (p *Pages) logout(w http.ResponseWriter, r *http.Request) {
	if err := p.auth.SignOut(w, r); err != nil {
		p.fail(w, err)
		return
	}
	target := "/login"
	if !p.signInPage() {
		target = "/"
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// localAuth is auth mode none: everyone is the one local user.
type localAuth struct{}

func (localAuth) Authenticate(*http.Request) (chat.Principal, error) {
	return chat.LocalPrincipal(), nil
}
func (localAuth) PasswordSignIn() bool { return false }
func (localAuth) SignIn(http.ResponseWriter, *http.Request, string, string) (chat.User, error) {
	return chat.User{}, chat.Errorf(chat.CodeInvalidRequest, "this server has no accounts: there is nothing to sign in to")
}
func (localAuth) SignOut(http.ResponseWriter, *http.Request) error { return nil }

// sidebarSize is how many conversations the sidebar lists.
const sidebarSize = 100

// links is the sidebar: the user's conversations, newest first, but for
// those nothing was ever sent in (a "New conversation" left as it was),
// unless it is the one open (current). It returns r with the cursor of
// the next page for the layout's "Older conversations" (moreCursor).
func (p *Pages) links(r *http.Request, current string) (*http.Request, []ThreadLink) {
	return p.search(r, current, "", "")
}

// search is links limited to the conversations a search finds (the
// sidebar's search box without the page script: GET /?q=), from cursor
// (a page of older ones: GET /?cursor=).
func (p *Pages) search(r *http.Request, current, q, cursor string) (*http.Request, []ThreadLink) {
	threads, next, err := p.store.ListThreads(r.Context(), userID(r), sidebarSize, cursor, q)
	if err != nil {
		if chat.ErrorCode(err) != chat.CodeInvalidRequest { // (a cursor not given out here: the first page)
			p.log.Error("list threads", "err", err)
			return r, nil
		}
		if threads, next, err = p.store.ListThreads(r.Context(), userID(r), sidebarSize, "", q); err != nil {
			p.log.Error("list threads", "err", err)
			return r, nil
		}
	}
	out := make([]ThreadLink, 0, len(threads))
	for _, t := range threads {
		if neverUsed(t) && t.ThreadID != current {
			continue
		}
		out = append(out, ThreadLink{ID: t.ThreadID, Title: t.Title, Fork: t.ForkedFrom != nil, UpdatedAt: t.UpdatedAt})
	}
	return r.WithContext(context.WithValue(r.Context(), moreKey{}, sidebarMore{cursor: next, search: q})), out
}

type moreKey struct{}

// sidebarMore is where the sidebar's list goes on: the cursor of its next
// page ("" when it is the last) and the search it lists.
type sidebarMore struct{ cursor, search string }

// moreLink is the address of the sidebar's next page and its cursor, read
// by the layout ("/" and "" when there is none: the link is hidden until a
// search's answer has more).
func moreLink(ctx context.Context) (string, string) {
	m, _ := ctx.Value(moreKey{}).(sidebarMore)
	if m.cursor == "" {
		return "/", ""
	}
	q := url.Values{"cursor": {m.cursor}}
	if m.search != "" {
		q.Set("q", m.search)
	}
	return "/?" + q.Encode(), m.cursor
}

// neverUsed reports a conversation created and never written to: every
// durable change (a run, a fork's history) moves its state_version past
// the first; a rename does not (titles are labels).
func neverUsed(t chat.Thread) bool { return t.ForkedFrom == nil && t.StateVersion <= 1 }

func (p *Pages) home(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query().Get("q")
	if len(q) > 200 || strings.IndexFunc(q, chat.IsControl) >= 0 {
		q = "" // what the box cannot send; the API says why (GET /api/threads)
	}
	cursor := r.URL.Query().Get("cursor")
	if len(cursor) > 128 {
		cursor = ""
	}
	r, links := p.search(r, "", q, cursor)
	p.render(w, r, http.StatusOK, Home(links, q))
}

func (p *Pages) thread(w http.ResponseWriter, r *http.Request) {
	snap, err := p.store.SnapshotLatest(r.Context(), userID(r), r.PathValue("id"), firstPaintMessages, chat.HistoryPageBytes)
	if chat.ErrorCode(err) == chat.CodeNotFound {
		r, links := p.links(r, "")
		p.render(w, r, http.StatusNotFound, NotFound(links))
		return
	}
	if err != nil {
		p.fail(w, err)
		return
	}
	r, links := p.links(p.withModel(r), snap.ThreadID)
	p.render(w, r, http.StatusOK, ThreadPage(snap, links))
}

func (p *Pages) rename(w http.ResponseWriter, r *http.Request) {
	// The API's rule (chat.CheckTitle: at most 200 bytes, which the
	// input's maxlength, in characters, cannot express for non-ASCII text;
	// no control characters), after trimming what a browser's text input
	// leaves around the title.
	// The page script posts the same form asking for JSON (wantsJSON):
	// the saved title, or the refusal as the API words it.
	title := strings.TrimSpace(r.PostForm.Get("title"))
	id := r.PathValue("id")
	if err := chat.CheckTitle("title", title); err != nil {
		p.refuseError(w, r, err)
		return
	}
	if err := p.store.RenameThread(r.Context(), userID(r), id, title); err != nil {
		if chat.ErrorCode(err) == chat.CodeNotFound {
			if wantsJSON(r) {
				p.refuseError(w, r, err)
				return
			}
			r, links := p.links(r, "")
			p.render(w, r, http.StatusNotFound, NotFound(links))
			return
		}
		p.fail(w, err)
		return
	}
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, map[string]string{"thread_id": id, "title": title})
		return
	}
	http.Redirect(w, r, "/t/"+url.PathEscape(id), http.StatusSeeOther)
}

// userID is the signed-in caller ("" outside signedIn: the store answers
// not_found).
func userID(r *http.Request) string { return chat.UserIDFromContext(r.Context()) }

func (p *Pages) render(w http.ResponseWriter, r *http.Request, status int, c templ.Component) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	// No window of another site keeps a handle on this one (nor this one
	// on a window it opens), and the page asks for no device.
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Permissions-Policy", permissionsPolicy)
	w.WriteHeader(status)
	if err := c.Render(r.Context(), w); err != nil && !errors.Is(err, context.Canceled) {
		p.log.Error("render page", "err", err)
	}
}

// permissionsPolicy turns off the powerful features a chat page never
// uses, for it and anything it could embed.
const permissionsPolicy = "camera=(), microphone=(), geolocation=(), payment=(), usb=(), serial=(), hid=(), display-capture=()"

func (p *Pages) fail(w http.ResponseWriter, err error) {
	p.log.Error("page", "err", err)
	http.Error(w, "Something went wrong on the server. Reload the page; if it persists, check the server log.", http.StatusInternalServerError)
}

// speaker names who a message is from, for screen readers (the page
// script says the same: static/src/thread.ts).
func speaker(role string) string {
	switch role {
	case chat.RoleUser:
		return "You said:"
	case chat.RoleTool:
		return "Tool result:"
	default:
		return "Assistant said:"
	}
}
