package store_test

import (
	"testing"

	"github.com/honestcancel/gateway/chat"
)

// Every user-facing write checks the owner, and a caller without a user id
// (never authenticated) owns nothing: "" must not mean "skip the check".
func TestWritesOfAnotherOrNoUserAreNotFound(t *testing.T) {
	st, _ := open(t)
	snap := newThread(t, st)
	before, err := st.Snapshot(ctx, user, snap.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	bob, err := st.Accounts().CreateUser(ctx, "bob", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{"", bob.UserID} {
		if _, err := st.StartRun(ctx, chat.StartRun{UserID: who, ThreadID: snap.ThreadID, ExpectedStateVersion: snap.StateVersion, UserMessage: text("hi")}); code(err) != chat.CodeNotFound {
			t.Errorf("%q start run: %v", who, err)
		}
		if _, err := st.SaveFragment(ctx, chat.SaveFragment{UserID: who, ThreadID: snap.ThreadID, MessageID: "msg_x", LastSeq: 1, ExpectedStateVersion: snap.StateVersion}); code(err) != chat.CodeNotFound {
			t.Errorf("%q save fragment: %v", who, err)
		}
		if _, err := st.DeleteDraft(ctx, chat.DeleteDraft{UserID: who, ThreadID: snap.ThreadID, MessageID: "msg_x", ExpectedStateVersion: snap.StateVersion}); code(err) != chat.CodeNotFound {
			t.Errorf("%q delete draft: %v", who, err)
		}
		if _, err := st.Fork(ctx, chat.Fork{UserID: who, ThreadID: snap.ThreadID, FromCheckpointID: snap.HeadCheckpointID}); code(err) != chat.CodeNotFound {
			t.Errorf("%q fork: %v", who, err)
		}
		if _, err := st.Checkout(ctx, chat.Checkout{UserID: who, ThreadID: snap.ThreadID, CheckpointID: snap.HeadCheckpointID, ExpectedStateVersion: snap.StateVersion}); code(err) != chat.CodeNotFound {
			t.Errorf("%q checkout: %v", who, err)
		}
		if err := st.RenameThread(ctx, who, snap.ThreadID, "mine now"); code(err) != chat.CodeNotFound {
			t.Errorf("%q rename: %v", who, err)
		}
		if _, err := st.Snapshot(ctx, who, snap.ThreadID); code(err) != chat.CodeNotFound {
			t.Errorf("%q snapshot: %v", who, err)
		}
	}
	after, err := st.Snapshot(ctx, user, snap.ThreadID)
	if err != nil {
		t.Fatal(err)
	}
	if after.StateVersion != before.StateVersion || after.LastSeq != before.LastSeq || after.Title != before.Title {
		t.Fatalf("a refused write changed the thread: v%d seq %d %q -> v%d seq %d %q", before.StateVersion, before.LastSeq, before.Title, after.StateVersion, after.LastSeq, after.Title)
	}
}
