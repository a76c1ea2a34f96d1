package gateway_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
)

// compressed is h served behind gateway.Compress, as the app serves it, on
// a server of its own (h's methods then call that one).
func compressed(t *testing.T, h *harness) *harness {
	t.Helper()
	srv := httptest.NewServer(gateway.Compress(h.mux))
	t.Cleanup(func() {
		closing, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		h.api.CloseWebSockets(closing)
		cancel()
		srv.CloseClientConnections()
		srv.Close()
	})
	c := *h
	c.srv = srv
	return &c
}

// rawClient sends what it is told and hands back the bytes as sent (no
// Accept-Encoding of its own, no transparent decoding).
func rawClient(t *testing.T) *http.Client {
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// fetch sends method url with the headers hdr (name, value pairs) and
// returns the answer and its body as sent.
func fetch(t *testing.T, client *http.Client, method, url string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp, body
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not gzip: %v", err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("gzip body: %v", err)
	}
	return out
}

func wantVary(t *testing.T, what string, h http.Header) {
	t.Helper()
	for _, v := range h.Values("Vary") {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), "Accept-Encoding") {
				return
			}
		}
	}
	t.Errorf("%s: Vary = %q, want Accept-Encoding in it", what, h.Values("Vary"))
}

// An API answer is gzip-compressed for a request that accepts gzip and that
// no other site can have made with the user's cookie; it decodes to the
// answer sent as it is. Every other request gets it as it is.
func TestCompressAPIAnswers(t *testing.T) {
	h := compressed(t, newHarness(t, 0))
	snap := h.createThread("weight")
	h.runUnwatched(snap.ThreadID, snap.StateVersion, strings.Repeat("a long question to make the thread weigh more than a KiB ", 40))
	url := h.srv.URL + "/api/threads/" + snap.ThreadID
	client := rawClient(t)
	resp, plain := fetch(t, client, http.MethodGet, url)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" || len(plain) < 2048 {
		t.Fatalf("GET %s without Accept-Encoding: %d, Content-Encoding %q, %d bytes", url, resp.StatusCode, resp.Header.Get("Content-Encoding"), len(plain))
	}
	for _, c := range []struct {
		name string
		hdr  []string
		gzip bool
	}{
		{"gzip from a program", []string{"Accept-Encoding", "gzip"}, true},
		{"a browser's list", []string{"Accept-Encoding", "gzip, deflate, br, zstd", "Sec-Fetch-Site", "same-origin", "Cookie", "session=x"}, true},
		{"typed by the user", []string{"Accept-Encoding", "gzip, deflate", "Sec-Fetch-Site", "none", "Cookie", "session=x"}, true},
		{"gzip weighed", []string{"Accept-Encoding", "br;q=1, gzip;q=0.5"}, true},
		{"gzip refused", []string{"Accept-Encoding", "gzip;q=0, deflate"}, false},
		{"brotli only", []string{"Accept-Encoding", "br"}, false},
		{"identity", []string{"Accept-Encoding", "identity"}, false},
		{"cross-site", []string{"Accept-Encoding", "gzip", "Sec-Fetch-Site", "cross-site", "Cookie", "session=x"}, false},
		{"same-site", []string{"Accept-Encoding", "gzip", "Sec-Fetch-Site", "same-site"}, false},
		{"cookie without Sec-Fetch-Site", []string{"Accept-Encoding", "gzip", "Cookie", "session=x"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, body := fetch(t, client, http.MethodGet, url, c.hdr...)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			wantVary(t, c.name, resp.Header)
			got := body
			if enc := resp.Header.Get("Content-Encoding"); c.gzip {
				if enc != "gzip" {
					t.Fatalf("Content-Encoding = %q, want gzip", enc)
				}
				if len(body) >= len(plain)/2 {
					t.Errorf("compressed to %d of %d bytes", len(body), len(plain))
				}
				got = gunzip(t, body)
			} else if enc != "" {
				t.Fatalf("Content-Encoding = %q, want none", enc)
			}
			if cl := resp.Header.Get("Content-Length"); cl != "" && cl != strconv.Itoa(len(body)) {
				t.Errorf("Content-Length %s for %d bytes", cl, len(body))
			}
			if !bytes.Equal(got, plain) {
				t.Errorf("decodes to %d bytes that differ from the %d sent as they are", len(got), len(plain))
			}
		})
	}
	// Under 1 KiB compression gains nothing: sent as it is.
	resp, body := fetch(t, client, http.MethodGet, h.srv.URL+"/livez", "Accept-Encoding", "gzip")
	if resp.Header.Get("Content-Encoding") != "" || !json.Valid(body) {
		t.Errorf("/livez: Content-Encoding %q, body %q", resp.Header.Get("Content-Encoding"), body)
	}
	wantVary(t, "/livez", resp.Header)
}

// A page (text/html written in pieces, as templ renders) is compressed and
// decodes to itself; HEAD answers the same headers without a body; an
// event stream or a script the handler serves as it is stays as it is.
func TestCompressPages(t *testing.T) {
	var page bytes.Buffer
	page.WriteString("<!DOCTYPE html><html lang=\"en\"><head><title>t</title></head><body><ul>")
	for i := range 300 {
		page.WriteString("<li data-testid=\"thread-link\"><a href=\"/t/thr_" + strconv.Itoa(i) + "\">Conversation " + strconv.Itoa(i) + "</a></li>")
	}
	page.WriteString("</ul></body></html>")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /page", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		for b := page.Bytes(); len(b) > 0; {
			n := min(len(b), 97)
			w.Write(b[:n])
			b = b[n:]
		}
	})
	mux.HandleFunc("GET /script.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		w.Write(page.Bytes())
	})
	srv := httptest.NewServer(gateway.Compress(mux))
	t.Cleanup(srv.Close)
	client := rawClient(t)

	resp, body := fetch(t, client, http.MethodGet, srv.URL+"/page", "Accept-Encoding", "gzip, deflate, br", "Sec-Fetch-Site", "none")
	if resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("page: Content-Encoding %q, want gzip", resp.Header.Get("Content-Encoding"))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("page: Content-Type = %q", ct)
	}
	wantVary(t, "page", resp.Header)
	if got := gunzip(t, body); !bytes.Equal(got, page.Bytes()) {
		t.Errorf("page decodes to %d bytes, not the %d-byte page", len(got), page.Len())
	}
	t.Logf("page: %d bytes, %d gzip-compressed", page.Len(), len(body))

	head, hbody := fetch(t, client, http.MethodHead, srv.URL+"/page", "Accept-Encoding", "gzip", "Sec-Fetch-Site", "none")
	if head.StatusCode != http.StatusOK || len(hbody) != 0 || head.Header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Errorf("HEAD page: %d, %d body bytes, Content-Type %q", head.StatusCode, len(hbody), head.Header.Get("Content-Type"))
	}
	wantVary(t, "HEAD page", head.Header)

	resp, body = fetch(t, client, http.MethodGet, srv.URL+"/script.js", "Accept-Encoding", "gzip")
	if resp.Header.Get("Content-Encoding") != "" || !bytes.Equal(body, page.Bytes()) {
		t.Errorf("script: Content-Encoding %q, %d bytes: a type Compress does not compress is sent as it is", resp.Header.Get("Content-Encoding"), len(body))
	}
}

// The WebSocket upgrade passes through Compress, whatever the request
// accepts, and the connection works: subscribe, a run streamed, its end.
func TestCompressKeepsWebSocket(t *testing.T) {
	h := compressed(t, newHarness(t, time.Millisecond))
	snap := h.createThread("")
	c := h.dialWith(t, "tab", &websocket.DialOptions{HTTPHeader: http.Header{
		"Accept-Encoding": {"gzip, deflate, br, zstd"},
		"Sec-Fetch-Site":  {"same-origin"},
	}})
	c.subscribe(snap.ThreadID, wsAfter(0))
	runID := wsStr(c.ack(map[string]any{"type": "run.start", "thread_id": snap.ThreadID,
		"expected_state_version": snap.StateVersion, "user_message": "hello through the compressing edge"}), "run_id")
	c.untilDeltas(snap.ThreadID, runID, 3)
	c.untilEvent(snap.ThreadID, chat.EventRunCompleted, runID)
}

// An event stream passes through Compress as it is, its headers sent at
// once and each event when written, even for a client that accepts gzip
// and does not say it wants an event stream: a stream opened at the
// thread's last seq has nothing to send, and its headers still arrive
// (gzip would hold them until 1 KiB was written); a run's first delta
// arrives while the model holds the rest of the run back.
func TestCompressKeepsEventStreamsFlowing(t *testing.T) {
	h := compressed(t, newHarness(t, time.Millisecond, withKeepAlive(time.Hour)))
	snap := h.createThread("")
	release := h.model.hold()
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	url := h.srv.URL + "/api/threads/" + snap.ThreadID + "/events?after_seq=" + strconv.FormatInt(snap.LastSeq, 10)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "gzip, deflate, br")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	client := rawClient(t)
	headers := make(chan error, 1)
	var resp *http.Response
	go func() {
		var err error
		resp, err = client.Do(req)
		headers <- err
	}()
	select {
	case err := <-headers:
		if err != nil {
			cancel()
			t.Fatalf("open event stream: %v", err)
		}
	case <-time.After(waitTimeout):
		cancel()
		t.Fatalf("the event stream's headers did not arrive within %v", waitTimeout)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		cancel()
		t.Fatalf("event stream: %d, Content-Encoding %q, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Encoding"), resp.Header.Get("Content-Type"))
	}
	s := h.readSSE(ctx, cancel, resp, snap.ThreadID, "after_seq="+strconv.FormatInt(snap.LastSeq, 10), "")
	ack := h.startRun(snap.ThreadID, snap.StateVersion, "a question")
	s.waitDeltas(ack.RunID, 1) // the model holds the run after its first chunk
	release()
	s.waitType(chat.EventRunCompleted, ack.RunID)
}
