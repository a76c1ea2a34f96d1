package store_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/honestcancel/gateway/chat"
)

// ThreadEvents answers exactly what Events answers its owner, for no user
// at all (the event bus recovering what it missed).
func TestThreadEventsIsEventsWithoutTheOwner(t *testing.T) {
	st, _ := open(t)
	snap := newThread(t, st)
	streamAndCancel(t, st, snap.ThreadID, 1, "a", "b", "c")
	cur, _ := st.Snapshot(ctx, user, snap.ThreadID)
	for _, after := range []int64{0, 1, cur.LastSeq - 2, cur.LastSeq, cur.LastSeq + 1} {
		want, err := st.Events(ctx, user, snap.ThreadID, after)
		if err != nil {
			t.Fatal(err)
		}
		got, err := st.ThreadEvents(ctx, snap.ThreadID, after)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("after %d: ThreadEvents = %+v, Events = %+v", after, got, want)
		}
	}
	all, _ := st.ThreadEvents(ctx, snap.ThreadID, 0)
	if !all.Complete || int64(len(all.Events)) != cur.LastSeq || all.LastSeq != cur.LastSeq || all.StateVersion != cur.StateVersion {
		t.Fatalf("replay from 0 = complete %v, %d events, last %d v%d; thread at %d v%d",
			all.Complete, len(all.Events), all.LastSeq, all.StateVersion, cur.LastSeq, cur.StateVersion)
	}
	if _, err := st.ThreadEvents(ctx, "thr_nope", 0); code(err) != chat.CodeNotFound {
		t.Fatalf("unknown thread = %v", err)
	}
}

func TestLastSeqs(t *testing.T) {
	st, _ := open(t)
	a, b := newThread(t, st), newThread(t, st)
	streamAndCancel(t, st, b.ThreadID, 1, "x", "y")
	curB, _ := st.Snapshot(ctx, user, b.ThreadID)
	got, err := st.LastSeqs(ctx, []string{a.ThreadID, "thr_nope", b.ThreadID})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{a.ThreadID: a.LastSeq, b.ThreadID: curB.LastSeq}; !reflect.DeepEqual(got, want) {
		t.Fatalf("LastSeqs = %v, want %v", got, want)
	}
	if got, err := st.LastSeqs(ctx, nil); err != nil || len(got) != 0 {
		t.Fatalf("LastSeqs(nil) = %v, %v", got, err)
	}
	// More ids than one query takes, known ones among them.
	ids := make([]string, 0, 1203)
	for i := range 1200 {
		ids = append(ids, fmt.Sprintf("thr_missing%04d", i))
	}
	ids = append(ids, b.ThreadID, a.ThreadID, b.ThreadID)
	got, err = st.LastSeqs(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[a.ThreadID] != a.LastSeq || got[b.ThreadID] != curB.LastSeq {
		t.Fatalf("LastSeqs of %d ids = %v", len(ids), got)
	}
}
