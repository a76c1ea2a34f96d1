package apptest

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// OpenEventLines opens the event stream at url with c, sending header and,
// unless lastID is "", Last-Event-ID lastID, and returns the answer's
// status. On 200 the body is read line by line, raw (comments and error
// events included, each line without its "\n"), into lines, which closes
// when the server ends the response; stop cancels the request and waits
// for the reader, as the end of the test does. On any other status the
// body is discarded and lines and stop are nil.
//
// For tests whose subject is how the server ends a response, which
// client.Stream turns into a reconnection or an error without showing it.
func OpenEventLines(t testing.TB, c *http.Client, url string, header http.Header, lastID string) (status int, lines <-chan string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header = header.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := c.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("open event stream: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cancel()
		return resp.StatusCode, nil, nil
	}
	out := make(chan string, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		defer resp.Body.Close()
		r := bufio.NewReader(resp.Body)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			select {
			case out <- strings.TrimSuffix(line, "\n"):
			case <-ctx.Done():
				return
			}
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return http.StatusOK, out, stop
}

// ReadLinesToEnd collects lines until the channel closes (the server ended
// the response) and reports true, or until limit has passed, when it
// returns what arrived by then and false.
func ReadLinesToEnd(lines <-chan string, limit time.Duration) ([]string, bool) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var got []string
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return got, true
			}
			got = append(got, l)
		case <-timer.C:
			return got, false
		}
	}
}
