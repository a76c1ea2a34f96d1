package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/honestcancel/gateway/chat"
)

// Options are what the pages show and do beyond the store: which model
// answers (an empty conversation says what it can do) and what starts a
// run (the first message typed on the home page, posted without the page
// script).
type Options struct {
	// Model is the model backend the server answers with ("demo",
	// "openai"; "" when not said): an empty conversation lists what the
	// demo model does, and for any other model only what is true of every
	// model (starterFor).
	Model string
	// Runs starts a conversation's first request when the home page's box
	// is posted as a plain form (nil: such a post is refused, nothing
	// created, with what to do).
	Runs Runs
	// OIDC signs users in through an OpenID Connect provider: the sign-in
	// page offers it (beside the password form, or alone) and serves its
	// callback (nil: no provider).
	OIDC OIDC
}

// Runs starts runs (engine.Engine's StartRun: the command the API and the
// WebSocket send).
type Runs interface {
	StartRun(ctx context.Context, p chat.StartRun) (chat.RunStartAck, error)
}

// With sets the options and returns p (call it before Routes).
func (p *Pages) With(o Options) *Pages {
	p.opts = o
	return p
}

// create is POST /threads: a new conversation, and, from the home page's
// box (field message), its first request. With the page script the box
// does not post here: it creates the conversation over the API and sends
// the message from the conversation's page, as its composer does
// (static/src/start.ts); this is the way without the script. A message
// the protocol refuses is refused before anything is created; one the
// engine refuses once the conversation exists says so, with a link to it.
// Without Runs (Options) a message is refused and nothing is created.
func (p *Pages) create(w http.ResponseWriter, r *http.Request) {
	// (A browser sends a textarea's line breaks as CR LF.)
	message := strings.ReplaceAll(r.PostForm.Get("message"), "\r\n", "\n")
	first := strings.TrimSpace(message) != ""
	if first {
		if err := (chat.StartRun{ExpectedStateVersion: 1, UserMessage: &message}).Validate(); err != nil {
			p.refuseForm(w, r, http.StatusBadRequest, Refusal{Code: chat.CodeInvalidRequest, Message: messageRefused(err)})
			return
		}
		if p.opts.Runs == nil {
			p.refuseForm(w, r, http.StatusServiceUnavailable, Refusal{Code: chat.CodeInternal,
				Message: "This server sends messages only from the page's script, which did not run: turn JavaScript on for this site and send your message again (go back: your text is still in the box)."})
			return
		}
	}
	snap, err := p.store.CreateThread(r.Context(), userID(r), chat.DefaultTitle)
	if err != nil {
		p.fail(w, err)
		return
	}
	to := "/t/" + url.PathEscape(snap.ThreadID)
	if first {
		_, err := p.opts.Runs.StartRun(r.Context(), chat.StartRun{UserID: userID(r), ThreadID: snap.ThreadID, ExpectedStateVersion: snap.StateVersion, UserMessage: &message})
		var e *chat.Error
		if err != nil && !errors.As(err, &e) {
			p.fail(w, err)
			return
		}
		if err != nil {
			if secs, ok := chat.RetryAfter(err); ok {
				w.Header().Set("Retry-After", fmt.Sprint(secs))
			}
			p.refuseForm(w, r, chat.HTTPStatus(e.Code), Refusal{Code: e.Code,
				Message: "The conversation was created (" + to + "), but your message was not sent: " + e.Message + " Go back: your text is still in the box."})
			return
		}
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// messageRefused says why a first message cannot be sent, and what to do.
// (One over chat.MaxUserMessageBytes never gets here: the form's body is
// at most maxFormBytes, refused before with what to do.)
func messageRefused(err error) string {
	msg := err.Error()
	var e *chat.Error
	if errors.As(err, &e) {
		msg = e.Message
	}
	return "Your message was not sent: " + msg + ". Go back: your text is still in the box."
}

// starter is what an empty conversation says before anything is sent:
// what the model can do (true of the configured model only) and a few
// example requests, which the page script puts in the box (not sent).
type starter struct {
	Title, Text string
	Examples    []string
}

// starterFor is the starter for the model named model (Options.Model).
func starterFor(model string) starter {
	if model == "demo" {
		return starter{
			Title: "What the demo model can do",
			Text: "It is the server's built-in model: it answers from the words you write, without real knowledge. " +
				"It also writes Markdown (headings, tables, code), puts an order on a card, searches the product catalog, " +
				"and drafts an email that is sent only once you confirm it.",
			Examples: []string{
				"Show me Markdown about planning a vegetable garden",
				"Order 2 red mugs and 3 blue plates",
				"Search the catalog for mugs",
				"Send an email to anna@example.com about the spring order",
			},
		}
	}
	return starter{
		Title: "Start the conversation",
		Text:  "Ask anything. The reply appears as it is written; Cancel (or Esc) stops it and says what was kept.",
		Examples: []string{
			"Help me plan a three-day trip to Lisbon",
			"Explain how HTTPS keeps a connection private",
			"Write a short, friendly note declining a meeting",
		},
	}
}

type modelKey struct{}

// withModel puts the configured model in r's context for the thread page
// (modelOf), as search puts the list's next page (moreLink).
func (p *Pages) withModel(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), modelKey{}, p.opts.Model))
}

// modelOf is the model withModel put in ctx ("" when none).
func modelOf(ctx context.Context) string {
	m, _ := ctx.Value(modelKey{}).(string)
	return m
}
