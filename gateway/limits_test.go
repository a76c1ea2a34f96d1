package gateway_test

// Per-user limits (command rate, cancel reserve, connections,
// subscriptions) with several real users, and the size bound of every field
// a client sends.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
	"github.com/honestcancel/gateway/store"
)

// ---- several users ----

// userHeader names the caller to the real header-mode authenticator, as a
// trusted reverse proxy would.
const userHeader = "X-Forwarded-User"

// proxyAuth is the real header-mode authenticator (the test client is the
// trusted proxy on 127.0.0.1); a request that names nobody is "alice", so
// the harness's helpers (createThread, openSSE, …) act as alice.
type proxyAuth struct{ a *auth.Authenticator }

func (p proxyAuth) Authenticate(r *http.Request) (chat.Principal, error) {
	if r.Header.Get(userHeader) == "" {
		r = r.Clone(r.Context())
		r.Header.Set(userHeader, "alice")
	}
	return p.a.Authenticate(r)
}

func (p proxyAuth) Revalidate(ctx context.Context, pr chat.Principal) error {
	return p.a.Revalidate(ctx, pr)
}

func (p proxyAuth) RevalidateCached(ctx context.Context, pr chat.Principal) error {
	return p.a.RevalidateCached(ctx, pr)
}

// testClock is the rate limits' clock: it moves only when told, so a
// bucket holds exactly what the test gave it.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock { return &testClock{now: time.Unix(1_700_000_000, 0)} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newUsersHarness is newHarness with accounts: the real authenticator in
// header mode on the harness's store.
func newUsersHarness(t *testing.T, pace time.Duration, ws gateway.WSConfig) *harness {
	t.Helper()
	return newHarness(t, pace, withWS(ws), withAuth(func(st *store.Store) gateway.Authenticator {
		return proxyAuth{headerAuth(t, st)}
	}))
}

// headerAuth is the real authenticator in header mode, 127.0.0.1 being the
// trusted proxy, caching credentials (bearer tokens) as the server's does.
func headerAuth(t *testing.T, st *store.Store) *auth.Authenticator {
	t.Helper()
	a, err := auth.New(auth.Config{Mode: auth.ModeHeader, Store: st.Accounts(), TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		CredentialCache: auth.DefaultCredentialCache})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// dialAs connects user's WebSocket.
func (h *harness) dialAs(t *testing.T, user string) *wsClient {
	t.Helper()
	return h.dialWith(t, user, &websocket.DialOptions{HTTPHeader: http.Header{userHeader: {user}}})
}

// dialStatus tries to connect user's WebSocket and returns the HTTP status
// of the answer (101 when accepted; the connection is then closed).
func (h *harness) dialStatus(t *testing.T, user string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, h.wsURL(), &websocket.DialOptions{HTTPHeader: http.Header{userHeader: {user}}})
	if err == nil {
		conn.CloseNow()
		return http.StatusSwitchingProtocols
	}
	if resp == nil {
		t.Fatalf("dial as %s: %v", user, err)
	}
	return resp.StatusCode
}

// upgradeAs is the WebSocket upgrade request as plain HTTP, to read the
// body of a refusal.
func (h *harness) upgradeAs(user string) reply {
	h.t.Helper()
	return h.do(http.MethodGet, "/ws", nil, userHeader, user, "Connection", "Upgrade", "Upgrade", "websocket",
		"Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
}

// stream is an open event stream of one user.
type stream struct {
	resp   *http.Response
	cancel context.CancelFunc
}

func (s *stream) close() {
	s.cancel()
	s.resp.Body.Close()
}

// streamAs opens GET /api/threads/{id}/events as user and returns the
// answer; an accepted stream stays open until close (or the test's end).
// Its 200 arrives after the handler took its connection slot.
func (h *harness) streamAs(t *testing.T, user, threadID string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.srv.URL+"/api/threads/"+threadID+"/events?after_seq=0", nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set(userHeader, user)
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		cancel()
		t.Fatalf("open event stream: %v", err)
	}
	s := &stream{resp: resp, cancel: cancel}
	t.Cleanup(s.close)
	return s
}

// threadAs creates a thread owned by user.
func (h *harness) threadAs(user string) string {
	h.t.Helper()
	r := h.do(http.MethodPost, "/api/threads", `{}`, userHeader, user)
	if r.status != http.StatusCreated {
		h.t.Fatalf("%v: want 201", r)
	}
	var snap chat.Snapshot
	if err := json.Unmarshal(r.body, &snap); err != nil {
		h.t.Fatal(err)
	}
	return snap.ThreadID
}

// threadCount is how many threads user has.
func (h *harness) threadCount(user string) int {
	h.t.Helper()
	r := h.do(http.MethodGet, "/api/threads?limit=200", nil, userHeader, user)
	var p threadPage
	if r.status != http.StatusOK || json.Unmarshal(r.body, &p) != nil {
		h.t.Fatalf("%v", r)
	}
	return len(p.Threads)
}

// wantLimited checks a WebSocket answer is rate_limited and says when to
// retry.
func wantLimited(t *testing.T, what string, m map[string]any, mentions string) {
	t.Helper()
	if m["type"] != "error" || m["error"] != chat.CodeRateLimited {
		t.Errorf("%s: answered %v, want rate_limited", what, m)
		return
	}
	if secs, _ := m["retry_after_seconds"].(float64); secs < 1 {
		t.Errorf("%s: rate_limited without retry_after_seconds: %v", what, m)
	}
	if msg := wsStr(m, "message"); !strings.Contains(msg, mentions) {
		t.Errorf("%s: message %q does not mention %q", what, msg, mentions)
	}
}

// ---- tests ----

// TestUserCommandRateShared: one user's WebSocket connections and HTTP
// requests draw on one bucket: a flood over two connections gets exactly
// the burst through (the clock stands still), the rest rate_limited with
// its re and nothing executed, and an HTTP request 429 with Retry-After.
// Another user is unaffected throughout. run.cancel, on the flooding
// connection itself and over HTTP, still works: it has its own reserve,
// which only cancels use up.
func TestUserCommandRateShared(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	const burst, cancels = 10, 3
	h := newUsersHarness(t, 100*time.Millisecond, gateway.WSConfig{
		Now:         clock.Now,
		CommandRate: 1000, CommandBurst: 1000, // the connection's own bucket stays out of the way
		UserCommandRate: 1, UserCommandBurst: burst,
		CancelRate: 1, CancelBurst: cancels,
	})
	// Alice: a thread, two tabs, a run streaming (3 of her 10 tokens).
	th := h.threadAs("alice")
	a1, a2 := h.dialAs(t, "alice"), h.dialAs(t, "alice")
	a1.subscribe(th, wsAfter(0))
	runID := wsStr(a1.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": 1, "user_message": "Explain token buckets in detail"}), "run_id")
	a1.untilDeltas(th, runID, 1)
	spent := 3

	// The flood, over both tabs.
	var ids1, ids2 []string
	for i := range 10 {
		ids1 = append(ids1, a1.post(map[string]any{"type": "hello", "tab_id": fmt.Sprintf("one-%d", i)}))
		ids2 = append(ids2, a2.post(map[string]any{"type": "hello", "tab_id": fmt.Sprintf("two-%d", i)}))
	}
	acked, limited, lastTab := 0, 0, ""
	for _, x := range []struct {
		c   *wsClient
		ids []string
	}{{a1, ids1}, {a2, ids2}} {
		for _, id := range x.ids {
			switch m := x.c.answer(id); {
			case m["type"] == "ack":
				acked++
				if x.c == a1 {
					lastTab = x.c.sent[id]["tab_id"].(string)
				}
			default:
				wantLimited(t, "flood "+id, m, "your account")
				limited++
			}
		}
	}
	if acked != burst-spent || limited != 20-(burst-spent) {
		t.Errorf("flood of 20 over two tabs: %d acked, %d rate_limited; want %d and %d", acked, limited, burst-spent, 20-(burst-spent))
	}

	// Over HTTP: 429, Retry-After, a message that says what to do, and
	// nothing created.
	before := h.threadCount("alice")
	r := h.do(http.MethodPost, "/api/threads", `{"title":"refused"}`, userHeader, "alice")
	body := h.wantError(t, r, http.StatusTooManyRequests, chat.CodeRateLimited)
	if got := r.header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q, want 1 (one token a second)", got)
	}
	if body["retry_after_seconds"] != float64(1) || !strings.Contains(body["message"].(string), "wait 1 s") {
		t.Errorf("429 body %v", body)
	}
	if n := h.threadCount("alice"); n != before {
		t.Errorf("a refused request created a thread: %d -> %d", before, n)
	}
	wantLimited(t, "a run.start in the flood", a2.cmd(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": 1, "user_message": "x"}), "your account")

	// Bob is unaffected, over WebSocket and HTTP.
	bth := h.threadAs("bob")
	b := h.dialAs(t, "bob")
	b.ack(map[string]any{"type": "hello", "tab_id": "bob"})
	b.subscribe(bth, wsAfter(0))
	brun := wsStr(b.ack(map[string]any{"type": "run.start", "thread_id": bth, "expected_state_version": 1, "user_message": "Explain rate limits to bob"}), "run_id")
	if n := h.threadCount("bob"); n != 1 {
		t.Errorf("bob has %d threads", n)
	}

	// Cancel works under the flood: on the flooding tab itself, then over
	// HTTP (already requested), then once more; the reserve is spent only
	// by these.
	ack := a1.ack(map[string]any{"type": "run.cancel", "run_id": runID})
	if ack["status"] != string(chat.RunCancelRequested) || ack["already_requested"] != false {
		t.Errorf("cancel under the flood: %v", ack)
	}
	ev := a1.untilEvent(th, chat.EventRunCancelRequested, runID)
	// requested_by names the last hello of a1 that got through (none: the
	// connection id); what was refused was not executed.
	if by := wsStr(ev, "requested_by"); (lastTab != "" && by != "tab:"+lastTab) || (lastTab == "" && !strings.HasPrefix(by, "tab:con_")) {
		t.Errorf("requested_by %q, want the last hello a1 got through (%q)", by, lastTab)
	}
	a1.untilEvent(th, chat.EventRunCancelled, runID)
	var ca chat.CancelAck
	if r := h.do(http.MethodPost, "/api/runs/"+runID+"/cancel", nil, userHeader, "alice"); r.status != http.StatusAccepted || json.Unmarshal(r.body, &ca) != nil || !ca.AlreadyRequested {
		t.Errorf("HTTP cancel under the flood: %v", r)
	}
	if m := a2.cmd(map[string]any{"type": "run.cancel", "run_id": runID}); m["type"] != "ack" || m["already_requested"] != true {
		t.Errorf("third cancel: %v", m)
	}
	// Only a flood of cancels exhausts the reserve, and then loudly.
	wantLimited(t, "a fourth cancel", a2.cmd(map[string]any{"type": "run.cancel", "run_id": runID}), "cancel")
	r = h.do(http.MethodPost, "/api/runs/"+runID+"/cancel", nil, userHeader, "alice")
	h.wantError(t, r, http.StatusTooManyRequests, chat.CodeRateLimited)
	if r.header.Get("Retry-After") == "" {
		t.Errorf("cancel 429 without Retry-After")
	}
	// Bob's cancels are his own.
	if m := b.cmd(map[string]any{"type": "run.cancel", "run_id": brun}); m["type"] != "ack" {
		t.Errorf("bob's cancel: %v", m)
	}
	b.untilEvent(bth, chat.EventRunCancelled, brun)

	// One second later Alice has one token again: one command passes.
	clock.advance(time.Second)
	a1.ack(map[string]any{"type": "hello", "tab_id": "later"})
	wantLimited(t, "the next one", a1.cmd(map[string]any{"type": "hello", "tab_id": "later-2"}), "your account")
	if run := h.run(runID); run.Status != chat.RunCancelled {
		t.Errorf("run %s", run.Status)
	}
}

// TestCancelSkipsConnectionBucket: a tab that used up its own connection's
// budget can still cancel.
func TestCancelSkipsConnectionBucket(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	h := newUsersHarness(t, 100*time.Millisecond, gateway.WSConfig{Now: clock.Now, CommandRate: 1, CommandBurst: 3})
	th := h.threadAs("alice")
	c := h.dialAs(t, "alice")
	c.subscribe(th, wsAfter(0))
	runID := wsStr(c.ack(map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": 1, "user_message": "Explain backpressure"}), "run_id")
	c.ack(map[string]any{"type": "hello", "tab_id": "busy"})
	wantLimited(t, "over the connection's budget", c.cmd(map[string]any{"type": "hello", "tab_id": "more"}), "this connection")
	if m := c.cmd(map[string]any{"type": "run.cancel", "run_id": runID}); m["type"] != "ack" || m["status"] != string(chat.RunCancelRequested) {
		t.Fatalf("cancel: %v", m)
	}
	c.untilEvent(th, chat.EventRunCancelled, runID)
}

// TestUserConnectionLimit: WebSocket connections and event streams of one
// user share one bound; over it the upgrade or stream is refused with 429
// in the protocol's JSON shape before anything starts; another user has
// its own; closing one frees a slot.
func TestUserConnectionLimit(t *testing.T) {
	t.Parallel()
	h := newUsersHarness(t, time.Millisecond, gateway.WSConfig{MaxConnsPerUser: 3})
	th := h.threadAs("alice")
	a1, a2 := h.dialAs(t, "alice"), h.dialAs(t, "alice")
	s1 := h.streamAs(t, "alice", th)
	if s1.resp.StatusCode != http.StatusOK {
		t.Fatalf("first stream: %d", s1.resp.StatusCode)
	}
	if got := h.dialStatus(t, "alice"); got != http.StatusTooManyRequests {
		t.Errorf("fourth connection: status %d, want 429", got)
	}
	body := h.wantError(t, h.upgradeAs("alice"), http.StatusTooManyRequests, chat.CodeRateLimited)
	if msg := body["message"].(string); !strings.Contains(msg, "3 open connections") || !strings.Contains(msg, "close") {
		t.Errorf("message %q", msg)
	}
	h.wantError(t, h.do(http.MethodGet, "/api/threads/"+th+"/events?after_seq=0", nil, userHeader, "alice"), http.StatusTooManyRequests, chat.CodeRateLimited)

	// Bob has his own three.
	bth := h.threadAs("bob")
	h.dialAs(t, "bob")
	h.dialAs(t, "bob")
	if s := h.streamAs(t, "bob", bth); s.resp.StatusCode != http.StatusOK {
		t.Errorf("bob's stream: %d", s.resp.StatusCode)
	}
	if got := h.dialStatus(t, "bob"); got != http.StatusTooManyRequests {
		t.Errorf("bob's fourth: %d", got)
	}

	// Alice's connections still work; closing one frees its slot (the
	// server lets go of it when its handler ends, so retry until then).
	a2.ack(map[string]any{"type": "hello", "tab_id": "still-here"})
	if err := a1.conn.Close(websocket.StatusNormalClosure, "done"); err != nil {
		t.Fatalf("close: %v", err)
	}
	var a3 *wsClient
	retryUntil(t, "a connection after closing one", func() bool {
		a3 = h.tryDialAs(t, "alice")
		return a3 != nil
	})
	a3.ack(map[string]any{"type": "hello", "tab_id": "third"})
	if got := h.dialStatus(t, "alice"); got != http.StatusTooManyRequests {
		t.Errorf("full again: status %d, want 429", got)
	}
	s1.close()
	retryUntil(t, "a stream after closing one", func() bool {
		s := h.streamAs(t, "alice", th)
		if s.resp.StatusCode != http.StatusOK {
			s.close()
			return false
		}
		return true
	})
	h.wantError(t, h.upgradeAs("alice"), http.StatusTooManyRequests, chat.CodeRateLimited)
}

// tryDialAs connects user's WebSocket, or returns nil when refused with
// 429.
func (h *harness) tryDialAs(t *testing.T, user string) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, h.wsURL(), &websocket.DialOptions{HTTPHeader: http.Header{userHeader: {user}}})
	if err != nil {
		if resp == nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("dial as %s: %v", user, err)
		}
		return nil
	}
	conn.SetReadLimit(16 << 20)
	t.Cleanup(func() { conn.CloseNow() })
	return &wsClient{t: t, name: user, conn: conn, sent: map[string]map[string]any{}, answered: map[string]int{}, views: map[string]*wsView{}}
}

// retryUntil retries try until it holds, at most waitTimeout.
func retryUntil(t *testing.T, what string, try func() bool) {
	t.Helper()
	for deadline := time.Now().Add(waitTimeout); time.Now().Before(deadline); {
		if try() {
			return
		}
	}
	t.Fatalf("%s: not within %v", what, waitTimeout)
}

// TestUserSubscriptionLimit: subscriptions count per user over all its
// connections; over the bound subscribe answers rate_limited and changes
// nothing (no events of that thread arrive); resubscribing a watched
// thread does not count twice; an unsubscribe or a closed connection frees
// slots; another user has its own.
func TestUserSubscriptionLimit(t *testing.T) {
	t.Parallel()
	h := newUsersHarness(t, time.Millisecond, gateway.WSConfig{MaxSubscriptionsPerUser: 3, MaxSubscriptions: 10})
	t1, t2, t3, t4, t5 := h.threadAs("alice"), h.threadAs("alice"), h.threadAs("alice"), h.threadAs("alice"), h.threadAs("alice")
	a1, a2 := h.dialAs(t, "alice"), h.dialAs(t, "alice")
	a1.subscribe(t1, wsAfter(0))
	a1.subscribe(t2, nil)
	a2.subscribe(t3, wsAfter(1))
	wantLimited := func(what string, m map[string]any) {
		t.Helper()
		if m["type"] != "error" || m["error"] != chat.CodeRateLimited || !strings.Contains(wsStr(m, "message"), "3 threads") {
			t.Errorf("%s: %v", what, m)
		}
	}
	wantLimited("a fourth on another tab", a2.cmd(map[string]any{"type": "subscribe", "thread_id": t4, "after_seq": int64(0)}))
	wantLimited("a fourth on the first tab", a1.cmd(map[string]any{"type": "subscribe", "thread_id": t4}))
	a1.subscribe(t1, wsAfter(1)) // already watched: no new slot

	// Nothing changed: t4's run reaches neither tab.
	s := h.openSSE(t4, "after_seq=0", "")
	run := h.startRun(t4, 1, "short one")
	s.waitType(chat.EventRunCompleted, run.RunID)
	for _, c := range []*wsClient{a1, a2} {
		for _, m := range c.sync() {
			if m["thread_id"] == t4 {
				t.Errorf("%s got an event of the refused thread: %v", c.name, m)
			}
		}
	}

	// Bob has his own.
	b := h.dialAs(t, "bob")
	for range 3 {
		b.subscribe(h.threadAs("bob"), nil)
	}

	// An unsubscribe frees one slot; a closed connection all of its own.
	a1.ack(map[string]any{"type": "unsubscribe", "thread_id": t2})
	a2.subscribe(t4, wsAfter(0))
	wantLimited("again full", a2.cmd(map[string]any{"type": "subscribe", "thread_id": t5}))
	if err := a1.conn.Close(websocket.StatusNormalClosure, "done"); err != nil {
		t.Fatalf("close: %v", err)
	}
	retryUntil(t, "a subscribe after the other tab closed", func() bool {
		m := a2.cmd(map[string]any{"type": "subscribe", "thread_id": t5, "after_seq": int64(0)})
		if m["type"] == "error" && m["error"] != chat.CodeRateLimited {
			t.Fatalf("subscribe: %v", m)
		}
		return m["type"] == "ack"
	})
	// a1 held t1 only; a2 now holds t3, t4, t5: full again.
	wantLimited("full after the close", a2.cmd(map[string]any{"type": "subscribe", "thread_id": t1}))
}

// TestUserLimitsFreed: the per-user table holds a user while it has
// connections, streams, subscriptions or a bucket not yet refilled, and
// forgets every user once all of that has ended.
func TestUserLimitsFreed(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	h := newUsersHarness(t, time.Millisecond, gateway.WSConfig{Now: clock.Now})
	ath, bth := h.threadAs("alice"), h.threadAs("bob")
	a1, a2, b := h.dialAs(t, "alice"), h.dialAs(t, "alice"), h.dialAs(t, "bob")
	a1.subscribe(ath, wsAfter(0))
	a2.subscribe(ath, nil)
	b.subscribe(bth, wsAfter(0))
	s := h.streamAs(t, "alice", ath)
	if s.resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", s.resp.StatusCode)
	}
	// Carol only ever sends one HTTP request.
	h.wantError(t, h.do(http.MethodPost, "/api/threads/"+bth+"/fork", `{}`, userHeader, "carol"), http.StatusBadRequest, chat.CodeInvalidRequest)
	if n := h.api.TrackedUsers(); n != 3 {
		t.Errorf("%d users tracked, want 3", n)
	}

	// Long after (every bucket full again), everything closes.
	clock.advance(time.Hour)
	for _, c := range []*wsClient{a1, a2, b} {
		if err := c.conn.Close(websocket.StatusNormalClosure, "bye"); err != nil {
			t.Errorf("close %s: %v", c.name, err)
		}
	}
	s.close()
	// Wait for the server's handlers: the WebSocket ones (every client has
	// already closed, so this closes nothing) and the stream's.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	h.api.CloseWebSockets(ctx)
	h.srv.Close()
	if n := h.api.TrackedUsers(); n != 0 {
		t.Errorf("%d users still tracked after everything closed", n)
	}
}

// TestUserLimitsTableBounded: users who only ever send a request or two
// do not pile up: once their buckets have refilled, the next new user that
// finds the table at its sweep size forgets them all, and so does any call
// a minute after the last sweep.
func TestUserLimitsTableBounded(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	h := newUsersHarness(t, time.Millisecond, gateway.WSConfig{Now: clock.Now})
	touch := func(user string) {
		t.Helper()
		h.wantError(t, h.do(http.MethodPost, "/api/threads/thr_x/fork", `{}`, userHeader, user), http.StatusBadRequest, chat.CodeInvalidRequest)
	}
	const n = 64 // the table's first sweep size
	for i := range n {
		touch(fmt.Sprintf("u%02d", i))
	}
	if got := h.api.TrackedUsers(); got != n {
		t.Fatalf("%d users tracked, want %d", got, n)
	}
	// Every bucket refills within seconds; well before the minute sweep.
	clock.advance(10 * time.Second)
	touch("late")
	if got := h.api.TrackedUsers(); got != 1 {
		t.Errorf("%d users tracked after a sweep, want 1 (the new one)", got)
	}
	clock.advance(2 * time.Minute)
	touch("u00")
	if got := h.api.TrackedUsers(); got != 1 {
		t.Errorf("%d users tracked a minute later, want 1", got)
	}
}

// TestFieldLimits: every string a client sends has a bound; one byte over
// it is invalid_request naming the field and the limit, executes nothing,
// and the answer never echoes the oversized value.
func TestFieldLimits(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Millisecond, withWS(gateway.WSConfig{
		CommandRate: 1000, CommandBurst: 1000, UserCommandRate: 1000, UserCommandBurst: 1000,
	}))
	snap := h.createThread("")
	th := snap.ThreadID
	runAck, reply := h.runToEnd(th, 1, "short question")
	cur := h.snapshot(th)
	v := cur.StateVersion
	id65 := "thr_" + strings.Repeat("0", 61)
	x := func(n int) string { return strings.Repeat("x", n) }
	huge := x(100 << 10)

	c := h.dial(t)
	wsCases := []struct {
		name   string
		fields map[string]any
		want   []string // in the message
	}{
		{"hello tab_id", map[string]any{"type": "hello", "tab_id": x(65)}, []string{"tab_id", "64"}},
		{"subscribe thread_id", map[string]any{"type": "subscribe", "thread_id": id65}, []string{"thread_id", "64"}},
		{"unsubscribe thread_id", map[string]any{"type": "unsubscribe", "thread_id": id65}, []string{"thread_id", "64"}},
		{"run.start thread_id", map[string]any{"type": "run.start", "thread_id": id65, "expected_state_version": v, "user_message": "hi"}, []string{"thread_id", "64"}},
		{"run.start user_message", map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v, "user_message": x(32769)}, []string{"user_message", "32768"}},
		{"run.start client_request_id", map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v, "user_message": "hi", "client_request_id": x(129)}, []string{"client_request_id", "128"}},
		{"run.start resume_from_checkpoint_id", map[string]any{"type": "run.start", "thread_id": th, "expected_state_version": v, "resume_from_checkpoint_id": "cp_" + x(62)}, []string{"resume_from_checkpoint_id", "64"}},
		{"run.cancel run_id", map[string]any{"type": "run.cancel", "run_id": "run_" + x(61)}, []string{"run_id", "64"}},
		{"run.cancel reason", map[string]any{"type": "run.cancel", "run_id": runAck.RunID, "reason": x(201)}, []string{"reason", "200"}},
		{"fragment.save thread_id", map[string]any{"type": "fragment.save", "thread_id": id65, "message_id": reply.MessageID, "last_seq": 3, "expected_state_version": v}, []string{"thread_id", "64"}},
		{"fragment.save message_id", map[string]any{"type": "fragment.save", "thread_id": th, "message_id": "msg_" + x(61), "last_seq": 3, "expected_state_version": v}, []string{"message_id", "64"}},
		{"draft.delete thread_id", map[string]any{"type": "draft.delete", "thread_id": id65, "message_id": reply.MessageID, "expected_state_version": v}, []string{"thread_id", "64"}},
		{"draft.delete message_id", map[string]any{"type": "draft.delete", "thread_id": th, "message_id": "msg_" + x(61), "expected_state_version": v}, []string{"message_id", "64"}},
		{"thread.fork thread_id", map[string]any{"type": "thread.fork", "thread_id": id65, "from_checkpoint_id": cur.HeadCheckpointID}, []string{"thread_id", "64"}},
		{"thread.fork from_checkpoint_id", map[string]any{"type": "thread.fork", "thread_id": th, "from_checkpoint_id": "cp_" + x(62)}, []string{"from_checkpoint_id", "64"}},
		{"thread.checkout thread_id", map[string]any{"type": "thread.checkout", "thread_id": id65, "checkpoint_id": cur.HeadCheckpointID, "expected_state_version": v}, []string{"thread_id", "64"}},
		{"thread.checkout checkpoint_id", map[string]any{"type": "thread.checkout", "thread_id": th, "checkpoint_id": "cp_" + x(62), "expected_state_version": v}, []string{"checkpoint_id", "64"}},
		{"tool.confirm operation_id", map[string]any{"type": "tool.confirm", "operation_id": "op_" + x(62), "expected_state_version": v}, []string{"operation_id", "64"}},
		{"tool.reject operation_id", map[string]any{"type": "tool.reject", "operation_id": "op_" + x(62), "expected_state_version": v}, []string{"operation_id", "64"}},
		{"an unknown field with a huge name", map[string]any{"type": "hello", "tab_id": "t", huge: 1}, []string{"unknown field"}},
		{"a huge unknown type", map[string]any{"type": huge}, []string{"unknown command type"}},
	}
	before := h.snapshotBytes(th)
	nThreads := h.threadCount("")
	for _, tc := range wsCases {
		m := c.cmd(tc.fields)
		msg := wsStr(m, "message")
		if m["type"] != "error" || m["error"] != chat.CodeInvalidRequest {
			t.Errorf("%s: answered %.300v, want invalid_request", tc.name, m)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: message %q does not name %q", tc.name, msg, w)
			}
		}
		if len(msg) > 300 {
			t.Errorf("%s: a message of %d bytes", tc.name, len(msg))
		}
	}
	// The command id: one over is refused without being echoed; at the
	// limit it is echoed.
	c.sendRaw(websocket.MessageText, []byte(fmt.Sprintf(`{"type":"hello","id":%q,"tab_id":"t"}`, x(129))))
	m := c.read(time.Now().Add(waitTimeout))
	if _, hasRe := m["re"]; m["error"] != chat.CodeInvalidRequest || hasRe || !strings.Contains(wsStr(m, "message"), `"id"`) || !strings.Contains(wsStr(m, "message"), "128") {
		t.Errorf("an id of 129 bytes: %v", m)
	}
	c.sendRaw(websocket.MessageText, []byte(fmt.Sprintf(`{"type":"hello","id":%q,"tab_id":"t"}`, x(128))))
	if m := c.read(time.Now().Add(waitTimeout)); m["type"] != "ack" || m["re"] != x(128) {
		t.Errorf("an id of 128 bytes: %v", m)
	}
	// Ids at the limit pass validation (and are simply unknown).
	if m := c.cmd(map[string]any{"type": "subscribe", "thread_id": "thr_" + x(60)}); m["error"] != chat.CodeNotFound {
		t.Errorf("a thread_id of 64 bytes: %v", m)
	}

	p := "/api/threads/" + th
	httpCases := []struct {
		name, method, path, body string
		want                     []string
	}{
		{"title", "POST", "/api/threads", fmt.Sprintf(`{"title":%q}`, x(201)), []string{"title", "200"}},
		{"user_message", "POST", p + "/runs", fmt.Sprintf(`{"expected_state_version":%d,"user_message":%q}`, v, x(32769)), []string{"user_message", "32768"}},
		{"client_request_id", "POST", p + "/runs", fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi","client_request_id":%q}`, v, x(129)), []string{"client_request_id", "128"}},
		{"resume_from_checkpoint_id", "POST", p + "/runs", fmt.Sprintf(`{"expected_state_version":%d,"resume_from_checkpoint_id":%q}`, v, "cp_"+x(62)), []string{"resume_from_checkpoint_id", "64"}},
		{"thread id in the path of runs", "POST", "/api/threads/" + id65 + "/runs", fmt.Sprintf(`{"expected_state_version":%d,"user_message":"hi"}`, v), []string{"thread_id", "path", "64"}},
		{"thread id in the path", "GET", "/api/threads/" + id65, "", []string{"thread_id", "64"}},
		{"thread id of checkpoints", "GET", "/api/threads/" + id65 + "/checkpoints", "", []string{"thread_id", "64"}},
		{"thread id of operations", "GET", "/api/threads/" + id65 + "/operations", "", []string{"thread_id", "64"}},
		{"thread id of events", "GET", "/api/threads/" + id65 + "/events", "", []string{"thread_id", "64"}},
		{"run id", "GET", "/api/runs/run_" + x(61), "", []string{"run_id", "64"}},
		{"run id of cancel", "POST", "/api/runs/run_" + x(61) + "/cancel", `{}`, []string{"run_id", "64"}},
		{"reason", "POST", "/api/runs/" + runAck.RunID + "/cancel", fmt.Sprintf(`{"reason":%q}`, x(201)), []string{"reason", "200"}},
		{"fragment message_id", "POST", p + "/fragments", fmt.Sprintf(`{"message_id":%q,"last_seq":3,"expected_state_version":%d}`, "msg_"+x(61), v), []string{"message_id", "64"}},
		{"fragment thread id", "POST", "/api/threads/" + id65 + "/fragments", fmt.Sprintf(`{"message_id":%q,"last_seq":3,"expected_state_version":%d}`, reply.MessageID, v), []string{"thread_id", "64"}},
		{"draft message id", "POST", p + "/drafts/msg_" + x(61) + "/delete", fmt.Sprintf(`{"expected_state_version":%d}`, v), []string{"message_id", "64"}},
		{"draft thread id", "POST", "/api/threads/" + id65 + "/drafts/" + reply.MessageID + "/delete", fmt.Sprintf(`{"expected_state_version":%d}`, v), []string{"thread_id", "64"}},
		{"fork from_checkpoint_id", "POST", p + "/fork", fmt.Sprintf(`{"from_checkpoint_id":%q}`, "cp_"+x(62)), []string{"from_checkpoint_id", "64"}},
		{"fork thread id", "POST", "/api/threads/" + id65 + "/fork", fmt.Sprintf(`{"from_checkpoint_id":%q}`, cur.HeadCheckpointID), []string{"thread_id", "64"}},
		{"operation id of confirm", "POST", "/api/operations/op_" + x(62) + "/confirm", fmt.Sprintf(`{"expected_state_version":%d}`, v), []string{"operation_id", "64"}},
		{"operation id of reject", "POST", "/api/operations/op_" + x(62) + "/reject", fmt.Sprintf(`{"expected_state_version":%d}`, v), []string{"operation_id", "64"}},
		{"cursor", "GET", "/api/threads?cursor=" + x(129), "", []string{"cursor", "128"}},
		{"q", "GET", "/api/threads?q=" + x(201), "", []string{"q", "200"}},
		{"body over 1 MiB", "POST", p + "/runs", fmt.Sprintf(`{"expected_state_version":%d,"user_message":%q}`, v, x(1<<20)), []string{"request body", "1048576"}},
		{"an unknown field with a huge name", "POST", "/api/threads", fmt.Sprintf(`{%q:1}`, huge), []string{"unknown field"}},
	}
	for _, tc := range httpCases {
		var body any
		if tc.body != "" {
			body = tc.body
		}
		b := h.wantError(t, h.do(tc.method, tc.path, body), http.StatusBadRequest, chat.CodeInvalidRequest)
		msg, _ := b["message"].(string)
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: message %q does not name %q", tc.name, msg, w)
			}
		}
		if len(msg) > 300 {
			t.Errorf("%s: a message of %d bytes", tc.name, len(msg))
		}
	}
	if got := h.snapshotBytes(th); got != before {
		t.Errorf("the thread changed")
	}
	if n := h.threadCount(""); n != nThreads {
		t.Errorf("%d threads, want %d", n, nThreads)
	}
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("refused commands emitted %v", extra)
	}
}
