package engine_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/model"
)

// fakeTitler answers each title request with title (or fails when title is
// ""), recording the requests it was given.
type fakeTitler struct {
	title string
	mu    sync.Mutex
	asked [][]model.Message
}

func (f *fakeTitler) Title(_ context.Context, request []model.Message) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, request)
	if f.title == "" {
		return "", errors.New("no title today")
	}
	return f.title, nil
}

func (f *fakeTitler) requests() [][]model.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]model.Message(nil), f.asked...)
}

// runToEnd starts a run with text on the thread at its current version and
// waits for its run.completed.
func runToEnd(t *testing.T, h *harness, threadID, text string) {
	t.Helper()
	sub := h.feed.Subscribe(threadID, 1024)
	defer sub.Close()
	ack := h.startRun(threadID, h.snapshot(threadID).StateVersion, ptr(text))
	waitFor(t, sub, "run.completed", isType(chat.EventRunCompleted, ack.RunID))
}

// The first request of a conversation is given to the Titler (only that
// request, once per conversation), and its title replaces the one the store
// took from the request's start — not a title the user chose, and not when
// the Titler fails. (Titles carry no event: the test stops the engine,
// which waits for every goroutine it started, then reads them.)
func TestFirstRequestIsTitledByTheModel(t *testing.T) {
	h := newHarness(t, newScripted(words, false))
	titler := &fakeTitler{title: "Spring trip to Lisbon"}
	h.startWith(func(c *engine.Config) { c.Titler = titler })
	create := func(title string) string {
		snap, err := h.st.CreateThread(context.Background(), chat.LocalUserID, title)
		if err != nil {
			t.Fatal(err)
		}
		return snap.ThreadID
	}
	const first = "Can you help me plan a spring trip to Lisbon with two kids and a dog?"
	untitled, named := create(chat.DefaultTitle), create("My own name")
	runToEnd(t, h, untitled, first)
	runToEnd(t, h, untitled, "And in autumn?")
	runToEnd(t, h, named, "Plan a trip to Porto")
	h.stop()
	asked := titler.requests()
	if len(asked) != 2 || len(asked[0]) != 1 || asked[0][0].Role != model.RoleUser || asked[0][0].Content != first {
		t.Fatalf("the titler was asked %+v, want each conversation's first request alone", asked)
	}
	for thread, want := range map[string]string{untitled: "Spring trip to Lisbon", named: "My own name"} {
		if th, err := h.st.Thread(context.Background(), chat.LocalUserID, thread); err != nil || th.Title != want {
			t.Errorf("thread %s is titled %q (%v), want %q", thread, th.Title, err, want)
		}
	}

	// A titler that fails leaves the request's start.
	failing := &fakeTitler{}
	h.startWith(func(c *engine.Config) { c.Titler = failing })
	plain := create(chat.DefaultTitle)
	runToEnd(t, h, plain, "What is a write ahead log?")
	h.stop()
	if len(failing.requests()) != 1 {
		t.Fatalf("the failing titler was asked %d times, want once", len(failing.requests()))
	}
	if th, _ := h.st.Thread(context.Background(), chat.LocalUserID, plain); th.Title != "What is a write ahead log?" {
		t.Errorf("after a failed title the thread is titled %q", th.Title)
	}
}
