package app_test

// The page forms share the per-user command budget with the API. (The
// bodies they must refuse, with the binary's TMPDIR watched for files
// left behind, are tested in the root package, through the binary.)

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/honestcancel/gateway/internal/apptest"
)

// formPost sends a POST to the gateway (redirects not followed) and returns
// the status, the Retry-After header and the body.
//
// It reads the answer while the body is still being written, as a browser
// does, on a connection of its own: a server that refuses a body it will
// not read answers at once and then resets the connection, and
// http.Client reports whichever of the answer and the reset its select
// takes first (both are ready on a loaded machine), so it would fail
// this test at random on a correct server.
func formPost(s *apptest.Server, t testing.TB, path, contentType string, body io.Reader, length int64) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.Base+path, body)
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

// The forms that change conversations draw from the user's command budget
// (shared with the API): over it they answer 429 with Retry-After and
// change nothing; sign-out is never refused for it.
func TestBinaryFormsShareTheCommandBudget(t *testing.T) {
	// 0.1 command per second, burst 1: one command, then a wait of 10 s.
	cfg := apptest.CommandConfig(filepath.Join(t.TempDir(), "gw.db"), 0)
	cfg.UserRate = 0.1
	srv := apptest.Start(t, cfg)
	form := "application/x-www-form-urlencoded"
	if status, _, page := formPost(srv, t, "/threads", form, http.NoBody, 0); status != http.StatusSeeOther {
		t.Fatalf("first new conversation: %d %.300s", status, page)
	}
	list := srv.Threads()
	if len(list) != 1 {
		t.Fatalf("%d threads after one form post", len(list))
	}
	id, title := list[0].ThreadID, list[0].Title
	for _, p := range []struct{ path, body string }{{"/threads", ""}, {"/t/" + id + "/rename", "title=over"}} {
		status, retry, page := formPost(srv, t, p.path, form, strings.NewReader(p.body), int64(len(p.body)))
		if secs, err := strconv.Atoi(retry); status != http.StatusTooManyRequests || err != nil || secs < 1 || !strings.Contains(page, `data-error="rate_limited"`) {
			t.Errorf("POST %s over the budget: %d, Retry-After %q: %.300s; want 429 rate_limited with Retry-After", p.path, status, retry, page)
		}
	}
	// The API sees the same empty budget.
	_, err := srv.API().CreateThread(context.Background(), "")
	if apptest.RefusedStatus(err) != http.StatusTooManyRequests {
		t.Errorf("API create after the forms spent the budget: %v, want 429", err)
	}
	if list := srv.Threads(); len(list) != 1 || list[0].Title != title {
		t.Errorf("threads now %+v, want only the first, titled %q", list, title)
	}
	if status, _, _ := formPost(srv, t, "/logout", form, http.NoBody, 0); status != http.StatusSeeOther {
		t.Errorf("sign-out over the budget: %d, want 303", status)
	}
}
