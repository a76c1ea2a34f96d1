package demo

import (
	"context"
	"testing"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/model"
)

// Requests that share their first 60 characters share the title taken from
// their start, and get titles that differ from the demo model; a request
// with no content word gets none.
func TestTitleTellsAlikeRequestsApart(t *testing.T) {
	b := New(0)
	const start = "Could you please help me think through, step by step, how to "
	a := start + "plan a spring trip to Lisbon with kids"
	p := start + "repaint a small wooden boat before summer"
	if chat.TitleFrom(a) != chat.TitleFrom(p) {
		t.Fatalf("the test's requests should share their start: %q, %q", chat.TitleFrom(a), chat.TitleFrom(p))
	}
	ta, err := b.Title(context.Background(), []model.Message{{Role: model.RoleUser, Content: a}})
	if err != nil {
		t.Fatal(err)
	}
	tp, err := b.Title(context.Background(), []model.Message{{Role: model.RoleUser, Content: p}})
	if err != nil {
		t.Fatal(err)
	}
	if ta == tp || ta == "" || tp == "" {
		t.Fatalf("titles %q and %q, want two that differ", ta, tp)
	}
	if again, _ := b.Title(context.Background(), []model.Message{{Role: model.RoleUser, Content: a}}); again != ta {
		t.Fatalf("the same request titled %q then %q", ta, again)
	}
	if t1, _ := b.Title(context.Background(), []model.Message{{Role: model.RoleUser, Content: "short: orchard 1"}}); t1 != "Orchard 1" {
		t.Fatalf("a number is part of the title: %q", t1)
	}
	if got, err := b.Title(context.Background(), []model.Message{{Role: model.RoleUser, Content: "hi, thanks!"}}); err == nil {
		t.Fatalf("a request of stop words titled %q", got)
	}
	t.Logf("titles: %q, %q", ta, tp)
}
