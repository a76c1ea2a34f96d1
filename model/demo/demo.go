// Package demo is the embedded default "demo model": a deterministic backend
// that needs no API key. It answers from the words of the last user message
// with templated English sentences and streams the reply one word per pace.
//
// It also drives the product's tool flows (see tools.go): it asks for
// catalog_search and send_email when they are offered and the last user
// message asks for them, answers an "order" request with a JSON card, and
// answers a tool result in words. A request that starts with "endless:"
// gets a reply that never ends (a paragraph per pace), for the engine's size limit
// to stop.
package demo

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/honestcancel/gateway/model"
)

// ErrClosed is returned by Next after (or while blocked when) Close is called.
var ErrClosed = errors.New("demo: stream closed")

// Backend is the demo model. It holds no mutable state, so a Backend is safe
// for concurrent use by multiple goroutines. Each Stream it returns is used
// by one goroutine, except that Close may be called concurrently with Next.
type Backend struct {
	pace time.Duration
}

var _ model.Backend = (*Backend)(nil)

// New returns a demo backend that emits one word per pace (0 means no waiting).
func New(pace time.Duration) *Backend {
	return &Backend{pace: max(pace, 0)}
}

// Stream starts a reply for req. The same request always yields the same
// chunks. Cancelling ctx makes a pending or later Next return its cause.
func (b *Backend) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	if more := endless(req); more != nil {
		return &stream{ctx: ctx, pace: b.pace, more: more, done: make(chan struct{})}, nil
	}
	return &stream{ctx: ctx, pace: b.pace, chunks: reply(req), done: make(chan struct{})}, nil
}

// stream is one reply. Next is called by one goroutine; Close may be called
// from any goroutine at any time.
type stream struct {
	ctx    context.Context
	pace   time.Duration
	chunks []model.Chunk
	// more, when set, makes the chunks after chunks: a reply that never
	// ends (endless), made one chunk at a time and never held whole.
	more func(i int) model.Chunk
	next int
	done chan struct{}
	once sync.Once
}

// Next waits one pace and returns the next chunk: a word of a text reply
// (with its leading space for all but the first), a piece of a card, or the
// final tool call. It returns model.EOF after the last chunk, the context's
// cause on cancellation, and ErrClosed once Close was called.
func (s *stream) Next(ctx context.Context) (model.Chunk, error) {
	if err := s.check(ctx); err != nil {
		return model.Chunk{}, err
	}
	if s.next >= len(s.chunks) && s.more == nil {
		return model.Chunk{}, model.EOF
	}
	if s.pace > 0 {
		t := time.NewTimer(s.pace)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.done:
		case <-s.ctx.Done():
		case <-ctx.Done():
		}
		if err := s.check(ctx); err != nil {
			return model.Chunk{}, err
		}
	}
	var c model.Chunk
	if s.next < len(s.chunks) {
		c = s.chunks[s.next]
	} else {
		c = s.more(s.next - len(s.chunks))
	}
	s.next++
	return c, nil
}

func (s *stream) check(ctx context.Context) error {
	select {
	case <-s.done:
		return ErrClosed
	default:
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if s.ctx.Err() != nil {
		return context.Cause(s.ctx)
	}
	return nil
}

// Close releases the stream; a blocked Next returns ErrClosed promptly.
func (s *stream) Close() error {
	s.once.Do(func() { close(s.done) })
	return nil
}

// picker is a small deterministic generator (splitmix64) seeded by a hash of
// the conversation, so variation never depends on global randomness.
type picker struct{ state uint64 }

func (p *picker) pick(n int) int {
	p.state += 0x9e3779b97f4a7c15
	z := p.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return int((z ^ (z >> 31)) % uint64(n))
}

func seed(req model.Request) uint64 {
	h := fnv.New64a()
	for _, m := range req.Messages {
		fmt.Fprintf(h, "%s\x00%t\x00%s\x00", m.Role, m.Fragment, m.Content)
	}
	h.Write([]byte(req.ResumeNote))
	return h.Sum64()
}

var stopwords = make(map[string]bool)

func init() {
	for _, w := range strings.Fields(`a an the and or but if then so of to in on at by for from with about
		as into is are was were be been am do does did can could would should will shall may might must
		i me my we our you your he she it its they them their this that these those there here what which
		who whom how why when where please tell explain give show some any all just not no yes also very
		more most much many let hi hello thanks thank know want need like get use using make work works
		together between versus vs way best good thing things
		и в на с о про что как это не а но или расскажи объясни пожалуйста`) {
		stopwords[w] = true
	}
}

func trimPunct(w string) string { return strings.TrimFunc(w, unicode.IsPunct) }

// topics returns up to four distinct content words of text, in order, and
// whether text contains the whole word "short".
func topics(text string) (words []string, short bool) {
	seen := map[string]bool{}
	for _, f := range strings.Fields(text) {
		w := trimPunct(f)
		lw := strings.ToLower(w)
		if lw == "short" {
			short = true
			continue
		}
		// Skip single letters ("и", "a") and words without letters or digits (emoji).
		skip := utf8.RuneCountInString(w) < 2 || strings.IndexFunc(w, func(r rune) bool {
			return unicode.IsLetter(r) || unicode.IsDigit(r)
		}) < 0
		if skip || stopwords[lw] || seen[lw] || len(words) == 4 {
			continue
		}
		seen[lw] = true
		words = append(words, w)
	}
	return words, short
}

// list joins words as "a", "a and b" or "a, b and c".
func list(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}

var (
	openings = []string{"You asked about %s.", "Your message is about %s, so let me answer that directly.", "Here is my take on %s."}
	notes    = []string{
		"I am the demo model of this gateway, so I answer from your own words rather than from real knowledge, but the shape of the answer is what a real model would give.",
		"As the built-in demo model I cannot look anything up, yet I can still walk through the question the way a real assistant would.",
	}
	plans = []string{
		"A practical plan: first, define what %s means for you; then, try the smallest version that works; finally, review the result and adjust.",
		"Step by step: start with %s, check what you learn along the way, and only then widen the scope.",
	}
	considerations = []string{
		"When it comes to %s, the first thing to settle is what you actually need from it.",
		"It helps to look at %s from the point of view of whoever will use the result.",
		"A common mistake with %s is to optimise too early, before the basics work.",
		"Think about how %s interacts with the rest of your setup, because that is where surprises hide.",
		"If %s feels vague, write down one concrete example and test your idea against it.",
		"Keep notes on what you try with %s, so you can compare options instead of guessing.",
		"There is rarely one right answer for %s; the trade-offs depend on your constraints.",
		"Consider what would change if %s had to work at ten times the current scale.",
	}
	closings = []string{
		"I hope this gives you a useful starting point for %s; ask a follow-up and I will go deeper.",
		"That is the overview; tell me which part of %s matters most to you and we can continue from there.",
		"In short, take %s one step at a time, and feel free to ask again with more detail.",
	}
	shorts = []string{"Briefly: start small with %s.", "Short answer: focus on %s first.", "In brief: %s, step by step."}
)

// compose builds the whole reply for req; chunks are its words.
func compose(req model.Request) string {
	p := &picker{state: seed(req)}
	var out []string
	var user *model.Message
	fragment := false
	for i, m := range req.Messages {
		fragment = fragment || m.Fragment
		if m.Role == model.RoleUser && !m.Fragment {
			user = &req.Messages[i]
		}
	}
	if user == nil {
		out = append(out, "Hello! I am the demo model of this gateway. Ask me anything and I will answer from your words.")
		if req.ResumeNote != "" {
			out = append([]string{"Picking up from the saved point after the previous answer was " + why(req.ResumeNote) + ":"}, out...)
		}
		return strings.Join(out, " ")
	}
	words, short := topics(user.Content)
	if short {
		if req.ResumeNote != "" {
			out = append(out, "Resuming after the stop:")
			words = words[:min(len(words), 1)]
		}
		topic := "basics"
		if len(words) > 0 {
			topic = list(words[:min(len(words), 2)])
		}
		out = append(out, fmt.Sprintf(shorts[p.pick(len(shorts))], topic))
		if all := strings.Fields(strings.Join(out, " ")); len(all) > 10 {
			return strings.TrimRightFunc(strings.Join(all[:10], " "), unicode.IsPunct) + "."
		}
		return strings.Join(out, " ")
	}
	if req.ResumeNote != "" {
		out = append(out, "Picking up from the saved point after the previous answer was "+why(req.ResumeNote)+", here is a fresh answer:")
	}
	if fragment {
		out = append(out, "I also see a saved fragment of an earlier answer, and I take it into account.")
	}
	all, topic := "your question", func(int) string { return "your question" }
	if len(words) > 0 {
		all, topic = list(words), func(i int) string { return words[i%len(words)] }
		out = append(out, fmt.Sprintf(openings[p.pick(len(openings))], all))
	} else {
		out = append(out, "Your message has few specific keywords, so I will answer in general terms.")
	}
	out = append(out, notes[p.pick(len(notes))], fmt.Sprintf(plans[p.pick(len(plans))], topic(0)))
	order := make([]int, len(considerations))
	for i := range order {
		j := p.pick(i + 1)
		order[i], order[j] = order[j], i
	}
	closing := fmt.Sprintf(closings[p.pick(len(closings))], all)
	for i := 0; i < 2 || len(strings.Fields(strings.Join(append(out, closing), " "))) < 80; i++ {
		out = append(out, fmt.Sprintf(considerations[order[i%len(order)]], topic(i+1)))
	}
	return strings.Join(append(out, closing), " ")
}

// why says, in the reply, what happened to the previous output: the engine's
// note says whether the user stopped it or the attempt was interrupted.
func why(note string) string {
	if strings.Contains(strings.ToLower(note), "interrupted") {
		return "interrupted"
	}
	return "stopped"
}

var endlessWord = regexp.MustCompile(`(?i)^\s*endless:`)

// endless is the reply to a user message that starts with "endless:" (a
// prefix, so that "search for endless summer" still searches): one that
// never ends, a paragraph per chunk (so that the size limit, which stops
// it, is reached in a few hundred chunks), or nil for any other request.
func endless(req model.Request) func(i int) model.Chunk {
	n := len(req.Messages)
	if n == 0 {
		return nil
	}
	last := req.Messages[n-1]
	if last.Role != model.RoleUser || last.Fragment || !endlessWord.MatchString(last.Content) {
		return nil
	}
	words, _ := topics(endlessWord.ReplaceAllString(last.Content, ""))
	all, topic := "your question", func(int) string { return "your question" }
	if len(words) > 0 {
		all, topic = list(words), func(i int) string { return words[i%len(words)] }
	}
	return func(i int) model.Chunk {
		if i == 0 {
			return model.Chunk{Text: "Here is an endless answer about " + all + ": it goes on until the gateway stops it at its size limit.\n\n"}
		}
		var b strings.Builder
		fmt.Fprintf(&b, "**Part %d.** ", i)
		for k := range 5 {
			if k > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, considerations[(3*i+k)%len(considerations)], topic(i+k))
		}
		b.WriteString("\n\n")
		return model.Chunk{Text: b.String()}
	}
}
