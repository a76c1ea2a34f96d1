package store_test

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// Admission (docs/protocol.md): runs are claimed in arrival order, except that
// a user who holds their share of executing runs (Options.MaxRunsPerUser)
// is skipped until one of theirs ends; QueueState counts a run's place in
// that same order, and says when its user is at their share.
func TestClaimsKeepArrivalOrderAndEachUsersShare(t *testing.T) {
	// A clock that moves on a millisecond at each reading: every run
	// arrives at a time of its own, so arrival order is not left to ids.
	var tick atomic.Int64
	base := time.Now()
	st, _ := openStoreWith(t, true, store.Options{MaxRunsPerUser: 2,
		Clock: func() time.Time { return base.Add(time.Duration(tick.Add(1)) * time.Millisecond) }})
	bob, err := st.Accounts().CreateUser(ctx, "bob", "")
	if err != nil {
		t.Fatal(err)
	}
	startAs := func(userID string) string {
		t.Helper()
		th, err := st.CreateThread(ctx, userID, "t")
		if err != nil {
			t.Fatal(err)
		}
		ack, err := st.StartRun(ctx, chat.StartRun{UserID: userID, ThreadID: th.ThreadID, ExpectedStateVersion: th.StateVersion, UserMessage: ptr("go")})
		if err != nil {
			t.Fatal(err)
		}
		return ack.RunID
	}
	// Three runs of one user, then one of another.
	var local []string
	for range 3 {
		local = append(local, startAs(user))
	}
	bobs := startAs(bob.UserID)

	wantState := func(runID string, pos int, atShare bool) {
		t.Helper()
		gotPos, gotShare, err := st.QueueState(ctx, runID)
		if err != nil || gotPos != pos || gotShare != atShare {
			t.Errorf("QueueState(%s) = %d, %v, %v; want %d, %v", runID, gotPos, gotShare, err, pos, atShare)
		}
	}
	for i, id := range append(local, bobs) {
		wantState(id, i+1, false)
	}

	claimAll := func() []*chat.Claim {
		t.Helper()
		var out []*chat.Claim
		for range 10 {
			batch, err := st.ClaimBatch(ctx, "w", time.Hour, 16)
			if err != nil {
				t.Fatal(err)
			}
			if len(batch) == 0 {
				return out
			}
			out = append(out, batch...)
		}
		t.Fatal("claims did not run out")
		return nil
	}
	ids := func(cs []*chat.Claim) string {
		var s []string
		for _, c := range cs {
			s = append(s, c.Run.RunID)
		}
		return strings.Join(s, ",")
	}
	// The third run of the first user waits although it came before bob's:
	// that user holds their share of two.
	claims := claimAll()
	if got, want := ids(claims), strings.Join([]string{local[0], local[1], bobs}, ","); got != want {
		t.Fatalf("claimed %s, want %s (the user's third run skipped)", got, want)
	}
	wantState(local[2], 1, true)
	wantState(local[0], 0, false) // claimed: it no longer waits

	// A run of another user that arrives after it is ahead of it in line.
	bob2 := startAs(bob.UserID)
	wantState(bob2, 1, false)

	// One of the first user's runs ends: their waiting run is next.
	c := claims[0]
	if _, _, err := st.RequestCancel(ctx, chat.CancelRun{UserID: user, RunID: c.Run.RunID, Reason: chat.ReasonUserRequested, RequestedBy: "tab:a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinishCancel(ctx, c.Run.RunID, &c.Lease, 0); err != nil {
		t.Fatal(err)
	}
	wantState(local[2], 1, false)
	if got, want := ids(claimAll()), local[2]+","+bob2; got != want {
		t.Fatalf("after a run of theirs ended, claimed %s; want %s", got, want)
	}
	if n, err := st.QueuedRuns(ctx); err != nil || n != 0 {
		t.Errorf("QueuedRuns = %d, %v; want 0", n, err)
	}
}

// StartRunClaimed claims the run it starts in the same commit when the
// caller's spare slots cover every other run waiting and the user is below
// their share; otherwise the run waits queued for ClaimBatch, in order. The
// run.started event and the ack say which: running or queued.
func TestStartClaimsItsRunOnlyWhenNoneWaitsBeforeIt(t *testing.T) {
	var mu sync.Mutex
	started := map[string]chat.RunStatus{}
	st, _ := openStoreWith(t, true, store.Options{MaxRunsPerUser: 2, OnCommit: func(evs []*chat.Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range evs {
			if b, ok := ev.Body.(chat.RunStartedBody); ok && ev.Type == chat.EventRunStarted {
				started[ev.RunID] = b.Status
			}
		}
	}})
	bob, err := st.Accounts().CreateUser(ctx, "bob", "")
	if err != nil {
		t.Fatal(err)
	}
	start := func(userID string, spare int) (chat.RunStartAck, *chat.Claim) {
		t.Helper()
		th, err := st.CreateThread(ctx, userID, "t")
		if err != nil {
			t.Fatal(err)
		}
		ack, claim, err := st.StartRunClaimed(ctx, chat.StartRun{UserID: userID, ThreadID: th.ThreadID,
			ExpectedStateVersion: th.StateVersion, UserMessage: ptr("go")}, "w", time.Hour, spare)
		if err != nil {
			t.Fatal(err)
		}
		return ack, claim
	}
	want := func(what, userID string, ack chat.RunStartAck, claim *chat.Claim, claimed bool) {
		t.Helper()
		status := chat.RunQueued
		if claimed {
			status = chat.RunRunning
		}
		mu.Lock()
		event := started[ack.RunID]
		mu.Unlock()
		run, err := st.Run(ctx, userID, ack.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if (claim != nil) != claimed || ack.Status != status || event != status || run.Status != status {
			t.Fatalf("%s: claim %+v, ack %s, run.started %s, run %s; want claimed %v (%s)",
				what, claim, ack.Status, event, run.Status, claimed, status)
		}
		if claimed && (claim.Run.RunID != ack.RunID || claim.Lease != (chat.Lease{RunID: ack.RunID, Owner: "w", Epoch: 1})) {
			t.Fatalf("%s: claim %+v for run %s", what, claim, ack.RunID)
		}
	}
	if onPostgres() {
		// A start there is a transaction of its own and claims nothing.
		ack, claim := start(user, 10)
		want("on PostgreSQL", user, ack, claim, false)
		return
	}

	first, claim := start(user, 0)
	want("nothing waits", user, first, claim, true)
	if cs, err := st.ClaimBatch(ctx, "w", time.Hour, 16); err != nil || len(cs) != 0 {
		t.Fatalf("ClaimBatch after a claimed start: %d claims, %v; want none", len(cs), err)
	}

	// A run that waits (started without a claim) comes first: a start
	// with no spare slot for it leaves its own run queued behind it; one
	// with a spare slot for it claims its own.
	waiting, err := st.StartRun(ctx, chat.StartRun{UserID: bob.UserID, ThreadID: mustThread(t, st, bob.UserID),
		ExpectedStateVersion: 1, UserMessage: ptr("go")})
	if err != nil {
		t.Fatal(err)
	}
	behind, claim := start(user, 0)
	want("one waits, no spare slot", user, behind, claim, false)
	ahead, claim := start(bob.UserID, 2)
	want("two wait, two spare slots", bob.UserID, ahead, claim, true)

	// The user's share (2): user holds first; behind waits. Claimed in
	// order, behind makes two, and a third start of user's waits.
	cs, err := st.ClaimBatch(ctx, "w", time.Hour, 16)
	if err != nil || len(cs) != 2 || cs[0].Run.RunID != waiting.RunID || cs[1].Run.RunID != behind.RunID {
		t.Fatalf("ClaimBatch: %d claims, %v; want %s then %s", len(cs), err, waiting.RunID, behind.RunID)
	}
	third, claim := start(user, 10)
	want("at the user's share", user, third, claim, false)
}

// mustThread creates a thread of userID and returns its id.
func mustThread(t *testing.T, st *store.Store, userID string) string {
	t.Helper()
	th, err := st.CreateThread(ctx, userID, "t")
	if err != nil {
		t.Fatal(err)
	}
	return th.ThreadID
}
