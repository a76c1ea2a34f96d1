// Package web serves the browser pages. Until the chat UI lands it serves
// one page that says what is running and where the API is.
package web

import (
	"net/http"
)

// Routes registers the pages on mux.
func Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", index)
}

func index(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	_, _ = w.Write([]byte(indexPage))
}

const indexPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gateway</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:40rem;margin:3rem auto;padding:0 1rem}code{background:#8882;padding:0 .2em}</style>
</head><body>
<h1>gateway is running</h1>
<p>The chat page is not built yet. The HTTP API is live under <code>/api</code>:
create a thread with <code>POST /api/threads</code>, start a run with
<code>POST /api/threads/{id}/runs</code>, follow it with
<code>GET /api/threads/{id}/events</code>, and cancel it with
<code>POST /api/runs/{id}/cancel</code>. The README lists every endpoint.</p>
</body></html>
`
