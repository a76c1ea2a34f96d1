package static_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/andybalholm/brotli"

	"github.com/honestcancel/gateway/static"
)

// serve starts a real server on static.Handler and returns its base URL and
// a client that sends what it is told and hands back the bytes as sent (no
// Accept-Encoding of its own, no transparent decoding).
func serve(t *testing.T) (string, *http.Client) {
	t.Helper()
	srv := httptest.NewServer(static.Handler())
	t.Cleanup(srv.Close)
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return srv.URL, &http.Client{Transport: tr}
}

func fetch(t *testing.T, client *http.Client, method, url string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
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

// decode undoes a Content-Encoding.
func decode(t *testing.T, coding string, b []byte) []byte {
	t.Helper()
	var r io.Reader
	switch coding {
	case "":
		return b
	case "br":
		r = brotli.NewReader(bytes.NewReader(b))
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("not gzip: %v", err)
		}
		r = zr
	default:
		t.Fatalf("unexpected Content-Encoding %q", coding)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("decode %s: %v", coding, err)
	}
	return out
}

func varies(h http.Header) bool {
	for _, v := range h.Values("Vary") {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), "Accept-Encoding") {
				return true
			}
		}
	}
	return false
}

// Every built file is answered in the coding the request prefers, with the
// original's Content-Type, Vary, the immutable caching and a length that
// is the bytes sent, and decodes to the built file byte for byte.
func TestServesPrecompressedCopies(t *testing.T) {
	base, client := serve(t)
	for _, name := range []string{"app.js", "app.css"} {
		raw := mustRead(t, name)
		wantType := map[string]string{"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}[name]
		etags := map[string]string{}
		for _, c := range []struct {
			accept []string // Accept-Encoding header lines
			coding string
		}{
			{nil, ""},
			{[]string{"br"}, "br"},
			{[]string{"gzip"}, "gzip"},
			{[]string{"gzip, deflate, br, zstd"}, "br"}, // Chromium on loopback and HTTPS
			{[]string{"gzip, deflate"}, "gzip"},         // Chromium on plain HTTP elsewhere
			{[]string{"gzip", "br"}, "br"},              // two header lines
			{[]string{"GZIP"}, "gzip"},
			{[]string{"x-gzip"}, "gzip"},
			{[]string{"br;q=0, gzip"}, "gzip"},
			{[]string{"br;q=0.5, gzip;q=0.9"}, "gzip"},
			{[]string{"br;q=0.9, gzip;q=0.9"}, "br"},
			{[]string{"br;q=0, gzip;q=0"}, ""},
			{[]string{"br;q=bogus, gzip"}, "gzip"},
			{[]string{"deflate"}, ""},
			{[]string{"identity"}, ""},
			{[]string{"gzip;q=0.5, identity"}, ""},
			{[]string{"*"}, "br"},
			{[]string{"br;q=0, *"}, "gzip"},
			{[]string{"*;q=0"}, ""},
			{[]string{""}, ""},
		} {
			var hdr []string
			for _, a := range c.accept {
				hdr = append(hdr, "Accept-Encoding", a)
			}
			resp, body := fetch(t, client, http.MethodGet, base+static.Path(name), hdr...)
			what := name + " with Accept-Encoding " + strings.Join(c.accept, " | ")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: status %d", what, resp.StatusCode)
			}
			h := resp.Header
			if got := h.Get("Content-Encoding"); got != c.coding {
				t.Errorf("%s: Content-Encoding %q, want %q", what, got, c.coding)
				continue
			}
			if got := h.Get("Content-Type"); got != wantType {
				t.Errorf("%s: Content-Type %q, want %q", what, got, wantType)
			}
			if cc := h.Get("Cache-Control"); cc != "public, max-age=31536000, immutable" {
				t.Errorf("%s: Cache-Control %q", what, cc)
			}
			if !varies(h) || len(h.Values("Vary")) != 1 {
				t.Errorf("%s: Vary %q, want Accept-Encoding once", what, h.Values("Vary"))
			}
			if cl := h.Get("Content-Length"); cl != strconv.Itoa(len(body)) {
				t.Errorf("%s: Content-Length %q for %d bytes", what, cl, len(body))
			}
			if got := decode(t, c.coding, body); !bytes.Equal(got, raw) {
				t.Errorf("%s: decodes to %d bytes that are not dist/%s (%d bytes)", what, len(got), name, len(raw))
			}
			if ext := map[string]string{"br": ".br", "gzip": ".gz"}[c.coding]; ext != "" && !bytes.Equal(body, mustRead(t, name+ext)) {
				t.Errorf("%s: %d bytes that are not dist/%s%s, the build's copy", what, len(body), name, ext)
			}
			etag := h.Get("ETag")
			if prev, ok := etags[c.coding]; ok && prev != etag {
				t.Errorf("%s: ETag %s, was %s for the same coding", what, etag, prev)
			}
			etags[c.coding] = etag
		}
		if len(etags) != 3 || etags[""] == etags["br"] || etags[""] == etags["gzip"] || etags["br"] == etags["gzip"] {
			t.Errorf("%s: ETags per coding %q: each coding needs its own", name, etags)
		}
		t.Logf("%s: %d bytes, gzip %d, brotli %d", name, len(raw), len(mustRead(t, name+".gz")), len(mustRead(t, name+".br")))
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("dist", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// HEAD answers GET's headers, for each coding, without a body.
func TestHeadOfPrecompressed(t *testing.T) {
	base, client := serve(t)
	url := base + static.Path("app.js")
	for _, coding := range []string{"br", "gzip", "identity"} {
		get, body := fetch(t, client, http.MethodGet, url, "Accept-Encoding", coding)
		head, hbody := fetch(t, client, http.MethodHead, url, "Accept-Encoding", coding)
		if head.StatusCode != http.StatusOK || len(hbody) != 0 {
			t.Fatalf("HEAD %s: %d with %d body bytes", coding, head.StatusCode, len(hbody))
		}
		for _, k := range []string{"Content-Encoding", "Content-Type", "Content-Length", "Cache-Control", "Vary", "ETag"} {
			if head.Header.Get(k) != get.Header.Get(k) {
				t.Errorf("HEAD %s: %s %q, GET said %q", coding, k, head.Header.Get(k), get.Header.Get(k))
			}
		}
		if head.Header.Get("Content-Length") != strconv.Itoa(len(body)) {
			t.Errorf("HEAD %s: Content-Length %q, GET sent %d bytes", coding, head.Header.Get("Content-Length"), len(body))
		}
	}
}

// A range of a compressed answer is a range of the bytes sent in that
// coding (RFC 9110: the selected representation), and conditional
// requests are per coding.
func TestRangesAndValidatorsPerCoding(t *testing.T) {
	base, client := serve(t)
	url := base + static.Path("app.js")
	br := mustRead(t, "app.js.br")
	resp, body := fetch(t, client, http.MethodGet, url, "Accept-Encoding", "br", "Range", "bytes=100-199")
	if resp.StatusCode != http.StatusPartialContent || resp.Header.Get("Content-Encoding") != "br" ||
		resp.Header.Get("Content-Range") != "bytes 100-199/"+strconv.Itoa(len(br)) || !bytes.Equal(body, br[100:200]) {
		t.Errorf("range of the brotli copy: %d, Content-Encoding %q, Content-Range %q, %d bytes",
			resp.StatusCode, resp.Header.Get("Content-Encoding"), resp.Header.Get("Content-Range"), len(body))
	}
	if resp.Header.Get("Content-Length") != "100" {
		t.Errorf("range: Content-Length %q", resp.Header.Get("Content-Length"))
	}

	full, _ := fetch(t, client, http.MethodGet, url, "Accept-Encoding", "br")
	etag := full.Header.Get("ETag")
	resp, body = fetch(t, client, http.MethodGet, url, "Accept-Encoding", "br", "If-None-Match", etag)
	if resp.StatusCode != http.StatusNotModified || len(body) != 0 {
		t.Errorf("If-None-Match %s in the same coding: %d, want 304", etag, resp.StatusCode)
	}
	if cc := resp.Header.Get("Cache-Control"); !strings.Contains(cc, "immutable") {
		t.Errorf("304: Cache-Control %q", cc)
	}
	resp, body = fetch(t, client, http.MethodGet, url, "Accept-Encoding", "gzip", "If-None-Match", etag)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "gzip" || len(body) == 0 {
		t.Errorf("If-None-Match %s (brotli's) asking gzip: %d %q, want the gzip copy", etag, resp.StatusCode, resp.Header.Get("Content-Encoding"))
	}
}

// The copies are no files of their own: their names, another version and
// unknown files are not found.
func TestCopiesAreNotServedByName(t *testing.T) {
	base, client := serve(t)
	for _, p := range []string{
		static.Path("app.js.br"), static.Path("app.js.gz"), static.Path("app.css.gz"),
		static.Path("nope.js"), static.Path(""), static.Path("../static.go"),
		"/static/000000000000/app.js",
	} {
		if resp, _ := fetch(t, client, http.MethodGet, base+p, "Accept-Encoding", "br, gzip"); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, resp.StatusCode)
		}
	}
}

// Every bundle file in dist comes with both copies, and each decodes to it:
// a build that skipped static/compress.mjs, or a bundle rebuilt without
// its copies, would serve browsers an old bundle.
func TestDistCopiesMatchTheBundle(t *testing.T) {
	entries, err := os.ReadDir("dist")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".js") && !strings.HasSuffix(name, ".css") {
			continue
		}
		n++
		raw, err := os.ReadFile(filepath.Join("dist", name))
		if err != nil {
			t.Fatal(err)
		}
		for ext, coding := range map[string]string{".br": "br", ".gz": "gzip"} {
			b, err := os.ReadFile(filepath.Join("dist", name+ext))
			if err != nil {
				t.Errorf("%v: run make generate", err)
				continue
			}
			if got := decode(t, coding, b); !bytes.Equal(got, raw) {
				t.Errorf("dist/%s%s does not decode to dist/%s: run make generate", name, ext, name)
			}
		}
	}
	if n < 2 {
		t.Errorf("dist holds %d bundle files, want app.js and app.css", n)
	}
}
