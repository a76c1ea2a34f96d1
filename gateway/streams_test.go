package gateway_test

// Long-lived responses against the end of their credential: an event
// stream and a WebSocket connection opened with a session or a token end
// within one keep-alive of the credential ending, whatever ended it, and a
// connection of any mode ends at MaxConnAge.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
	"github.com/honestcancel/gateway/internal/apptest"
)

// rawStream is an event stream read line by line, comments and error
// events included, until the server ends it.
type rawStream struct {
	lines <-chan string // closed when the server ends the response
	stop  func()        // cancels the request and waits for the reader
}

// openRawStream opens thread's event stream as who with Last-Event-ID
// lastID ("" for none) and returns the answer's status; on 200 the body is
// read into the returned stream, closed at the end of the test.
func openRawStream(t *testing.T, who apiCaller, threadID, lastID string) (int, *rawStream) {
	t.Helper()
	status, lines, stop := apptest.OpenEventLines(t, who.srv.Client(), who.srv.URL+"/api/threads/"+threadID+"/events?after_seq=0", who.header(), lastID)
	if status != http.StatusOK {
		return status, nil
	}
	return status, &rawStream{lines: lines, stop: stop}
}

// untilEnd reads the stream until the server ends it and returns every
// line; it fails the test if the stream is still open after waitTimeout.
func (s *rawStream) untilEnd(t *testing.T) []string {
	t.Helper()
	got, ended := apptest.ReadLinesToEnd(s.lines, waitTimeout)
	if !ended {
		t.Fatalf("event stream still open after %v; read %s", waitTimeout, summary(got))
	}
	return got
}

// summary shows the first and last lines of a stream read, and how many
// there were.
func summary(lines []string) string {
	if len(lines) <= 10 {
		return fmt.Sprintf("%q", lines)
	}
	return fmt.Sprintf("%d lines: %q … %q", len(lines), lines[:6], lines[len(lines)-4:])
}

// lastEvent returns the event name and data of the last event in lines,
// and the highest id seen.
func lastEvent(lines []string) (name, data, lastID string) {
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "event: "):
			name, data = strings.TrimPrefix(l, "event: "), ""
		case strings.HasPrefix(l, "data: "):
			data = strings.TrimPrefix(l, "data: ")
		case strings.HasPrefix(l, "id: "):
			lastID = strings.TrimPrefix(l, "id: ")
		}
	}
	return name, data, lastID
}

// TestStreamsEndWhenTheirCredentialEnds: one table of the ways a
// credential ends. For each, a user holds an event stream and a WebSocket
// connection on their thread, opened with a session or a token; the
// credential is ended out of band (as `gateway user …` or another tab
// does); the stream then ends with an `error` event carrying unauthorized,
// the connection closes 1008, the stream's reconnect is answered 401, and
// the thread is as it was.
func TestStreamsEndWhenTheirCredentialEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newAuthHarness(t, gateway.WSConfig{})
	srv, a := h.passwordServerWith(t, 30*time.Millisecond, gateway.WSConfig{PingInterval: 30 * time.Millisecond})
	type credential int
	const (
		session credential = iota
		token
	)
	cases := []struct {
		name string
		cred credential
		end  func(name, tokenID string) error
	}{
		{"session, signed out everywhere (gateway user signout)", session, func(name, _ string) error {
			_, err := h.st.Accounts().EndSessions(ctx, name)
			return err
		}},
		{"session, password changed (gateway user passwd)", session, func(name, _ string) error {
			hash, err := auth.HashPassword("a new password entirely", 4)
			if err != nil {
				return err
			}
			return h.st.Accounts().SetPassword(ctx, name, hash)
		}},
		{"session, account deleted (gateway user delete)", session, func(name, _ string) error { return h.st.Accounts().DeleteUser(ctx, name) }},
		{"token, revoked (gateway token revoke)", token, func(_, id string) error { return h.st.Accounts().RevokeToken(ctx, id) }},
		{"token, password reset with --revoke-tokens", token, func(name, _ string) error {
			hash, err := auth.HashPassword("a new password entirely", 4)
			if err != nil {
				return err
			}
			_, err = h.st.Accounts().ResetPassword(ctx, name, hash, true)
			return err
		}},
		{"token, account deleted", token, func(name, _ string) error { return h.st.Accounts().DeleteUser(ctx, name) }},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := "streamer" + string(rune('a'+i))
			cookie := signIn(t, h, a, name)
			who := apiCaller{name: name, srv: srv, hdr: []string{"Cookie", cookie}}
			tokenID := ""
			if c.cred == token {
				var tok chat.APIToken
				who, tok = tokenCaller(t, h, srv, name)
				tokenID = tok.TokenID
			}
			th, _ := createOwnThread(t, who)
			status, stream := openRawStream(t, who, th, "")
			if status != http.StatusOK {
				t.Fatalf("open event stream: %d", status)
			}
			conn := who.dial(t, h.harness)
			conn.subscribe(th, wsAfter(0))
			user, _, err := h.st.Accounts().UserByName(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			before, err := h.st.Snapshot(ctx, user.UserID, th)
			if err != nil {
				t.Fatal(err)
			}

			if err := c.end(name, tokenID); err != nil {
				t.Fatal(err)
			}
			lines := stream.untilEnd(t)
			ev, data, _ := lastEvent(lines)
			var body map[string]any
			if ev != "error" || json.Unmarshal([]byte(data), &body) != nil || body["error"] != chat.CodeUnauthorized || body["message"] == "" {
				t.Errorf("the stream ended with event %q data %s, want an error event carrying unauthorized and a message; read %s", ev, data, summary(lines))
			}
			if ce := conn.closed(); ce.Code != websocket.StatusPolicyViolation || ce.Reason == "" {
				t.Errorf("the WebSocket connection closed with %v, want 1008 and a reason", ce)
			}
			if again, _ := openRawStream(t, who, th, ""); again != http.StatusUnauthorized {
				t.Errorf("the stream's reconnect answered %d, want 401", again)
			}
			after, err := h.st.Snapshot(ctx, user.UserID, th)
			if err != nil {
				t.Fatal(err)
			}
			if string(jsonOf(t, before)) != string(jsonOf(t, after)) {
				t.Errorf("the thread changed:\n%s\n%s", jsonOf(t, before), jsonOf(t, after))
			}
		})
	}
}

// TestStreamsEndAtMaxConnAge: in header mode, where the server cannot ask
// the proxy again, an event stream and a WebSocket connection end at
// MaxConnAge; the stream's last line says why and its
// reconnect with Last-Event-ID resumes (the proxy authenticated it
// afresh), and the connection closes 1000 with a reason.
func TestStreamsEndAtMaxConnAge(t *testing.T) {
	t.Parallel()
	const age = 300 * time.Millisecond
	h := newAuthHarness(t, gateway.WSConfig{MaxConnAge: age})
	alice := h.proxy(t, "alice")
	who := apiCaller{name: "alice", srv: h.srv, hdr: []string{"X-Forwarded-User", "alice"}}
	th, _ := createOwnThread(t, who)
	opened := time.Now()
	status, stream := openRawStream(t, who, th, "")
	if status != http.StatusOK {
		t.Fatalf("open event stream: %d", status)
	}
	conn := who.dial(t, alice.harness)
	conn.subscribe(th, wsAfter(0))

	lines := stream.untilEnd(t)
	if took := time.Since(opened); took < age {
		t.Errorf("the stream ended after %v, before its age limit %v", took, age)
	}
	if len(lines) < 2 || !strings.Contains(lines[len(lines)-2], "connection age limit") {
		t.Errorf("the stream's last lines %s, want a comment naming the age limit", summary(lines))
	}
	_, _, lastID := lastEvent(lines)
	if status, again := openRawStream(t, who, th, lastID); status != http.StatusOK {
		t.Errorf("the reconnect with Last-Event-ID %s answered %d, want 200", lastID, status)
	} else {
		again.stop()
	}
	if ce := conn.closed(); ce.Code != websocket.StatusNormalClosure || !strings.Contains(ce.Reason, "age limit") {
		t.Errorf("the WebSocket connection closed with %v, want 1000 naming the age limit", ce)
	}
}
