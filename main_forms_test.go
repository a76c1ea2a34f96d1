package main

// The page forms against the real binary: bodies they must refuse before
// acting, with the binary's TMPDIR watched for files left behind. The
// command budget they share with the API is tested in-process:
// app/scenario_forms_test.go.

import (
	"bufio"
	"context"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/internal/apptest"
)

// generatedMultipart streams a multipart/form-data body of size bytes (a
// "title" field, then a file part of filler) without allocating it.
type generatedMultipart struct {
	head, tail []byte
	filler     int64
}

const formBoundary = "binarytestboundary"

func newGeneratedMultipart(size int64) *generatedMultipart {
	head := []byte("--" + formBoundary + "\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\npwned\r\n" +
		"--" + formBoundary + "\r\nContent-Disposition: form-data; name=\"upload\"; filename=\"fill.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n")
	tail := []byte("\r\n--" + formBoundary + "--\r\n")
	return &generatedMultipart{head: head, tail: tail, filler: size - int64(len(head)+len(tail))}
}

func (g *generatedMultipart) size() int64 { return int64(len(g.head)+len(g.tail)) + g.filler }

func (g *generatedMultipart) Read(p []byte) (int, error) {
	switch {
	case len(g.head) > 0:
		n := copy(p, g.head)
		g.head = g.head[n:]
		return n, nil
	case g.filler > 0:
		n := int(min(int64(len(p)), g.filler))
		for i := range p[:n] {
			p[i] = 'x'
		}
		g.filler -= int64(n)
		return n, nil
	case len(g.tail) > 0:
		n := copy(p, g.tail)
		g.tail = g.tail[n:]
		return n, nil
	}
	return 0, io.EOF
}

// formPost sends a POST to the binary (redirects not followed) and returns
// the status, the Retry-After header and the body.
//
// It reads the answer while the body is still being written, as a browser
// does, on a connection of its own: a server that refuses a body it will
// not read answers at once and then resets the connection, and
// http.Client reports whichever of the answer and the reset its select
// takes first (both are ready on a loaded machine), so it would fail
// this test at random on a correct server.
func (s *server) formPost(t testing.TB, path, contentType string, body io.Reader, length int64) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = length
	if length == 0 {
		req.Body = http.NoBody
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	conn, err := net.Dial("tcp", req.URL.Host)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	written := make(chan error, 1)
	go func() { written <- req.Write(conn) }()
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatalf("POST %s (%s, %d bytes): no answer: %v (writing the body: %v)", path, contentType, length, err, firstOf(written))
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s (%s, %d bytes): reading the answer: %v", path, contentType, length, err)
	}
	conn.Close() // ends a write the server stopped reading
	<-written
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(raw)
}

// firstOf returns what ch holds now, or nil.
func firstOf(ch <-chan error) error {
	select {
	case err := <-ch:
		return err
	default:
		return nil
	}
}

// tempFiles lists what is in dir, with sizes, at any depth.
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		info, _ := d.Info()
		out = append(out, path+" ("+strconv.FormatInt(info.Size(), 10)+" bytes)")
		return nil
	})
	return out
}

// Every page form refuses what a browser's form never sends, before
// acting: a multipart body (150 MB of it, streamed, and a small one), a
// URL-encoded body over 16 KiB, other content types. Each is answered 415
// or 413, changes nothing in the database, and leaves nothing in the
// server's temporary folder.
func TestBinaryFormBodiesRefused(t *testing.T) {
	dir := t.TempDir()
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	srv := startServerEnv(t, []string{"TMPDIR=" + tmp}, filepath.Join(dir, "gw.db"), "0s")
	th := srv.NewThread("keep me")

	big := url.Values{"title": {strings.Repeat("a", 17<<10)}}.Encode()
	multipart := "multipart/form-data; boundary=" + formBoundary
	attacks := []struct {
		name, contentType string
		body              func() (io.Reader, int64)
		status            int
	}{
		{"multipart 150 MB", multipart, func() (io.Reader, int64) { g := newGeneratedMultipart(150 << 20); return g, g.size() }, http.StatusUnsupportedMediaType},
		{"multipart 150 MB chunked", multipart, func() (io.Reader, int64) { return newGeneratedMultipart(150 << 20), -1 }, http.StatusUnsupportedMediaType},
		{"multipart small", multipart, func() (io.Reader, int64) { g := newGeneratedMultipart(1 << 10); return g, g.size() }, http.StatusUnsupportedMediaType},
		{"17 KiB URL-encoded", "application/x-www-form-urlencoded", func() (io.Reader, int64) { return strings.NewReader(big), int64(len(big)) }, http.StatusRequestEntityTooLarge},
		{"17 KiB URL-encoded chunked", "application/x-www-form-urlencoded", func() (io.Reader, int64) { return strings.NewReader(big), -1 }, http.StatusRequestEntityTooLarge},
		{"text/plain", "text/plain", func() (io.Reader, int64) { return strings.NewReader("title=pwned"), 11 }, http.StatusUnsupportedMediaType},
		{"JSON", "application/json", func() (io.Reader, int64) { return strings.NewReader(`{"title":"pwned"}`), 17 }, http.StatusUnsupportedMediaType},
		{"no type", "", func() (io.Reader, int64) { return strings.NewReader("title=pwned"), 11 }, http.StatusUnsupportedMediaType},
	}
	for _, route := range []string{"/threads", "/t/" + th.ThreadID + "/rename", "/login", "/logout"} {
		for _, a := range attacks {
			t.Run(route+" "+a.name, func(t *testing.T) {
				body, n := a.body()
				status, _, page := srv.formPost(t, route, a.contentType, body, n)
				if status != a.status || !strings.Contains(page, `data-testid="form-refused"`) {
					t.Errorf("status %d, want %d with the refusal page: %.300s", status, a.status, page)
				}
				if list := srv.Threads(); len(list) != 1 || list[0].Title != "keep me" {
					t.Errorf("threads now %+v, want only %q", list, "keep me")
				}
				if left := tempFiles(t, tmp); len(left) > 0 {
					t.Errorf("left in the server's temporary folder: %s", strings.Join(left, ", "))
				}
			})
		}
	}
	// The forms still work as a browser sends them.
	status, _, page := srv.formPost(t, "/t/"+th.ThreadID+"/rename", "application/x-www-form-urlencoded", strings.NewReader("title=renamed"), 13)
	if status != http.StatusSeeOther {
		t.Fatalf("a plain rename: %d %.300s", status, page)
	}
	// A title with a control character is refused as it is on the API.
	for _, title := range []string{"two\nlines", "esc\x1b[2J", "rtl\u202eexe"} {
		form := url.Values{"title": {title}}.Encode()
		status, _, page := srv.formPost(t, "/t/"+th.ThreadID+"/rename", "application/x-www-form-urlencoded", strings.NewReader(form), int64(len(form)))
		if status != http.StatusBadRequest || !strings.Contains(page, `data-error="invalid_request"`) || !strings.Contains(page, "control character") {
			t.Errorf("rename to %q: %d %.300s, want 400 invalid_request naming the control character", title, status, page)
		}
		_, err := srv.API().CreateThread(context.Background(), title)
		if e := apptest.Refusal(err); e == nil || e.Status != http.StatusBadRequest || e.Code != chat.CodeInvalidRequest || !strings.HasPrefix(e.Message, "title ") {
			t.Errorf("API title %q: %v, want 400 invalid_request naming title", title, err)
		}
	}
	if list := srv.Threads(); len(list) != 1 || list[0].Title != "renamed" {
		t.Errorf("threads now %+v, want only %q", list, "renamed")
	}
	if left := tempFiles(t, tmp); len(left) > 0 {
		t.Errorf("left in the server's temporary folder: %s", strings.Join(left, ", "))
	}
	srv.Stop()
}

// No code of the gateway parses a request body in a way that can write a
// temporary file: multipart parsing (directly, or through FormValue and
// PostFormValue, which fall back to it) is not used anywhere.
func TestNoMultipartParsing(t *testing.T) {
	banned := []string{".FormValue(", ".PostFormValue(", ".ParseMultipartForm(", ".MultipartReader(", ".FormFile("}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			for _, b := range banned {
				if strings.Contains(line, b) {
					t.Errorf("%s:%d calls %s): read forms through web's post wrapper (r.PostForm) instead", path, n, strings.TrimSuffix(b, "("))
				}
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}
