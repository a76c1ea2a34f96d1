package web

import (
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/honestcancel/gateway/chat"
)

// Form posts.
//
// Every form of these pages (sign in, sign out, new conversation, rename)
// is a browser's plain form: a few short fields, URL-encoded. A post is
// taken in this order, and refused at the first step it fails, with a
// FormRefused page and nothing changed:
//
//  1. cross-origin posts are refused (Routes: http.CrossOriginProtection),
//     403;
//  2. the body must be application/x-www-form-urlencoded, or be empty:
//     multipart/form-data and any other type are refused before a byte of
//     the body is read, 415 (with Accept-Post naming the one type);
//  3. forms that act for a user need one (signedIn's rules), and are
//     charged one command to the user's budget, the one the API and the
//     WebSocket draw from (Limiter), 429 with Retry-After over it;
//  4. the body is read, at most maxFormBytes (413 over it), and parsed by
//     Request.ParseForm, which keeps it in memory; a field given twice is
//     400.
//
// Handlers then read r.PostForm only. Never r.FormValue, r.PostFormValue,
// r.ParseMultipartForm, r.MultipartReader or r.FormFile: on a request
// whose form is not parsed yet the first two parse multipart bodies too,
// and ParseMultipartForm writes the parts over its memory limit to
// temporary files, which net/http deletes only for the request it handed
// to the server's handler, never for a copy (r.WithContext, r.Clone) — a
// copy is what the handlers behind signedIn get.

// maxFormBytes bounds the body of a form post; the largest real one (a
// 200-byte title, or a sign-in, percent-encoded) is under 2 KiB.
const maxFormBytes = 16 << 10

// formType is the only body type the forms accept.
const formType = "application/x-www-form-urlencoded"

// Limiter charges a command to a user's budget (gateway.Server's
// ChargeCommand): nil, or a rate_limited *chat.Error with
// retry_after_seconds.
type Limiter interface {
	ChargeCommand(userID string) error
}

// noLimit charges nothing (New without a Limiter).
type noLimit struct{}

func (noLimit) ChargeCommand(string) error { return nil }

// post serves a form post with h after steps 2–4 above; signed makes it
// act for the signed-in caller (steps 3), whom h finds in the request's
// context.
func (p *Pages) post(signed bool, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !formBody(r) {
			w.Header().Set("Accept-Post", formType)
			if r.ContentLength != 0 {
				// The body is not read: the connection ends after this
				// answer, so the client stops sending it.
				w.Header().Set("Connection", "close")
			}
			p.refuseForm(w, r, http.StatusUnsupportedMediaType, Refusal{Code: chat.CodeInvalidRequest,
				Message: "This form is accepted only as " + formType + ", as a browser sends it; multipart/form-data and other types are refused."})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if signed {
			who, err := p.auth.Authenticate(r)
			if err != nil {
				p.notSignedIn(w, r, err)
				return
			}
			if err := p.limits.ChargeCommand(who.UserID); err != nil {
				p.refuseError(w, r, err)
				return
			}
			r = r.WithContext(chat.NewContextWithPrincipal(r.Context(), who))
		}
		if err := r.ParseForm(); err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				p.refuseForm(w, r, http.StatusRequestEntityTooLarge, Refusal{Code: chat.CodeInvalidRequest,
					Message: "The form is over " + strconv.Itoa(maxFormBytes/1024) + " KiB, the most these forms accept: go back, shorten what you typed, and send it again."})
				return
			}
			p.refuseForm(w, r, http.StatusBadRequest, Refusal{Code: chat.CodeInvalidRequest, Message: "The form could not be read: send it from the page again."})
			return
		}
		if name := repeatedField(r); name != "" {
			p.refuseForm(w, r, http.StatusBadRequest, Refusal{Code: chat.CodeInvalidRequest,
				Message: "The form gives the field " + strconv.Quote(name) + " more than once: send each field once."})
			return
		}
		h(w, r)
	})
}

// formBody reports whether r's body is one the forms read: URL-encoded
// (any parameters, such as a charset), or no body at all without a type.
func formBody(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return r.ContentLength == 0
	}
	typ, _, err := mime.ParseMediaType(ct)
	return err == nil && typ == formType
}

// repeatedField is the first (by name) field the parsed body gives more
// than once, or "".
func repeatedField(r *http.Request) string {
	var names []string
	for name, values := range r.PostForm {
		if len(values) > 1 {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	sort.Strings(names)
	return quoteField(names[0])
}

// quoteField cuts a client's field name for a message.
func quoteField(name string) string {
	const n = 64
	if len(name) > n {
		return name[:n] + "…"
	}
	return name
}

// refuseError shows a *chat.Error from a form post as a FormRefused page,
// with its status (and Retry-After for rate_limited); any other error is
// a server failure.
func (p *Pages) refuseError(w http.ResponseWriter, r *http.Request, err error) {
	var e *chat.Error
	if !errors.As(err, &e) {
		p.fail(w, err)
		return
	}
	if secs, ok := chat.RetryAfter(err); ok {
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	p.refuseForm(w, r, chat.HTTPStatus(e.Code), Refusal{Code: e.Code, Message: e.Message})
}

func (p *Pages) refuseForm(w http.ResponseWriter, r *http.Request, status int, f Refusal) {
	p.log.Debug("form refused", "path", r.URL.Path, "status", status, "code", f.Code)
	if wantsJSON(r) {
		writeJSON(w, status, map[string]string{"type": "error", "error": f.Code, "message": f.Message})
		return
	}
	p.render(w, r, status, FormRefused(f))
}

// wantsJSON reports a form post sent by the page script (Accept:
// application/json), which shows the answer itself: a refusal as the API
// words its errors ({type, error, message}), instead of a page.
func wantsJSON(r *http.Request) bool {
	accept := r.Header.Get("Accept")
	return accept != "" && strings.HasPrefix(strings.TrimSpace(strings.Split(accept, ",")[0]), "application/json")
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}
