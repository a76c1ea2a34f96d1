package app_test

// Authentication of a whole gateway (-auth password or header:
// Config.AuthMode): header mode's users, the sign-in brake, the owner
// getting in while addresses rotate, sign-out ending a WebSocket, and one
// user never seeing another's conversations. The serve flags that refuse
// an unsafe start and the account and token commands are tested in the
// root package, through the binary.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
	"github.com/honestcancel/gateway/internal/apptest"
)

// -auth header: the trusted proxy (here: the test, from 127.0.0.1) names
// the user; without the header nothing is served; each name is its own
// account.
func TestAuthHeaderMode(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	srv := apptest.Start(t, headerConfig(t, db, "127.0.0.1/32", "X-Test-User"))
	carol := who{proxy: [2]string{"X-Test-User", "Carol"}}
	dave := who{proxy: [2]string{"X-Test-User", "dave"}}
	wantUnauthorized(srv, who{}, "GET", "/api/threads", "no proxy header")
	wantUnauthorized(srv, who{header: http.Header{"X-Forwarded-User": {"carol"}}}, "GET", "/api/threads", "the default header when -auth-header names another")
	th := as(srv, carol).NewThread("carol's")
	if got := threadList(srv, carol); len(got) != 1 || got[0] != th.ThreadID {
		t.Fatalf("carol lists %v, want [%s]", got, th.ThreadID)
	}
	if got := threadList(srv, dave); len(got) != 0 {
		t.Fatalf("dave lists %v, want nothing", got)
	}
	if _, err := as(srv, dave).API().Thread(context.Background(), th.ThreadID); apptest.RefusedStatus(err) != http.StatusNotFound {
		t.Fatalf("dave reads carol's thread: %v, want 404", err)
	}
	// A name that is no user name is refused, not mapped to someone.
	resp, raw := send(srv, who{header: http.Header{"X-Test-User": {"carol smith"}}}, "GET", "/api/threads", nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("X-Test-User \"carol smith\": %d %s, want 403", resp.StatusCode, raw)
	}
	// The page shows who is signed in and offers no sign-out (the proxy
	// owns the session); without the header it explains instead of
	// redirecting to a sign-in form that cannot work.
	resp, raw = send(srv, carol, "GET", "/", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `data-testid="account-name">carol<`) || strings.Contains(string(raw), `data-testid="logout"`) {
		t.Errorf("GET / as carol: %d, want 200 naming carol without a sign-out button; body %.500s", resp.StatusCode, raw)
	}
	resp, raw = send(srv, who{}, "GET", "/", nil)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(raw), `data-testid="refused"`) {
		t.Errorf("GET / without the header: %d, want 401 with the refusal page; body %.300s", resp.StatusCode, raw)
	}
	srv.Stop()
	checkDB(t, db)
}

// The sign-in brake: 3 free failures per user name, then a lock of 1 s
// (doubling); while locked even the right password is refused 429 with
// Retry-After, without being checked. Another account is not locked by
// it. A client address gets 9 free failures over all names.
func TestLoginBruteForce(t *testing.T) {
	const pw, bobPW = "correct horse battery", "bobs password here"
	db := dbWithFastUser(t, "alice", pw)
	addFastUser(t, db, "bob", bobPW)
	addFastUser(t, db, "carol", "carols password")
	srv := apptest.Start(t, authConfig(t, db, auth.ModePassword, ""))

	for i := 1; i <= 4; i++ {
		wantSignInRefused(srv, "alice", fmt.Sprintf("guess %d", i), http.StatusUnauthorized, fmt.Sprintf("wrong password %d of 4 (not locked yet)", i))
	}
	resp := wantSignInRefused(srv, "alice", "guess 5", http.StatusTooManyRequests, "a 5th wrong password right after the 4th")
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > 60 {
		t.Errorf("429 Retry-After %q, want whole seconds from 1 to 60", resp.Header.Get("Retry-After"))
	}
	_, body, _ := login(srv, "alice", pw, "/", nil)
	if !strings.Contains(body, "too many failed sign-ins") {
		t.Errorf("the locked sign-in page does not say why: %.500s", body)
	}
	locked := time.Now()
	resp = wantSignInRefused(srv, "alice", pw, http.StatusTooManyRequests, "the right password while locked")
	if resp.Header.Get("Retry-After") == "" {
		t.Error("a locked sign-in with the right password has no Retry-After")
	}
	// Locking alice does not lock bob out (4 failures counted from this
	// address so far, under its 9).
	bob := who{cookie: signIn(srv, "bob", bobPW)}
	threadList(srv, bob)

	// The lock ends by itself: the right password works again within
	// Retry-After (plus slack). Refused attempts while locked are not
	// failures, so polling does not extend it.
	deadline := locked.Add(time.Duration(retry)*time.Second + 5*time.Second)
	for {
		resp, _, cookie := login(srv, "alice", pw, "/", nil)
		if resp.StatusCode == http.StatusSeeOther && cookie != "" {
			break
		}
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("sign in as alice while waiting for the lock to end: %d, want 429 then 303", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice is still locked %v after the lock began (Retry-After %d)", time.Since(locked), retry)
		}
		time.Sleep(100 * time.Millisecond) // polling a condition with a deadline
	}

	// One address guessing many names: 9 free failures, then locked for
	// every name, existing or not, even with the right password. The
	// address already has alice's 4 failures (a success clears only the
	// name's record, so a valid account cannot reset its address's brake):
	// 6 more reach 10, and the 10th locks. The lock (1 s) starts when the
	// 10th is admitted, before its password is checked, so the 10th is a
	// wrong password of carol's fast hash: an unknown name is checked
	// against a dummy hash at the default cost, which under -race on a
	// loaded machine took about 1.2 s an attempt in a CI run, longer
	// than the lock, and the next attempt was admitted.
	for i := 1; i <= 5; i++ {
		wantSignInRefused(srv, fmt.Sprintf("nobody%d", i), "whatever pw", http.StatusUnauthorized, fmt.Sprintf("unknown name %d of 5 from one address", i))
	}
	wantSignInRefused(srv, "carol", "whatever pw", http.StatusUnauthorized, "the 10th failure from one address")
	wantSignInRefused(srv, "nobody7", "whatever pw", http.StatusTooManyRequests, "a failure after the 10th from one address")
	wantSignInRefused(srv, "bob", bobPW, http.StatusTooManyRequests, "bob's right password from a locked address")
	// Sessions already open are not affected by the brake.
	threadList(srv, bob)

	srv.Stop()
	checkDB(t, db)
}

// Issue 30's attack through the real sign-in form, behind a trusted proxy
// whose X-Forwarded-For names a new client address for every wrong
// password: the account takes 10 from addresses it does not know, then
// slows them (429, Retry-After at most 60 s, the page saying how to
// pass). Alice still gets in at once: from her browser, which signed in
// before (its device cookie), at a new address; and from her home address
// without any cookie. (The long run, one a second for ten minutes, is
// TestRotatingAddressesCannotKeepTheOwnerOut with a clock the test moves.)
func TestLoginOwnerGetsInWhileAddressesRotate(t *testing.T) {
	const pw = "correct horse battery"
	db := dbWithFastUser(t, "alice", pw)
	srv := apptest.Start(t, authConfig(t, db, auth.ModePassword, "127.0.0.1"))
	from := func(addr string, cookies ...string) http.Header {
		h := http.Header{"X-Forwarded-For": {addr}}
		if len(cookies) > 0 {
			h.Set("Cookie", strings.Join(cookies, "; "))
		}
		return h
	}
	resp, _, _ := login(srv, "alice", pw, "/", from("198.51.100.1"))
	var device string
	for _, c := range resp.Cookies() {
		if c.Name == "gateway_device" && c.HttpOnly && c.MaxAge > 0 {
			device = c.Name + "=" + c.Value
		}
	}
	if resp.StatusCode != http.StatusSeeOther || device == "" {
		t.Errorf("alice signs in at home: %d, device cookie %q; want 303 with an HttpOnly gateway_device cookie", resp.StatusCode, device)
	}

	began := time.Now()
	checked := 0
	for i := 1; ; i++ {
		resp, body, _ := login(srv, "alice", fmt.Sprintf("guess %d", i), "/", from(fmt.Sprintf("203.0.113.%d", i)))
		if resp.StatusCode == http.StatusUnauthorized {
			checked++
			if allowed := 10 + int(time.Since(began)/time.Minute); checked > allowed {
				t.Fatalf("%d wrong passwords from new addresses checked in %v, want at most %d", checked, time.Since(began), allowed)
			}
			continue
		}
		retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if resp.StatusCode != http.StatusTooManyRequests || err != nil || retry < 1 || retry > 60 || !strings.Contains(body, "signed in to it before") {
			t.Errorf("wrong password %d from a new address: %d Retry-After %q; want 429 with Retry-After 1 to 60 saying how to pass; body %.400s", i, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		break
	}
	if checked < 10 {
		t.Errorf("the account slowed strangers after %d wrong passwords, want 10", checked)
	}
	// A stranger's browser with the right password is slowed too …
	wantSignInRefused(srv, "alice", pw, http.StatusTooManyRequests, "the right password from a browser and address alice does not know")
	// … alice is not.
	for _, try := range []struct {
		what string
		hdr  http.Header
	}{{"her browser at a new address", from("192.0.2.7", device)}, {"her home address without cookies", from("198.51.100.1")}} {
		resp, body, session := login(srv, "alice", pw, "/", try.hdr)
		if resp.StatusCode != http.StatusSeeOther || session == "" {
			t.Errorf("alice from %s while strangers are slowed: %d; want 303 with a session; body %.300s", try.what, resp.StatusCode, body)
			continue
		}
		threadList(srv, who{cookie: session})
	}
	srv.Stop()
	if n := srv.Logged("sign-in failed"); n != checked+2 {
		t.Errorf("%d sign-in failed lines, want %d", n, checked+2)
	}
	if !regexp.MustCompile(`(?m)msg="sign-in failed" user=alice addr=203\.0\.113\.\d+ reason=slowed retry_after_seconds=\d+$`).MatchString(srv.Stderr()) {
		t.Errorf("no reason=slowed audit line for the slowed stranger:\n%s", srv.Stderr())
	}
}

// Signing out on the page (POST /logout) ends the session's open WebSocket
// at its very next command, though the server checked the session a
// moment before and trusts that answer for auth.DefaultCredentialCache:
// the sign-out went through this server, which forgets the answer. The
// command is not run; the connection closes with 1008 long before a ping
// (every 20 s) could have ended it.
func TestSignOutEndsWebSocketAtItsNextCommand(t *testing.T) {
	const pw = "correct horse battery"
	db := dbWithUser(t, "alice", pw)
	srv := apptest.Start(t, authConfig(t, db, auth.ModePassword, ""))
	alice := who{cookie: signIn(srv, "alice", pw)}
	other := who{cookie: signIn(srv, "alice", pw)} // another browser: stays signed in
	th := as(srv, alice).CreateThread()
	ws := mustDialWS(srv, alice, "alice's cookie")
	if a := ws.cmd(map[string]any{"type": "subscribe", "thread_id": th.ThreadID, "after_seq": 0}); a["type"] != "ack" {
		t.Fatalf("subscribe: %v", a)
	}
	checked := time.Now() // the subscribe's ack: its check is cached
	if resp, _ := send(srv, alice, "POST", "/logout", nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("POST /logout: %d, want 303", resp.StatusCode)
	}
	ws.send(map[string]any{"type": "run.start", "id": "after-sign-out", "thread_id": th.ThreadID,
		"expected_state_version": th.StateVersion, "user_message": "short: sent after the sign-out"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, frame, err := ws.conn.Read(ctx)
		if err == nil {
			if bytes.Contains(frame, []byte(`"after-sign-out"`)) {
				t.Fatalf("the command after the sign-out was answered: %s", frame)
			}
			continue
		}
		if st := websocket.CloseStatus(err); st != websocket.StatusPolicyViolation {
			t.Fatalf("the signed-out socket ended with %v (status %d), want a 1008 close", err, st)
		}
		break
	}
	if took := time.Since(checked); took >= auth.DefaultCredentialCache {
		t.Logf("the close came %v after the last check, past the cache time: this run did not exercise the cache", took)
	}
	if after := as(srv, other).Snapshot(th.ThreadID); after.StateVersion != th.StateVersion {
		t.Fatalf("a signed-out session's command changed the thread: v%d -> v%d", th.StateVersion, after.StateVersion)
	}
	srv.Stop()
	checkDB(t, db)
}

func TestUsersSeeOnlyTheirOwn(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	addUser(t, db, "alice", "correct horse battery")
	addUser(t, db, "bob", "bobs password here")
	aliceToken, _ := createToken(t, db, "alice")
	srv := apptest.Start(t, authConfig(t, db, auth.ModePassword, ""))
	alice := who{bearer: aliceToken}
	bob := who{cookie: signIn(srv, "bob", "bobs password here")}

	th := as(srv, alice).NewThread("alice's secret")
	ack := as(srv, alice).StartRun(th.ThreadID, th.StateVersion, "keep it short: alice's private question")
	waitRun(as(srv, alice), ack.RunID)
	snap := as(srv, alice).Snapshot(th.ThreadID)

	if got := threadList(srv, bob); len(got) != 0 {
		t.Fatalf("bob lists %v, want nothing", got)
	}
	// Raw: besides the 404 not_found, the whole body must not leak
	// alice's text, and the client keeps only parts of an error's body.
	notFound := func(method, path string, body any) {
		t.Helper()
		resp, raw := send(srv, bob, method, path, body)
		var e struct{ Error string }
		_ = json.Unmarshal(raw, &e)
		if resp.StatusCode != http.StatusNotFound || e.Error != "not_found" {
			t.Errorf("bob %s %s: %d %s, want 404 not_found", method, path, resp.StatusCode, raw)
		}
		if strings.Contains(string(raw), "private question") {
			t.Errorf("bob %s %s leaks alice's text: %s", method, path, raw)
		}
	}
	notFound("GET", "/api/threads/"+th.ThreadID, nil)
	notFound("GET", "/api/runs/"+ack.RunID, nil)
	notFound("GET", "/api/threads/"+th.ThreadID+"/events?after_seq=0", nil)
	notFound("GET", "/api/threads/"+th.ThreadID+"/checkpoints", nil)
	notFound("GET", "/api/threads/"+th.ThreadID+"/operations", nil)
	notFound("POST", "/api/threads/"+th.ThreadID+"/runs", map[string]any{"expected_state_version": snap.StateVersion, "user_message": "hijack"})
	notFound("POST", "/api/threads/"+th.ThreadID+"/fork", map[string]any{"from_checkpoint_id": snap.HeadCheckpointID})
	notFound("POST", "/api/runs/"+ack.RunID+"/cancel", map[string]any{})
	resp, raw := send(srv, bob, "GET", "/t/"+th.ThreadID, nil)
	if resp.StatusCode != http.StatusNotFound || strings.Contains(string(raw), "alice's secret") || strings.Contains(string(raw), "private question") {
		t.Errorf("bob GET /t/%s: %d, want 404 without alice's title or text; body %.400s", th.ThreadID, resp.StatusCode, raw)
	}
	resp, raw = send(srv, bob, "GET", "/", nil)
	if resp.StatusCode != http.StatusOK || strings.Contains(string(raw), th.ThreadID) || strings.Contains(string(raw), "alice's secret") {
		t.Errorf("bob's home page: %d lists alice's thread; body %.400s", resp.StatusCode, raw)
	}
	ws := as(srv, bob).Connect("bob's cookie")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ws.Subscribe(ctx, th.ThreadID, 0); client.ErrorCode(err) != chat.CodeNotFound {
		t.Errorf("bob subscribes to alice's thread: %v, want error not_found", err)
	}
	if _, err := ws.StartRun(ctx, client.StartRunRequest{ThreadID: th.ThreadID, ExpectedStateVersion: snap.StateVersion, UserMessage: "hijack"}); client.ErrorCode(err) != chat.CodeNotFound {
		t.Errorf("bob starts a run on alice's thread over /ws: %v, want error not_found", err)
	}
	// Nothing bob tried changed alice's thread.
	if after := as(srv, alice).Snapshot(th.ThreadID); after.StateVersion != snap.StateVersion || len(after.Messages) != len(snap.Messages) {
		t.Errorf("alice's thread changed after bob's attempts: version %d→%d, %d→%d messages", snap.StateVersion, after.StateVersion, len(snap.Messages), len(after.Messages))
	}
	if got := threadList(srv, alice); len(got) != 1 {
		t.Errorf("alice lists %v, want her one thread", got)
	}
	ws.Close()
	srv.Stop()
	checkDB(t, db)
}
