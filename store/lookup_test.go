package store_test

import (
	"slices"
	"testing"

	"github.com/honestcancel/gateway/chat"
)

// MessagesByID finds messages on any branch of the thread, in the order
// asked and each once, and leaves out what is not the thread's (another
// thread's, another user's, unknown) and a fragment deleted since; the
// byte budget stops the answer, but never before its first message.
func TestMessagesByIDOnAnyBranchOfTheThreadOnly(t *testing.T) {
	st, _ := open(t)
	th := newThread(t, st)
	_, a1 := completeRun(t, st, th.ThreadID, "first question", "first answer")
	_, a2 := completeRun(t, st, th.ThreadID, "second question", "second answer")
	snap, err := st.Snapshot(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	u1, u2 := snap.Messages[0].MessageID, snap.Messages[2].MessageID
	// Back to the point after the first answer, and on from there: the
	// second exchange is now on another branch.
	_, cps, err := st.Checkpoints(ctx, user, th.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	var afterA1 string
	for _, c := range cps {
		if len(c.MessageIDs) == 2 && c.MessageIDs[1] == a1 {
			afterA1 = c.CheckpointID
		}
	}
	if _, err := st.Checkout(ctx, chat.Checkout{UserID: user, ThreadID: th.ThreadID, CheckpointID: afterA1, ExpectedStateVersion: snap.StateVersion}); err != nil {
		t.Fatal(err)
	}
	_, a3 := completeRun(t, st, th.ThreadID, "third question", "third answer")
	// A fragment saved, then deleted.
	_, streamed, last := streamAndCancel(t, st, th.ThreadID, version(t, st, th.ThreadID), "half ", "said")
	saved := saveDraft(t, st, th.ThreadID, streamed, last)
	deleteDraft(t, st, th.ThreadID, saved.MessageID)
	other := newThread(t, st)
	_, foreign := completeRun(t, st, other.ThreadID, "elsewhere", "another thread's answer")

	got, err := st.MessagesByID(ctx, user, th.ThreadID, []string{a2, u1, "msg_unknown", foreign, saved.MessageID, a2, a3, u2}, chat.HistoryPageBytes)
	if err != nil {
		t.Fatal(err)
	}
	var ids, texts []string
	for _, m := range got {
		ids = append(ids, m.MessageID)
		texts = append(texts, m.Content)
	}
	if want := []string{a2, u1, a3, u2}; !slices.Equal(ids, want) {
		t.Fatalf("ids %v (%v), want %v", ids, texts, want)
	}
	if texts[0] != "second answer" || texts[3] != "second question" {
		t.Errorf("the other branch's messages hold %q", texts)
	}

	// The budget: past it, the answer stops; its first message always comes.
	got, err = st.MessagesByID(ctx, user, th.ThreadID, []string{a2, u1}, 3)
	if err != nil || len(got) != 1 || got[0].MessageID != a2 {
		t.Errorf("within 3 bytes: %v, %v; want only the first", got, err)
	}

	// Another user's thread is not found, whatever ids are named; none is
	// a message of the caller's own thread.
	bob, err := st.Accounts().CreateUser(ctx, "bob", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.MessagesByID(ctx, bob.UserID, th.ThreadID, []string{a2}, chat.HistoryPageBytes); code(err) != chat.CodeNotFound {
		t.Errorf("bob on alice's thread: %v", err)
	}
	bobs, err := st.CreateThread(ctx, bob.UserID, "bob's")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := st.MessagesByID(ctx, bob.UserID, bobs.ThreadID, []string{a2, u1}, chat.HistoryPageBytes); err != nil || len(got) != 0 {
		t.Errorf("alice's messages named on bob's thread: %v, %v", got, err)
	}
}
