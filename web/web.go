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
	"unicode/utf8"

	"github.com/a-h/templ"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/static"
)

//go:generate go tool templ generate

// Store is what the pages read and the forms change.
type Store interface {
	ListThreads(ctx context.Context, userID string, limit int, cursor string) ([]chat.Thread, string, error)
	Snapshot(ctx context.Context, userID, threadID string) (chat.Snapshot, error)
	CreateThread(ctx context.Context, userID, title string) (chat.Snapshot, error)
	RenameThread(ctx context.Context, userID, threadID, title string) error
}

// Pages serves the browser UI. Safe for concurrent use.
type Pages struct {
	store Store
	log   *slog.Logger
}

// New returns the pages over store.
func New(store Store, log *slog.Logger) *Pages {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Pages{store: store, log: log}
}

// Routes registers the pages and the static files on mux. Form posts are
// refused cross-origin.
func (p *Pages) Routes(mux *http.ServeMux) {
	forms := http.NewCrossOriginProtection()
	mux.Handle("GET /static/", static.Handler())
	mux.HandleFunc("GET /{$}", p.home)
	mux.HandleFunc("GET /t/{id}", p.thread)
	mux.Handle("POST /threads", forms.Handler(http.HandlerFunc(p.create)))
	mux.Handle("POST /t/{id}/rename", forms.Handler(http.HandlerFunc(p.rename)))
}

// Title limits, as the API's: 200 bytes, which the form's maxlength (in
// characters) cannot express for non-ASCII text, so both are checked.
const (
	maxTitleChars = 200
	maxTitleBytes = 200
)

// sidebarSize is how many conversations the sidebar lists.
const sidebarSize = 100

func (p *Pages) links(r *http.Request) []ThreadLink {
	threads, _, err := p.store.ListThreads(r.Context(), chat.LocalUserID, sidebarSize, "")
	if err != nil {
		p.log.Error("list threads", "err", err)
		return nil
	}
	out := make([]ThreadLink, len(threads))
	for i, t := range threads {
		out[i] = ThreadLink{ID: t.ThreadID, Title: t.Title}
	}
	return out
}

func (p *Pages) home(w http.ResponseWriter, r *http.Request) {
	p.render(w, r, http.StatusOK, Home(p.links(r)))
}

func (p *Pages) thread(w http.ResponseWriter, r *http.Request) {
	snap, err := p.store.Snapshot(r.Context(), chat.LocalUserID, r.PathValue("id"))
	if chat.ErrorCode(err) == chat.CodeNotFound {
		p.render(w, r, http.StatusNotFound, NotFound(p.links(r)))
		return
	}
	if err != nil {
		p.fail(w, err)
		return
	}
	p.render(w, r, http.StatusOK, ThreadPage(snap, p.links(r)))
}

func (p *Pages) create(w http.ResponseWriter, r *http.Request) {
	snap, err := p.store.CreateThread(r.Context(), chat.LocalUserID, chat.DefaultTitle)
	if err != nil {
		p.fail(w, err)
		return
	}
	http.Redirect(w, r, "/t/"+snap.ThreadID, http.StatusSeeOther)
}

func (p *Pages) rename(w http.ResponseWriter, r *http.Request) {
	title := strings.TrimSpace(r.PostFormValue("title"))
	id := r.PathValue("id")
	if title == "" || !utf8.ValidString(title) || utf8.RuneCountInString(title) > maxTitleChars || len(title) > maxTitleBytes {
		http.Error(w, "A title needs 1 to 200 characters (at most 200 bytes). Go back and try again.", http.StatusBadRequest)
		return
	}
	if err := p.store.RenameThread(r.Context(), chat.LocalUserID, id, title); err != nil {
		if chat.ErrorCode(err) == chat.CodeNotFound {
			p.render(w, r, http.StatusNotFound, NotFound(p.links(r)))
			return
		}
		p.fail(w, err)
		return
	}
	http.Redirect(w, r, "/t/"+url.PathEscape(id), http.StatusSeeOther)
}

func (p *Pages) render(w http.ResponseWriter, r *http.Request, status int, c templ.Component) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if err := c.Render(r.Context(), w); err != nil && !errors.Is(err, context.Canceled) {
		p.log.Error("render page", "err", err)
	}
}

func (p *Pages) fail(w http.ResponseWriter, err error) {
	p.log.Error("page", "err", err)
	http.Error(w, "Something went wrong on the server. Reload the page; if it persists, check the server log.", http.StatusInternalServerError)
}
