package demo

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"regexp"
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
	var out []string
	for _, c := range chunks(t, req) {
		out = append(out, c.Text)
	}
	return out
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

// Tool flows.

var allTools = []model.ToolSpec{{Name: ToolCatalogSearch}, {Name: ToolSendEmail}, {Name: "other_tool"}}

func withTools(text string, tools ...model.ToolSpec) model.Request {
	req := user(text)
	req.Tools = tools
	return req
}

// chunks streams req to the end with pace 0 and returns every chunk.
func chunks(t *testing.T, req model.Request) []model.Chunk {
	t.Helper()
	s, err := New(0).Stream(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out []model.Chunk
	for {
		c, err := s.Next(context.Background())
		if errors.Is(err, model.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
}

var callIDPattern = regexp.MustCompile(`^call_[0-9a-f]{12}$`)

// splitCall checks that cs is text words followed by exactly one call (the
// last chunk), and returns the text and the call.
func splitCall(t *testing.T, cs []model.Chunk) (string, *model.ToolCall) {
	t.Helper()
	if len(cs) < 2 {
		t.Fatalf("%d chunks, want text and a call", len(cs))
	}
	var text strings.Builder
	for i, c := range cs[:len(cs)-1] {
		if c.Call != nil || c.Card {
			t.Fatalf("chunk %d of %d is %+v, want plain text", i, len(cs), c)
		}
		text.WriteString(c.Text)
	}
	last := cs[len(cs)-1]
	if last.Call == nil || last.Text != "" || last.Card {
		t.Fatalf("last chunk %+v is not a bare call", last)
	}
	if !callIDPattern.MatchString(last.Call.ID) {
		t.Fatalf("call id %q", last.Call.ID)
	}
	if !json.Valid(last.Call.Arguments) {
		t.Fatalf("arguments are not JSON: %s", last.Call.Arguments)
	}
	return text.String(), last.Call
}

func noCall(t *testing.T, cs []model.Chunk) string {
	t.Helper()
	var text strings.Builder
	for i, c := range cs {
		if c.Call != nil || c.Card {
			t.Fatalf("chunk %d is %+v, want plain text", i, c)
		}
		text.WriteString(c.Text)
	}
	return text.String()
}

func TestSearchCall(t *testing.T) {
	for _, tc := range []struct{ msg, query string }{
		{"Search the catalog for red ceramic mugs, please", "red ceramic mugs"},
		{"Can you FIND me a cheap teapot?", "cheap teapot"},
		{"Please look up Waterproof Hiking Boots size 44 in blue today", "waterproof hiking boots size 44"},
		{"LookUp: espresso cups", "espresso cups"},
		{"Red mugs: can you find them?", "red mugs"},
		{"search for горутины и каналы 🙂", "горутины каналы"},
	} {
		text, call := splitCall(t, chunks(t, withTools(tc.msg, allTools...)))
		if call.Name != ToolCatalogSearch {
			t.Fatalf("%q: called %q", tc.msg, call.Name)
		}
		var args map[string]any
		if err := json.Unmarshal(call.Arguments, &args); err != nil || len(args) != 1 || args["query"] != tc.query {
			t.Errorf("%q: arguments %s, want query %q", tc.msg, call.Arguments, tc.query)
		}
		if want := "Let me search the catalog for " + tc.query + "."; text != want {
			t.Errorf("%q: text %q, want %q", tc.msg, text, want)
		}
	}
	// Nothing to search for: ask, do not call.
	if text := noCall(t, chunks(t, withTools("Can you search?", allTools...))); !strings.Contains(text, "What should I search") {
		t.Errorf("empty query: %q", text)
	}
}

func TestEmailCall(t *testing.T) {
	for _, tc := range []struct{ msg, to, subject, inBody string }{
		{"Send an email to bob@example.com about the delayed shipment of order 42.", "bob@example.com", "Delayed shipment order 42", "about the delayed shipment of order 42."},
		{"Draft an e-mail to the customer saying that we are closed tomorrow", DefaultRecipient, "Closed tomorrow", "let you know that we are closed tomorrow."},
		{"Please WRITE an Email to Anna.K@shop.example.org for the spring sale!", "Anna.K@shop.example.org", "Spring sale", "about the spring sale."},
		{"mail an email", DefaultRecipient, "A quick note", "about your recent message."},
		{"Напиши email: send it to ivan@example.ru about счёт 17", "ivan@example.ru", "Счёт 17", "about счёт 17."},
	} {
		text, call := splitCall(t, chunks(t, withTools(tc.msg, allTools...)))
		if call.Name != ToolSendEmail {
			t.Fatalf("%q: called %q", tc.msg, call.Name)
		}
		if text != "I drafted the email below. Please confirm before I send it." {
			t.Errorf("%q: text %q", tc.msg, text)
		}
		var args map[string]string
		if err := json.Unmarshal(call.Arguments, &args); err != nil || len(args) != 3 {
			t.Fatalf("%q: arguments %s (%v)", tc.msg, call.Arguments, err)
		}
		if args["to"] != tc.to || args["subject"] != tc.subject || !strings.Contains(args["body"], tc.inBody) {
			t.Errorf("%q: arguments %s", tc.msg, call.Arguments)
		}
		if n := strings.Count(args["body"], ". "); n < 2 || n > 4 || !utf8.ValidString(args["body"]) {
			t.Errorf("%q: body has %d sentences: %q", tc.msg, n, args["body"])
		}
	}
	// "email" alone, or a verb alone, is not a request to send one.
	for _, msg := range []string{"What is an email header?", "Send me your thoughts on Go generics"} {
		noCall(t, chunks(t, withTools(msg, allTools...)))
	}
}

// Email wins over search, search over order.
func TestIntentPriority(t *testing.T) {
	_, call := splitCall(t, chunks(t, withTools("Find the address and send an email about my order", allTools...)))
	if call.Name != ToolSendEmail {
		t.Fatalf("called %q, want send_email", call.Name)
	}
	_, call = splitCall(t, chunks(t, withTools("Search for mugs I can order", allTools...)))
	if call.Name != ToolCatalogSearch {
		t.Fatalf("called %q, want catalog_search", call.Name)
	}
}

func TestToolNotOffered(t *testing.T) {
	for _, msg := range []string{
		"Search the catalog for red mugs",
		"Send an email to bob@example.com about the invoice",
		"Send an email about my order", // the intent is email: no card either
	} {
		for _, tools := range [][]model.ToolSpec{nil, {}, {{Name: "other_tool"}}} {
			req := withTools(msg, tools...)
			cs := chunks(t, req)
			if got := noCall(t, cs); got != compose(req) {
				t.Errorf("%q: got %q, want today's text reply", msg, got)
			}
			if len(cs) < 80 {
				t.Errorf("%q: %d words, want the full text reply", msg, len(cs))
			}
		}
	}
	// Only the needed tool counts.
	noCall(t, chunks(t, withTools("Search the catalog for red mugs", model.ToolSpec{Name: ToolSendEmail})))
	noCall(t, chunks(t, withTools("Send an email about red mugs", model.ToolSpec{Name: ToolCatalogSearch})))
}

// Only a last, non-fragment user message starts a tool flow.
func TestToolOnlyFromLastUserMessage(t *testing.T) {
	reqs := []model.Request{
		{Tools: allTools, Messages: []model.Message{
			{Role: model.RoleUser, Content: "Search for red mugs"},
			{Role: model.RoleAssistant, Content: "Let me", Fragment: true},
		}},
		{Tools: allTools, Messages: []model.Message{
			{Role: model.RoleUser, Content: "Search for red mugs"},
			{Role: model.RoleAssistant, Content: "Here you are."},
		}},
		{Tools: allTools, Messages: []model.Message{
			{Role: model.RoleUser, Content: "Search for red mugs", Fragment: true},
		}},
		{Tools: allTools, Messages: []model.Message{
			{Role: model.RoleUser, Content: "Search for red mugs"},
			{Role: model.RoleUser, Content: "Tell me about teapots"},
		}},
		withTools("Summarise the findings of the researchers", allTools...),
		withTools("Explain how vector clocks order events across replicas", allTools...),
		withTools("What should I do in order to learn Go?", allTools...),
	}
	for i, req := range reqs {
		if got := noCall(t, chunks(t, req)); got != compose(req) {
			t.Errorf("request %d: got %q, want today's reply", i, got)
		}
	}
}

func TestToolDeterministic(t *testing.T) {
	for _, msg := range []string{"Search the catalog for red mugs", "Send an email to bob@example.com about the invoice", "Order 2 red mugs"} {
		req := withTools(msg, allTools...)
		a, b := chunks(t, req), chunks(t, req)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%q: streams differ:\n%+v\n%+v", msg, a, b)
		}
	}
	_, a := splitCall(t, chunks(t, withTools("Search the catalog for red mugs", allTools...)))
	_, b := splitCall(t, chunks(t, withTools("Search the catalog for blue mugs", allTools...)))
	if a.ID == b.ID {
		t.Fatalf("two different calls share the id %q", a.ID)
	}
	// A resumed step asks for the same call with the same id.
	req := withTools("Search the catalog for red mugs", allTools...)
	req.ResumeNote = "the previous output was stopped by the user"
	text, c := splitCall(t, chunks(t, req))
	if !reflect.DeepEqual(c, a) || !strings.HasPrefix(text, "Picking up from the saved point after the previous answer was stopped:") {
		t.Fatalf("resumed: %q %+v, want the call %+v", text, c, a)
	}
}

// card streams req and checks it is a card: every chunk Card, no call, the
// whole text valid JSON and no shorter concatenation of chunks valid.
func card(t *testing.T, req model.Request) (doc string, pieces int) {
	t.Helper()
	cs := chunks(t, req)
	if len(cs) < 2 {
		t.Fatalf("%d card chunks", len(cs))
	}
	var b strings.Builder
	for i, c := range cs {
		if !c.Card || c.Call != nil || c.Text == "" || !utf8.ValidString(c.Text) {
			t.Fatalf("chunk %d %+v is not a card piece", i, c)
		}
		if strings.Count(c.Text, " ") > 1 || utf8.RuneCountInString(strings.TrimSpace(c.Text)) > 40 {
			t.Fatalf("chunk %d %q is more than about a word", i, c.Text)
		}
		if i < len(cs)-1 {
			// Every proper prefix that ends before the last chunk: all the
			// previous chunks plus any part of this one.
			for j := 0; j <= len(c.Text); j++ {
				if p := b.String() + c.Text[:j]; json.Valid([]byte(p)) {
					t.Fatalf("prefix %q is valid JSON", p)
				}
			}
		}
		b.WriteString(c.Text)
	}
	doc = b.String()
	if !json.Valid([]byte(doc)) {
		t.Fatalf("card is not JSON: %s", doc)
	}
	return doc, len(cs)
}

type orderDoc struct {
	Type  string `json:"type"`
	Items []struct {
		Name     string  `json:"name"`
		Quantity int     `json:"quantity"`
		Price    float64 `json:"price"`
	} `json:"items"`
	Currency string  `json:"currency"`
	Total    float64 `json:"total"`
}

func TestOrderCard(t *testing.T) {
	type item struct {
		name string
		qty  int
	}
	for _, tc := range []struct {
		msg   string
		items []item
	}{
		{"I'd like to order 2 red mugs and 3 teapots", []item{{"red mugs", 2}, {"teapots", 3}}},
		{"Order: espresso cups", []item{{"espresso cups", 1}}},
		{"Place an ORDER for coffee beans, 2 kg", []item{{"coffee beans", 2}}},
		{"order two bottles of wine and 12 glasses", []item{{"wine", 2}, {"glasses", 12}}},
		{"order", []item{{"demo item", 1}}},
		{"Please order 3 кружки и 1 чайник 🙂", []item{{"кружки", 3}, {"чайник", 1}}},
	} {
		for _, tools := range [][]model.ToolSpec{nil, allTools} { // a card needs no tool
			doc, _ := card(t, withTools(tc.msg, tools...))
			var o orderDoc
			if err := json.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatalf("%q: %v", tc.msg, err)
			}
			if o.Type != "order" || o.Currency != "EUR" || len(o.Items) != len(tc.items) {
				t.Fatalf("%q: %s", tc.msg, doc)
			}
			total := 0
			for i, it := range o.Items {
				if it.Name != tc.items[i].name || it.Quantity != tc.items[i].qty || it.Price <= 0 {
					t.Errorf("%q: item %d is %+v, want %+v", tc.msg, i, it, tc.items[i])
				}
				total += it.Quantity * int(math.Round(it.Price*100))
			}
			if int(math.Round(o.Total*100)) != total {
				t.Errorf("%q: total %v, want %d cents", tc.msg, o.Total, total)
			}
		}
	}
}

// Pieces split only outside escapes and at structure or spaces.
func TestCardChunks(t *testing.T) {
	doc := `{"a":"x \" y, z: [w]\\","b":[{"c":1},{"d":"ü é"}],"e":{}}`
	var b strings.Builder
	for i, c := range cardChunks(doc) {
		if !c.Card || c.Text == "" {
			t.Fatalf("chunk %d %+v", i, c)
		}
		if b.Len() > 0 && json.Valid([]byte(b.String())) {
			t.Fatalf("prefix %q is valid JSON", b.String())
		}
		b.WriteString(c.Text)
	}
	if b.String() != doc {
		t.Fatalf("pieces join to %q", b.String())
	}
}

// Closing a card stream mid-way leaves text that can never pass as the card.
func TestOrderCardCancelled(t *testing.T) {
	s, err := New(0).Stream(context.Background(), user("Order 2 red mugs"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for range 4 {
		c, err := s.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(c.Text)
	}
	s.Close()
	if _, err := s.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if json.Valid([]byte(b.String())) {
		t.Fatalf("partial card %q is valid JSON", b.String())
	}
}

func toolResult(name, args, content string) model.Request {
	return model.Request{Tools: allTools, Messages: []model.Message{
		{Role: model.RoleUser, Content: "Search for red mugs and send an email"},
		{Role: model.RoleAssistant, Content: "Let me search."},
		{Role: model.RoleTool, Content: content, Call: &model.ToolCall{ID: "call_x", Name: name, Arguments: json.RawMessage(args)}},
	}}
}

func TestAfterSearchResult(t *testing.T) {
	q := `{"query":"red mugs"}`
	for _, tc := range []struct {
		content string
		want    []string
		not     []string
	}{
		{`{"matches":[{"sku":"M1","name":"Red mug","price":12.5,"currency":"EUR"},{"sku":"M2","name":"Big red mug","price":"15","currency":"EUR"}]}`,
			[]string{"2 matches for red mugs", "Red mug for 12.50 EUR", "Big red mug for 15.00 EUR", "order one of them?"}, nil},
		{`{"matches":[{"sku":"M1","name":"Кружка 🙂","price":9.9,"currency":"EUR"}]}`,
			[]string{"one match", "Кружка 🙂 for 9.90 EUR", "order it?"}, nil},
		{`{"matches":[{"name":"a1","price":1},{"name":"a2"},{"sku":"a3"},{"name":"a4","price":4},{"name":"a5","price":5},{"name":"a6","price":6}],"extra":true}`,
			[]string{"6 matches", "a1 for 1.00", "a2", "a3", "a5 for 5.00", "order one"}, []string{"a6"}},
		{`{"matches":[]}`, []string{"Nothing in the catalog matched", "red mugs"}, []string{"order"}},
		{`{}`, []string{"Nothing in the catalog matched"}, nil},
		{`not json`, []string{"could not read the search result"}, []string{"matched"}},
		{`{"matches":"oops"}`, []string{"could not read the search result"}, nil},
	} {
		got := noCall(t, chunks(t, toolResult(ToolCatalogSearch, q, tc.content)))
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.content, got, w)
			}
		}
		for _, w := range tc.not {
			if strings.Contains(got, w) {
				t.Errorf("%s: %q has %q", tc.content, got, w)
			}
		}
	}
}

func TestAfterEmailResult(t *testing.T) {
	args := `{"to":"bob@example.com","subject":"Invoice","body":"Hello."}`
	for _, tc := range []struct {
		content string
		want    []string
	}{
		{`{"status":"committed","provider_id":"prov_123","key":"email:t:h:send"}`, []string{"handed to the provider", "prov_123", "bob@example.com"}},
		{`{"status":"rejected"}`, []string{"did not send", "rejected"}},
		{`{"status":"voided"}`, []string{"cancelled before it happened", "no email went out"}},
		{`{"status":"failed","error":"mailbox unavailable"}`, []string{"provider refused", "mailbox unavailable", "not sent"}},
		{`{"status":"failed"}`, []string{"provider refused"}},
		{`{"status":"unknown","key":"email:t:h:send","note":"…"}`, []string{"do not know yet", "bob@example.com", "may have been sent", "email:t:h:send"}},
		{`{"status":"maybe"}`, []string{"cannot tell whether the email went out"}},
		{`garbage`, []string{"cannot tell whether the email went out"}},
	} {
		got := noCall(t, chunks(t, toolResult(ToolSendEmail, args, tc.content)))
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.content, got, w)
			}
		}
		if strings.Contains(tc.content, `"committed"`) != strings.Contains(got, "handed to the provider") {
			t.Errorf("%s: %q", tc.content, got)
		}
	}
}

// After any tool result the reply is text, never a call, even when the
// conversation's user message would start a tool flow again.
func TestNoCallAfterToolResult(t *testing.T) {
	for _, req := range []model.Request{
		toolResult(ToolCatalogSearch, `{"query":"red mugs"}`, `{"matches":[]}`),
		toolResult(ToolSendEmail, `{}`, `{"status":"committed","provider_id":"p"}`),
		toolResult("other_tool", `{}`, `{}`),
		{Tools: allTools, Messages: []model.Message{{Role: model.RoleUser, Content: "search red mugs"}, {Role: model.RoleTool, Content: `{"matches":[]}`}}},
	} {
		if text := noCall(t, chunks(t, req)); len(strings.Fields(text)) < 5 {
			t.Errorf("reply %q", text)
		}
	}
}

// A request for Markdown gets a reply in Markdown, streamed so that the
// chunks joined are the text exactly (newlines kept); "repeat after me:"
// streams the rest of the message verbatim.
func TestMarkdownAndVerbatimReplies(t *testing.T) {
	got := strings.Join(collect(t, user("Show me markdown about goroutines")), "")
	for _, want := range []string{"## Goroutines, in short\n", "| Step | What | Time |\n|:-----|:----:|-----:|", "```go\npackage main", "- [x] Read the question", "https://go.dev/doc/"} {
		if !strings.Contains(got, want) {
			t.Errorf("markdown reply lacks %q:\n%s", want, got)
		}
	}
	hostile := "<script>alert(1)</script>\n\n[x](javascript:alert(1))  \n  ```\nunclosed"
	if got := strings.Join(collect(t, user("Repeat after me:\n"+hostile)), ""); got != hostile {
		t.Errorf("repeat after me gave %q, want %q", got, hostile)
	}
	if got := strings.Join(collect(t, user("please repeat after me")), ""); strings.Contains(got, "please repeat") {
		t.Errorf("a message not starting with the phrase was repeated: %q", got)
	}
}

// "use NAME with {json}" calls any offered tool with exactly those
// arguments; a tool not offered, or arguments that are not a JSON object,
// get words that say what to fix, and no call.
func TestUseToolWithJSON(t *testing.T) {
	offeredTools := append(append([]model.ToolSpec(nil), allTools...), model.ToolSpec{Name: "everything__echo"})
	text, call := splitCall(t, chunks(t, withTools("Use everything__echo with {\"message\": \"hi\",\n \"n\": 2}", offeredTools...)))
	if call.Name != "everything__echo" || string(call.Arguments) != `{"message":"hi","n":2}` || text != "Calling everything__echo." {
		t.Errorf("call %s %s after %q", call.Name, call.Arguments, text)
	}
	for _, tc := range []struct{ msg, want string }{
		{`use nothing__here with {}`, "No tool named nothing__here is offered. The tools are: catalog_search, send_email, other_tool, everything__echo."},
		{`use everything__echo with {"message": }`, "not a JSON object"},
		{`use everything__echo with {} and more`, "not a JSON object"}, // the object runs to the end of the message
		{`use everything__echo with {"a":1} {"b":2}`, "not a JSON object"},
	} {
		if got := noCall(t, chunks(t, withTools(tc.msg, offeredTools...))); !strings.Contains(got, tc.want) {
			t.Errorf("%q: %q lacks %q", tc.msg, got, tc.want)
		}
	}
	// An ordinary sentence that starts the same way is not a tool request.
	if got := noCall(t, chunks(t, withTools("use python with pandas for this", offeredTools...))); strings.Contains(got, "No tool named") {
		t.Errorf("an ordinary sentence was read as a tool request: %q", got)
	}
	if got := noCall(t, chunks(t, withTools(`use everything__echo with {"message":"hi"}`))); !strings.Contains(got, "no tools are offered") {
		t.Errorf("no tools offered: %q", got)
	}
}

// The answer to another tool's result says what its status says, and
// never that an unknown outcome did nothing.
func TestAfterOtherToolResult(t *testing.T) {
	for _, tc := range []struct{ content, want string }{
		{`{"content":[{"type":"text","text":"Echo: hi"}]}`, `The everything__echo tool returned: {"content":[{"type":"text","text":"Echo: hi"}]}`},
		{`{"status":"failed","error":"MCP server everything is not connected (closed); nothing was sent"}`, "failed: MCP server everything is not connected (closed); nothing was sent."},
		{`{"status":"unknown","key":"k","lookup":"scheduled"}`, "do not know whether everything__echo acted: it did not confirm, so it may have. The page shows the call and its key, and anything learned later."},
		{`{"status":"unknown","key":"k","lookup":"none"}`, "it may have, and it cannot be asked. The page shows the call and its key; only the system behind everything__echo can tell"},
		{`{"status":"rejected"}`, "because you rejected it"},
		{`{"status":"voided"}`, "cancelled before it was made"},
	} {
		got := noCall(t, chunks(t, toolResult("everything__echo", `{"message":"hi"}`, tc.content)))
		if !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q lacks %q", tc.content, got, tc.want)
		}
		if strings.Contains(tc.content, `"lookup":"none"`) && strings.Contains(got, "learned later") {
			t.Errorf("%s: %q promises news from a system that cannot be asked", tc.content, got)
		}
	}
}
