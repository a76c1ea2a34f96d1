package gateway_test

// Ownership (issue #8): with accounts, everything a user creates is theirs
// alone. Another authenticated user naming any of it — on every HTTP route,
// the event stream and every WebSocket command — gets not_found, exactly as
// for an id that never existed, and nothing changes; callers without valid
// credentials get 401 before anything runs; and a page of another site
// cannot drive a signed-in user's browser.
//
// The routes and commands are not listed by hand only: they are read from
// the package's source (every mux.Handle / HandleFunc pattern, every case
// of the WebSocket dispatch), so a route or command added later without an
// ownership case here fails TestOwnershipCoversEveryRouteAndCommand.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/honestcancel/gateway/auth"
	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/gateway"
)

// TestOwnershipForeignIDsAreNotFound: three more users — bob (trusted proxy
// header), carol (bearer token) and dave (password session) — try every
// route, the event stream and every WebSocket command on each of Alice's
// ids (threads, completed / cancelled / waiting runs, messages, a draft, a
// streamed message, checkpoints, a pending operation) with values that
// would succeed for her. Each is answered not_found, indistinguishable
// from an id that never existed; their lists never show her threads; and
// nothing of hers (or theirs) changed. Then Alice repeats the commands and
// none is not_found for her: the probes named real objects.
func TestOwnershipForeignIDsAreNotFound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newAuthHarness(t, generousLimits())
	alice := h.proxy(t, "alice")
	w := buildWorld(t, h, alice)

	bob := apiCaller{name: "bob", srv: h.srv, hdr: []string{"X-Forwarded-User", "bob"}}
	if _, err := h.st.Accounts().CreateUser(ctx, "carol", ""); err != nil {
		t.Fatal(err)
	}
	carol, _ := tokenCaller(t, h, h.srv, "carol")
	pwSrv, pwAuth := h.passwordServer(t)
	dave := apiCaller{name: "dave", srv: pwSrv, hdr: []string{"Cookie", signIn(t, h, pwAuth, "dave")}}

	own := map[string]string{} // thread -> its owner's user id
	ownThreads := map[string]string{}
	ownVersions := map[string]int64{}
	for _, who := range []apiCaller{bob, carol, dave} {
		th, v := createOwnThread(t, who)
		ownThreads[who.name], ownVersions[who.name] = th, v
		u, _, err := h.st.Accounts().UserByName(ctx, who.name)
		if err != nil {
			t.Fatal(err)
		}
		own[th] = u.UserID
	}
	var firstPage threadPage
	alice.call(http.MethodGet, "/api/threads?limit=1", nil, http.StatusOK, &firstPage)
	if firstPage.NextCursor == nil {
		t.Fatal("alice's first page of one thread has no next_cursor")
	}

	before := stateOf(t, h, alice, w, own)
	for _, who := range []apiCaller{bob, carol, dave} {
		n := attack(t, h, who, ownThreads[who.name], ownershipProbes(w, ownThreads[who.name], ownVersions[who.name]))
		t.Logf("%s: %v", who.name, n)
		wantOnlyOwnThreads(t, who, []string{ownThreads[who.name]}, w, *firstPage.NextCursor)
	}
	// The users are isolated from each other too, not only from Alice.
	for _, pair := range [][2]apiCaller{{bob, carol}, {carol, dave}, {dave, bob}} {
		th := ownThreads[pair[1].name]
		for _, r := range []probeRequest{reqSnapshot(th), reqEvents(th, "after_seq=0", ""), reqFork(th, "cp_x"),
			reqRunStart(th, map[string]any{"expected_state_version": ownVersions[pair[1].name], "user_message": "short: hi"})} {
			wantRefusal(t, pair[0].name+" on "+pair[1].name+"'s thread", pair[0].send(t, r.method, r.path, r.body, r.hdr...), chat.CodeNotFound)
		}
	}
	after := stateOf(t, h, alice, w, own)
	wantSameState(t, "a refused command", before, after)
	if ops := alice.operations(w.t2); len(ops) != 1 || ops[0].Phase != chat.PhasePrepared {
		t.Errorf("alice's operation after the attempts: %+v, want still prepared", ops)
	}
	wantNoViolations(t, h)

	// Control: the same commands from Alice, at versions one behind (so
	// that nothing but the cancel of r3 and the forks runs), are never
	// not_found: each probe named something that exists and is hers.
	stale := *w
	stale.version = map[string]int64{}
	for th, v := range w.version {
		stale.version[th] = v - 1
	}
	aliceCaller := apiCaller{name: "alice", srv: h.srv, hdr: []string{"X-Forwarded-User", "alice"}}
	s2 := alice.openSSE(w.t2, "after_seq="+strconv.FormatInt(alice.snapshot(w.t2).LastSeq, 10), "")
	r3Waiting := alice.run(w.r3).Status == chat.RunWaitingConfirmation // else a failure above already ended it
	replayed := 0
	for _, p := range ownershipProbes(&stale, w.t1, w.version[w.t1]) {
		r := p.build(p.foreign)
		if !p.replay || r.route == "" {
			continue
		}
		got := aliceCaller.send(t, r.method, r.path, r.body, r.hdr...)
		if got.status == http.StatusNotFound {
			t.Errorf("control: alice's own %s %s %s is %v: the probe named nothing of hers", p.name, r.method, r.path, got)
		}
		replayed++
	}
	t.Logf("control: alice replayed %d probes; none was not_found", replayed)
	if r3Waiting {
		waitRunEnd(t, s2, w.r3, chat.EventRunCancelled) // the control's cancel of r3, finished before cleanup
	}
}

// TestOwnershipLiveThreadStaysPrivate: while Alice's run streams, bob
// keeps trying to subscribe to her thread (with and without after_seq),
// to open its event stream and to cancel the run: every attempt is
// not_found, not one of her events reaches him, and her run completes
// uncancelled. The attempts go on while her thread moves (bounded in
// rounds and time), and fail the test unless it moved during them.
func TestOwnershipLiveThreadStaysPrivate(t *testing.T) {
	t.Parallel()
	h := newAuthHarness(t, generousLimits())
	alice := h.proxy(t, "alice")
	bob := apiCaller{name: "bob", srv: h.srv, hdr: []string{"X-Forwarded-User", "bob"}}
	bobThread, _ := createOwnThread(t, bob)

	th := alice.createThread("alice: live").ThreadID
	s := alice.openSSE(th, "after_seq=0", "")
	h.model.setPace(10 * time.Millisecond)
	run := alice.startRun(th, 1, "Explain in detail how tides depend on the moon and the sun").RunID
	s.waitDeltas(run, 2)
	h.model.setPace(time.Millisecond)

	c := bob.dial(t, h.harness)
	c.subscribe(bobThread, wsAfter(0))
	start := alice.snapshot(th).LastSeq
	deadline := time.Now().Add(waitTimeout)
	const rounds, moved, enough = 500, 3, 20
	tried, done := 0, 0
	for done < rounds && time.Now().Before(deadline) {
		done++
		var ids []string
		for _, f := range []map[string]any{
			{"type": "subscribe", "thread_id": th},
			{"type": "subscribe", "thread_id": th, "after_seq": int64(0)},
			{"type": "subscribe", "thread_id": th, "after_seq": start},
			{"type": "run.cancel", "run_id": run},
		} {
			ids = append(ids, c.post(f))
		}
		for _, id := range ids {
			if m := c.answer(id); m["type"] != "error" || m["error"] != chat.CodeNotFound {
				t.Fatalf("bob's %v on alice's live thread answered %v, want not_found", c.sent[id], m)
			}
		}
		tried += len(ids)
		r := reqEvents(th, "after_seq=0", "")
		wantRefusal(t, "bob's event stream of alice's live thread", bob.send(t, r.method, r.path, nil), chat.CodeNotFound)
		tried++
		// Keep going while her run streams (the more overlap the better),
		// within the bounds.
		if now := alice.snapshot(th); now.LastSeq >= start+enough || now.ActiveRun == nil {
			break
		}
	}
	if last := alice.snapshot(th).LastSeq; last < start+moved {
		t.Errorf("alice's thread moved from seq %d to %d during %d rounds of attempts: they did not overlap her run", start, last, done)
	}
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("bob's connection received %d objects: %v", len(extra), extra)
	}
	t.Logf("bob: %d attempts in %d rounds while alice's thread moved from seq %d to %d", tried, done, start, alice.snapshot(th).LastSeq)
	waitRunEnd(t, s, run, chat.EventRunCompleted)
	if r := alice.run(run); r.Status != chat.RunCompleted || r.CancelRequestedAt != nil {
		t.Errorf("alice's run after bob's cancels: %+v", r)
	}
	if extra := c.sync(); len(extra) != 0 {
		t.Errorf("bob's connection received %d objects after her run ended: %v", len(extra), extra)
	}
}

// TestOwnershipRevokedTokenIsUnauthorized: a bearer token works until it is
// revoked; then every route answers 401 unauthorized, the WebSocket upgrade
// too, and a connection opened with it is closed (1008) at its next
// revalidation. The token's user's thread is untouched.
func TestOwnershipRevokedTokenIsUnauthorized(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newAuthHarness(t, gateway.WSConfig{PingInterval: 50 * time.Millisecond})
	if _, err := h.st.Accounts().CreateUser(ctx, "carol", ""); err != nil {
		t.Fatal(err)
	}
	carol, tok := tokenCaller(t, h, h.srv, "carol")
	th, v := createOwnThread(t, carol)
	c := carol.dial(t, h.harness)
	c.subscribe(th, wsAfter(0))
	snap := func() string {
		s, err := h.st.Snapshot(ctx, tok.UserID, th)
		if err != nil {
			t.Fatal(err)
		}
		return string(jsonOf(t, s))
	}
	before := snap()

	if err := h.st.Accounts().RevokeToken(ctx, tok.TokenID); err != nil {
		t.Fatal(err)
	}
	w := fakeWorld()
	w.t1, w.version[th], w.head[th] = th, v, chat.NewID(chat.PrefixCheckpoint)
	n := 0
	for _, p := range registeredRoutes(t) {
		if routeCoverage[p] == routePublic {
			continue
		}
		r, ok := sampleRequest(t, p, w)
		if !ok {
			continue
		}
		wantRefusal(t, "revoked token: "+p, carol.send(t, r.method, r.path, r.body, r.hdr...), chat.CodeUnauthorized)
		n++
	}
	if got := dialStatus(t, h.srv, carol.header()); got != http.StatusUnauthorized {
		t.Errorf("WebSocket upgrade with a revoked token: %d, want 401", got)
	}
	if ce := c.closed(); ce.Code != websocket.StatusPolicyViolation || ce.Reason == "" {
		t.Errorf("the open connection of a revoked token closed with %v, want 1008 and a reason", ce)
	}
	if after := snap(); after != before {
		t.Errorf("carol's thread changed:\n%s\n%s", before, after)
	}
	t.Logf("revoked token: %d routes answered 401, the upgrade too, the open connection closed", n)
}

// TestUnauthenticatedRequestsAreRefused: every registered route (but the
// health checks) without credentials, or with bad ones, answers 401
// unauthorized (403 forbidden for a proxy-named user that cannot exist)
// before anything runs — in header mode and in password mode — including
// the WebSocket upgrade; the requests name Alice's ids with values that
// would succeed for her, and nothing of hers changes, no account and no
// thread is created.
func TestUnauthenticatedRequestsAreRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newAuthHarness(t, gateway.WSConfig{})
	alice := h.proxy(t, "alice")
	w := buildWorld(t, h, alice)
	pwSrv, _ := h.passwordServer(t)
	tok, _, err := auth.CreateToken(ctx, h.st.Accounts(), "alice", "test", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	before := stateOf(t, h, alice, w, nil)

	const unauth, forbidden = chat.CodeUnauthorized, chat.CodeForbidden
	type variant struct {
		name string
		srv  *httptest.Server
		hdr  []string
		code string
	}
	variants := []variant{
		{"header mode, no credentials", h.srv, nil, unauth},
		{"header mode, an empty proxy header", h.srv, []string{"X-Forwarded-User", ""}, unauth},
		{"header mode, Basic credentials", h.srv, []string{"Authorization", "Basic YWxpY2U6c2VjcmV0"}, unauth},
		{"header mode, a malformed bearer token", h.srv, []string{"Authorization", "Bearer not-a-token"}, unauth},
		{"header mode, an unknown bearer token", h.srv, []string{"Authorization", "Bearer tok_00000000000000000000000000.c2VjcmV0"}, unauth},
		{"header mode, alice's token id with a wrong secret", h.srv, []string{"Authorization", "Bearer " + tok.TokenID + ".wrong"}, unauth},
		{"header mode, a bad bearer token next to alice's proxy header", h.srv, []string{"X-Forwarded-User", "alice", "Authorization", "Bearer tok_x.y"}, unauth},
		{"header mode, a session cookie", h.srv, []string{"Cookie", auth.SessionCookie + "=abc"}, unauth},
		{"header mode, a proxy-named user that cannot exist", h.srv, []string{"X-Forwarded-User", "alice smith!"}, forbidden},
		{"password mode, no cookie", pwSrv, nil, unauth},
		{"password mode, an unknown session cookie", pwSrv, []string{"Cookie", auth.SessionCookie + "=not-a-session"}, unauth},
		{"password mode, a proxy header", pwSrv, []string{"X-Forwarded-User", "alice"}, unauth},
		{"password mode, an unknown bearer token", pwSrv, []string{"Authorization", "Bearer tok_00000000000000000000000000.c2VjcmV0"}, unauth},
	}
	requests := 0
	routes := registeredRoutes(t)
	for _, p := range routes {
		r, ok := sampleRequest(t, p, w)
		if !ok {
			continue
		}
		if got := routedTo(h.mux, r); got != p {
			t.Errorf("sample %s %s reaches %q, want %q", r.method, r.path, got, p)
		}
		for _, v := range variants {
			got := httpSend(t, v.srv, r.method, r.path, r.body, append(slices.Clone(v.hdr), r.hdr...)...)
			requests++
			if routeCoverage[p] == routePublic {
				// Health checks need no credentials and tell nothing.
				var body map[string]any
				if (got.status != http.StatusOK && got.status != http.StatusServiceUnavailable) ||
					json.Unmarshal(got.body, &body) != nil || len(body) != 1 || body["status"] == nil {
					t.Errorf("%s: %s: %v, want a bare health answer", v.name, p, got)
				}
				continue
			}
			wantRefusal(t, v.name+": "+p, got, v.code)
		}
	}
	dials := 0
	for _, v := range variants {
		if got := dialStatus(t, v.srv, apiCaller{hdr: v.hdr}.header()); got != map[string]int{unauth: 401, forbidden: 403}[v.code] {
			t.Errorf("%s: WebSocket upgrade answered %d, want %s", v.name, got, v.code)
		}
		dials++
	}
	wantSameState(t, "an unauthenticated request", before, stateOf(t, h, alice, w, nil))
	wantNoViolations(t, h)
	t.Logf("%d routes × %d credential variants = %d requests and %d WebSocket dials refused", len(routes), len(variants), requests, dials)
}

// TestCrossOriginWithCredentialsIsRefused: a page of another site driving a
// signed-in browser: every state-changing route, sent with Alice's
// credentials and a body that would succeed for her, is refused 403
// forbidden when the browser says cross-site or same-site, or sends a
// foreign Origin; nothing changes. Without credentials the answer is 401
// (authentication comes first). The WebSocket upgrade from a foreign
// origin is refused 403 with her credentials; from her own page it
// connects, and so does a same-origin API request.
func TestCrossOriginWithCredentialsIsRefused(t *testing.T) {
	t.Parallel()
	h := newAuthHarness(t, gateway.WSConfig{})
	alice := h.proxy(t, "alice")
	w := buildWorld(t, h, alice)
	before := stateOf(t, h, alice, w, nil)
	creds := []string{"X-Forwarded-User", "alice"}
	foreign := [][]string{
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
		{"Origin", "https://evil.example"},
		{"Origin", "null"},
		{"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"},
	}
	n := 0
	for _, p := range registeredRoutes(t) {
		if !strings.HasPrefix(p, http.MethodPost+" ") {
			continue // only POST routes change state (the /api/ fallback changes nothing)
		}
		r, ok := sampleRequest(t, p, w)
		if !ok {
			continue
		}
		for _, f := range foreign {
			got := httpSend(t, h.srv, r.method, r.path, r.body, append(slices.Clone(creds), f...)...)
			wantRefusal(t, fmt.Sprintf("%s with alice's credentials and %v", p, f), got, chat.CodeForbidden)
			n++
		}
		got := httpSend(t, h.srv, r.method, r.path, r.body, foreign[0]...)
		wantRefusal(t, p+" cross-site without credentials", got, chat.CodeUnauthorized)
	}
	if n == 0 {
		t.Fatal("no state-changing route found")
	}

	hdr := apiCaller{hdr: creds}.header()
	for _, origin := range []string{"https://evil.example", "null"} {
		hdr.Set("Origin", origin)
		if got := dialStatus(t, h.srv, hdr); got != http.StatusForbidden {
			t.Errorf("WebSocket upgrade from %s with alice's credentials: %d, want 403", origin, got)
		}
		r := httpSend(t, h.srv, http.MethodGet, "/ws", nil, append(slices.Clone(creds), append([]string{"Origin", origin}, upgradeHeaders...)...)...)
		wantRefusal(t, "upgrade from "+origin+" with alice's credentials", r, chat.CodeForbidden)
		r = httpSend(t, h.srv, http.MethodGet, "/ws", nil, append([]string{"Origin", origin}, upgradeHeaders...)...)
		wantRefusal(t, "upgrade from "+origin+" without credentials", r, chat.CodeUnauthorized)
	}
	wantSameState(t, "a cross-origin request", before, stateOf(t, h, alice, w, nil))
	wantNoViolations(t, h)

	// Her own page passes, over HTTP and WebSocket.
	hdr.Set("Origin", h.srv.URL)
	if got := dialStatus(t, h.srv, hdr); got != http.StatusSwitchingProtocols {
		t.Errorf("WebSocket upgrade from alice's own page: %d, want 101", got)
	}
	if r := httpSend(t, h.srv, http.MethodPost, "/api/threads", map[string]any{}, append(slices.Clone(creds), "Origin", h.srv.URL, "Sec-Fetch-Site", "same-origin")...); r.status != http.StatusCreated {
		t.Errorf("same-origin create with alice's credentials: %v, want 201", r)
	}
	t.Logf("%d cross-origin requests with credentials refused", n)
}
