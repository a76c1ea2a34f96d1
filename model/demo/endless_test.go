package demo

import (
	"context"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/model"
)

// A request that starts with "endless:" gets a reply that does not end: the
// same paragraphs for the same request, each one chunk, about the
// request's words; a Close stops it. Other requests end as before.
func TestEndlessReplyNeverEnds(t *testing.T) {
	read := func(n int) []string {
		s, err := New(0).Stream(context.Background(), user("Endless: tell me a story about tomatoes"))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var out []string
		for range n {
			c, err := s.Next(context.Background())
			if err != nil {
				t.Fatalf("after %d chunks: %v", len(out), err)
			}
			out = append(out, c.Text)
		}
		return out
	}
	a := read(3000)
	var size int
	for _, p := range a {
		size += len(p)
	}
	if size < 1<<20 || !strings.Contains(a[0], "endless answer about story and tomatoes") || !strings.HasPrefix(a[2999], "**Part 2999.**") || !strings.Contains(a[1], "tomatoes") {
		t.Fatalf("3000 chunks hold %d bytes; first %q, last %q", size, a[0], a[2999][:40])
	}
	if b := read(3000); strings.Join(a, "") != strings.Join(b, "") {
		t.Fatal("the same request streamed another reply")
	}

	s, _ := New(0).Stream(context.Background(), user("endless: anything"))
	s.Close()
	if _, err := s.Next(context.Background()); err != ErrClosed {
		t.Fatalf("Next after Close: %v, want ErrClosed", err)
	}
	if n := len(collect(t, user("tell me about summers that never end"))); n == 0 {
		t.Fatal("no reply")
	}
	if more := endless(user("tell me about an endless summer")); more != nil {
		t.Fatal(`"endless" inside a request, not as its "endless:" prefix, got an endless reply`)
	}
	req := model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: "endless: anything"}, {Role: model.RoleAssistant, Content: "ok"}}}
	if more := endless(req); more != nil {
		t.Fatal("a conversation whose last message is a reply got an endless reply")
	}
}
