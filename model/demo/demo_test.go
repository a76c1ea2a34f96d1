package demo

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/honestcancel/gateway/model"
)

func user(text string) model.Request {
	return model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: text}}}
}

// collect streams req to the end with pace 0 and returns the chunk texts.
func collect(t *testing.T, req model.Request) []string {
	t.Helper()
	s, err := New(0).Stream(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out []string
	for {
		c, err := s.Next(context.Background())
		if errors.Is(err, model.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c.Text)
	}
}

func TestDeterministic(t *testing.T) {
	req := model.Request{
		Messages: []model.Message{
			{Role: model.RoleSystem, Content: "be helpful"},
			{Role: model.RoleUser, Content: "How do goroutines and channels work together?"},
			{Role: model.RoleAssistant, Content: "They communicate", Fragment: true},
			{Role: model.RoleUser, Content: "Explain mutexes versus channels."},
		},
		ResumeNote: "previous output was stopped",
	}
	a, b := collect(t, req), collect(t, req)
	if strings.Join(a, "|") != strings.Join(b, "|") {
		t.Fatalf("streams differ:\n%q\n%q", a, b)
	}
	other := collect(t, user("Explain database indexes."))
	if strings.Join(a, "") == strings.Join(other, "") {
		t.Fatal("different requests gave the same reply")
	}
}

func TestLength(t *testing.T) {
	for _, q := range []string{"How do goroutines and channels work together?", "What is this?", "", "🙂"} {
		if n := len(collect(t, user(q))); n < 80 {
			t.Errorf("%q: %d words, want >= 80", q, n)
		}
	}
}

func TestShort(t *testing.T) {
	for _, q := range []string{"Explain goroutines, short please", "Short.", "keep it SHORT: caching vs indexes in databases"} {
		for _, note := range []string{"", "stopped"} {
			req := user(q)
			req.ResumeNote = note
			if n := len(collect(t, req)); n < 3 || n > 10 {
				t.Errorf("%q (note %q): %d words, want 3..10: %q", q, note, n, strings.Join(collect(t, req), ""))
			}
		}
	}
	if n := len(collect(t, user("Is there a shortcut for goroutines?"))); n < 80 {
		t.Errorf("shortcut: %d words, want >= 80", n)
	}
	// Only the last user message counts.
	req := model.Request{Messages: []model.Message{
		{Role: model.RoleUser, Content: "short"},
		{Role: model.RoleUser, Content: "Now explain goroutines in depth."},
	}}
	if n := len(collect(t, req)); n < 80 {
		t.Errorf("earlier short: %d words, want >= 80", n)
	}
}

func TestEchoesTopic(t *testing.T) {
	reply := strings.Join(collect(t, user("How do goroutines and channels work together?")), "")
	if !strings.Contains(reply, "goroutines") && !strings.Contains(reply, "channels") {
		t.Fatalf("reply does not mention the topic: %q", reply)
	}
	short := strings.Join(collect(t, user("short: what are goroutines?")), "")
	if !strings.Contains(short, "goroutines") {
		t.Fatalf("short reply does not mention the topic: %q", short)
	}
}

func TestResumeAndFragment(t *testing.T) {
	req := user("Tell me about sourdough baking.")
	plain := strings.Join(collect(t, req), "")
	req.ResumeNote = "the previous output was stopped by the user"
	resumed := strings.Join(collect(t, req), "")
	if !strings.HasPrefix(resumed, "Picking up from the saved point") || strings.HasPrefix(plain, "Picking up") {
		t.Fatalf("resume note did not change the beginning:\nplain:   %q\nresumed: %q", plain, resumed)
	}
	if !strings.Contains(resumed, "was stopped") {
		t.Fatalf("a user stop is not named: %q", resumed)
	}
	req.ResumeNote = "The previous attempt at this step was interrupted before it was published."
	if crashed := strings.Join(collect(t, req), ""); !strings.Contains(crashed, "was interrupted") {
		t.Fatalf("an interrupted attempt is called something else: %q", crashed)
	}
	req.Messages = append(req.Messages, model.Message{Role: model.RoleAssistant, Content: "Sourdough needs", Fragment: true})
	if reply := strings.Join(collect(t, req), ""); !strings.Contains(reply, "saved fragment") {
		t.Fatalf("fragment not mentioned: %q", reply)
	}
	if reply := strings.Join(collect(t, model.Request{}), ""); !strings.HasPrefix(reply, "Hello") {
		t.Fatalf("no-user reply is not a greeting: %q", reply)
	}
}

func TestConcatenation(t *testing.T) {
	for _, req := range []model.Request{user("Compare Go, Rust and Zig for CLI tools!"), user("short: tabs or spaces?"), {}} {
		chunks := collect(t, req)
		if got, want := strings.Join(chunks, ""), compose(req); got != want {
			t.Fatalf("concatenation %q != reply %q", got, want)
		}
		for i, c := range chunks {
			if strings.TrimSpace(c) == "" || (i == 0) != !strings.HasPrefix(c, " ") || strings.Contains(c[min(1, len(c)):], " ") {
				t.Fatalf("chunk %d %q is not one word with its separating space", i, c)
			}
		}
	}
}

func TestUnicode(t *testing.T) {
	q := "Расскажи про горутины и каналы 🙂, пожалуйста!"
	chunks := collect(t, user(q))
	reply := strings.Join(chunks, "")
	if len(chunks) < 80 || !strings.Contains(reply, "горутины") {
		t.Fatalf("bad reply to Russian input (%d words): %q", len(chunks), reply)
	}
	for _, c := range chunks {
		if !utf8.ValidString(c) {
			t.Fatalf("invalid UTF-8 chunk %q", c)
		}
	}
	if n := len(collect(t, user("Коротко: каналы? short 🙂"))); n > 10 {
		t.Fatalf("short Unicode reply has %d words", n)
	}
}

func TestPaceStreamsToEOF(t *testing.T) {
	s, err := New(time.Millisecond).Stream(context.Background(), user("short: go"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n := 0
	for ; ; n++ {
		if _, err := s.Next(context.Background()); err != nil {
			if !errors.Is(err, model.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	if _, err := s.Next(context.Background()); !errors.Is(err, model.EOF) {
		t.Fatalf("after EOF: %v", err)
	}
	if n < 3 {
		t.Fatalf("%d chunks", n)
	}
}

// blockedNext starts Next on a 1h-pace stream in a goroutine and returns
// the channel that receives its error.
func blockedNext(ctx context.Context, s model.Stream) <-chan error {
	errc := make(chan error, 1)
	go func() {
		_, err := s.Next(ctx)
		errc <- err
	}()
	return errc
}

func waitErr(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Next did not return promptly")
		return nil
	}
}

func TestCancelNextContext(t *testing.T) {
	s, err := New(time.Hour).Stream(context.Background(), user("hello there"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := blockedNext(ctx, s)
	cancel()
	if err := waitErr(t, errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

func TestCancelStreamContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := New(time.Hour).Stream(ctx, user("hello there"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	errc := blockedNext(context.Background(), s)
	cancel()
	if err := waitErr(t, errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if _, err := New(0).Stream(ctx, user("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stream on cancelled ctx: %v", err)
	}
}

func TestCloseUnblocksNext(t *testing.T) {
	s, err := New(time.Hour).Stream(context.Background(), user("hello there"))
	if err != nil {
		t.Fatal(err)
	}
	errc := blockedNext(context.Background(), s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, errc); !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
