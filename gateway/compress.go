package gateway

// Compression of the answers built per request: pages, API answers and
// error texts, gzip-compressed as they are written (gzhttp, the middleware
// of github.com/klauspost/compress). The bundle is not compressed here:
// package static serves the copies `npm run build` compressed.

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/klauspost/compress/gzhttp"
)

// compressedTypes are the media types Compress compresses: what the
// gateway builds per request. Everything else (event streams, the bundle,
// anything already compressed) passes as it is.
var compressedTypes = []string{"text/html", "application/json", "text/plain"}

// Compress wraps next so that an answer of one of compressedTypes and of
// at least 1 KiB is gzip-compressed when the request accepts gzip
// (Accept-Encoding, q=0 refusing it), with Content-Encoding: gzip; every
// answer that could be compressed says Vary: Accept-Encoding.
//
// Two kinds of request pass untouched, since compression would hold their
// bytes back: a WebSocket upgrade (its connection stops being HTTP) and an
// event stream (each event must reach the client when it is flushed), told
// apart by the request (streaming) before any byte is written.
//
// Compressing a body that holds a secret next to text an attacker chose
// lets the attacker learn the secret from the compressed length (BREACH).
// Pages and API answers carry no token (forms are guarded by their
// Origin, the session is an HttpOnly cookie) but do carry the user's
// conversations, and the sidebar's search box reflects its query. The
// attacker's lever is a request the browser sends with the user's cookie
// from another site, so only requests that cannot be one are compressed
// (ownRequest): those a browser marks as from this origin or from the
// user (Sec-Fetch-Site), and those that carry no cookie at all (programs).
func Compress(next http.Handler) http.Handler {
	wrap, err := gzhttp.NewWrapper(
		gzhttp.ContentTypes(compressedTypes),
		gzhttp.MinSize(gzhttp.DefaultMinSize),
		// One coding per request to reason about; browsers accept gzip
		// everywhere, brotli and zstd only from secure or loopback origins.
		gzhttp.EnableZstd(false),
	)
	if err != nil { // the options above are constants
		panic(fmt.Sprintf("gateway: compression options: %v", err))
	}
	compressed := wrap(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case streaming(r):
			next.ServeHTTP(w, r)
		case !ownRequest(r):
			w.Header().Add("Vary", "Accept-Encoding")
			next.ServeHTTP(w, r)
		default:
			compressed.ServeHTTP(w, r)
		}
	})
}

// streaming reports whether r asks for an answer that must reach the client
// as it is written: a WebSocket upgrade (any Upgrade header, or GET /ws), a
// thread's event stream (Accept: text/event-stream, or its path, for a
// client that does not say what it accepts), or a route of the OpenAI
// Responses API, which may stream whatever the client accepts (the OpenAI
// SDKs send Accept: application/json; a create says stream in its body).
// Routes names them all.
func streaming(r *http.Request) bool {
	if p := r.URL.Path; p == "/v1/responses" || strings.HasPrefix(p, "/v1/responses/") {
		return true
	}
	if r.Header.Get("Upgrade") != "" || r.URL.Path == "/ws" {
		return true
	}
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(strings.ToLower(v), "text/event-stream") {
			return true
		}
	}
	p := r.URL.Path
	return strings.HasPrefix(p, "/api/threads/") && strings.HasSuffix(p, "/events")
}

// ownRequest reports whether r is a request no other site can have made
// the browser send with the user's credentials: one a browser marks as
// same-origin or as the user's own (typed, bookmarked: "none"), or one
// without Sec-Fetch-Site and without a cookie (a program, which
// authenticates with a token it holds). A same-site request is another
// origin's too (a sibling subdomain).
func ownRequest(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin", "none":
		return true
	case "":
		return r.Header.Get("Cookie") == ""
	default:
		return false
	}
}
