package engine_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/engine"
	"github.com/honestcancel/gateway/model"
)

// endless is a model whose reply never ends: each Next returns piece again
// (as a card when card is set), after the chunks of head. It counts the
// chunks it handed out and records when a stream was closed or its context
// ended (the model call stopped).
type endless struct {
	head  []model.Chunk
	piece string
	card  bool
	// last, when set, ends the reply after the head with this chunk
	// (instead of repeating piece forever).
	last *model.Chunk

	reads   atomic.Int64
	mu      sync.Mutex
	req     model.Request
	stopped chan struct{}
	once    sync.Once
}

func newEndless(piece string) *endless { return &endless{piece: piece, stopped: make(chan struct{})} }

func (m *endless) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	m.mu.Lock()
	m.req = req
	m.mu.Unlock()
	return &endlessStream{m: m, ctx: ctx}, nil
}

type endlessStream struct {
	m   *endless
	ctx context.Context
	i   int
}

func (s *endlessStream) Next(ctx context.Context) (model.Chunk, error) {
	if err := ctx.Err(); err != nil {
		s.m.once.Do(func() { close(s.m.stopped) })
		return model.Chunk{}, err
	}
	if err := s.ctx.Err(); err != nil {
		s.m.once.Do(func() { close(s.m.stopped) })
		return model.Chunk{}, err
	}
	s.m.reads.Add(1)
	defer func() { s.i++ }()
	if s.i < len(s.m.head) {
		return s.m.head[s.i], nil
	}
	if s.m.last != nil {
		if s.i == len(s.m.head) {
			return *s.m.last, nil
		}
		return model.Chunk{}, model.EOF
	}
	return model.Chunk{Text: s.m.piece, Card: s.m.card}, nil
}

func (s *endlessStream) Close() error {
	s.m.once.Do(func() { close(s.m.stopped) })
	return nil
}

// replyEvents runs one request on a new thread of an engine over m with a
// reply limit of limit bytes, and returns the concatenated deltas, the
// published reply (nil: none) and the run's last event.
func replyEvents(t *testing.T, m model.Backend, limit int) (*harness, string, *chat.Message, *chat.Event) {
	t.Helper()
	h := newHarness(t, nil)
	h.backend = m
	snap, sub := h.watchedThread()
	h.startWith(func(c *engine.Config) { c.MaxReplyBytes = limit })
	ack := h.startRun(snap.ThreadID, snap.StateVersion, ptr("write forever"))
	var deltas strings.Builder
	var published *chat.Message
	end := waitFor(t, sub, "the run's end", func(ev *chat.Event) bool {
		switch ev.Type {
		case chat.EventMessageDelta:
			deltas.WriteString(ev.Body.(chat.MessageDeltaBody).Text)
		case chat.EventMessagePublished:
			if msg := ev.Body.(chat.MessagePublishedBody).Message; msg.Role == chat.RoleAssistant {
				published = &msg
			}
		}
		return ev.RunID == ack.RunID && (ev.Type == chat.EventRunCompleted || ev.Type == chat.EventRunFailed || ev.Type == chat.EventRunCancelled)
	})
	return h, deltas.String(), published, end
}

// A reply that never ends is stopped at the size limit: the model call is
// ended (as a cancel ends it) with nothing past the limit read but what
// was already in flight, the deltas stop at the limit — cut on a code
// point boundary — and the run completes with exactly that text
// published, marked truncated: size_limit, in the event and in the
// history. The model was told the limit.
func TestEndlessReplyIsCutAtTheSizeLimitAndCompletes(t *testing.T) {
	const limit = 1000
	m := newEndless("héllo wörld ") // 14 bytes: the limit falls inside a code point
	h, deltas, published, end := replyEvents(t, m, limit)
	if end.Type != chat.EventRunCompleted {
		t.Fatalf("the run ended with %s (%+v), want run.completed", end.Type, end.Body)
	}
	select {
	case <-m.stopped:
	default:
		t.Fatal("the model call was not stopped at the limit")
	}
	// The engine reads ahead at most one batch (64 chunks) past the chunk
	// it cut, and nothing once the run ended.
	reads := m.reads.Load()
	if max := int64(limit/len(m.piece) + 1 + 64 + 2); reads > max {
		t.Errorf("the model handed out %d chunks for a %d-byte limit, want at most %d", reads, limit, max)
	}
	if published == nil {
		t.Fatal("nothing was published")
	}
	if published.Content != deltas {
		t.Fatalf("published %d bytes that are not the %d bytes of deltas", len(published.Content), len(deltas))
	}
	if len(deltas) > limit || len(deltas) < limit-utf8.UTFMax || !utf8.ValidString(deltas) {
		t.Fatalf("%d bytes streamed (valid UTF-8: %v), want the most of %d that ends on a code point", len(deltas), utf8.ValidString(deltas), limit)
	}
	if !strings.HasPrefix(strings.Repeat(m.piece, limit/len(m.piece)+1), deltas) {
		t.Fatalf("the streamed text is not the start of the reply: %q…", deltas[:40])
	}
	if published.Truncated != chat.TruncatedSizeLimit {
		t.Fatalf("published message truncated = %q, want %q", published.Truncated, chat.TruncatedSizeLimit)
	}
	snap := h.snapshot(published.ThreadID)
	if n := len(snap.Messages); n != 2 || snap.Messages[1].Truncated != chat.TruncatedSizeLimit || snap.Messages[1].Content != deltas || snap.Messages[0].Truncated != "" {
		t.Fatalf("history after the cut: %+v", snap.Messages)
	}
	if snap.LastRun == nil || snap.LastRun.Status != chat.RunCompleted || snap.LastRun.Error != nil {
		t.Fatalf("last run: %+v", snap.LastRun)
	}
	if after := m.reads.Load(); after != reads {
		t.Fatalf("the model was read %d more times after the run completed", after-reads)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.req.MaxBytes != limit {
		t.Fatalf("the model request's MaxBytes = %d, want the limit %d", m.req.MaxBytes, limit)
	}
}

// A reply of exactly the limit that ends by itself is whole: not marked.
// One the endpoint stopped at its own length limit is marked, and its text
// is kept as streamed.
func TestReplyAtTheLimitIsWholeAndAnEndpointCutIsMarked(t *testing.T) {
	whole := newEndless("")
	whole.head = []model.Chunk{{Text: strings.Repeat("a", 60)}, {Text: strings.Repeat("b", 40)}}
	whole.last = &model.Chunk{Text: ""}
	_, deltas, published, end := replyEvents(t, whole, 100)
	if end.Type != chat.EventRunCompleted || published == nil || published.Content != deltas || len(deltas) != 100 || published.Truncated != "" {
		t.Fatalf("a reply of exactly the limit: %s, %d bytes, %+v", end.Type, len(deltas), published)
	}

	cut := newEndless("")
	cut.head = []model.Chunk{{Text: "The endpoint stopped me mid"}}
	cut.last = &model.Chunk{Truncated: true}
	_, deltas, published, end = replyEvents(t, cut, 100)
	if end.Type != chat.EventRunCompleted || published == nil || published.Content != deltas || deltas != "The endpoint stopped me mid" || published.Truncated != chat.TruncatedSizeLimit {
		t.Fatalf("a reply the endpoint cut: %s, %q, %+v", end.Type, deltas, published)
	}
}

// A card cut at the size limit is no valid JSON document: the run fails
// saying so, and nothing of it is published.
func TestCardCutAtTheSizeLimitFailsTheRun(t *testing.T) {
	m := newEndless(`"x",`)
	m.head = []model.Chunk{{Text: `{"items":[`, Card: true}}
	m.card = true
	_, _, published, end := replyEvents(t, m, 200)
	if end.Type != chat.EventRunFailed {
		t.Fatalf("the run ended with %s, want run.failed", end.Type)
	}
	if msg := end.Body.(chat.RunFailedBody).Error; !strings.Contains(msg, "size limit of 200 bytes") {
		t.Fatalf("run.failed error %q does not name the size limit", msg)
	}
	if published != nil {
		t.Fatalf("a cut card was published: %+v", published)
	}
	select {
	case <-m.stopped:
	default:
		t.Fatal("the model call was not stopped at the limit")
	}
}
