package demo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/honestcancel/gateway/model"
)

// Tool names the demo model knows how to call. It calls one only when the
// request offers it (model.Request.Tools, by name).
const (
	ToolCatalogSearch = "catalog_search"
	ToolSendEmail     = "send_email"
)

// DefaultRecipient is the "to" of a drafted email whose request names no
// address.
const DefaultRecipient = "customer@example.com"

// reply is the whole output for req, as chunks. The last message of the
// conversation decides what kind of reply it is:
//
//   - a tool result (RoleTool): a short text answer about that result, never
//     a call;
//   - a user message (not a fragment) asking to send/write/draft an email,
//     or to search/find/look something up, when the matching tool is
//     offered: a short text, then one final chunk with the call;
//   - a user message asking for an order: a card (one JSON document);
//   - a user message starting "repeat after me:": the rest of it, verbatim
//     (to show how the page renders any text a model may produce);
//   - a user message with the word "markdown" or "code": a reply formatted
//     in Markdown (headings, emphasis, lists, a task list, a table, a code
//     block, a quote, links), as real models answer;
//   - anything else: the text reply of compose.
func reply(req model.Request) []model.Chunk {
	if n := len(req.Messages); n > 0 {
		switch last := req.Messages[n-1]; {
		case last.Role == model.RoleTool:
			return textChunks(resumed(req, afterTool(last)))
		case last.Role == model.RoleUser && !last.Fragment:
			if rest, ok := repeatAfterMe(last.Content); ok {
				return verbatimChunks(rest)
			}
			if c := toolTurn(req, last.Content); c != nil {
				return c
			}
			if wantsMarkdown(last.Content) {
				return verbatimChunks(markdownReply(last.Content))
			}
		}
	}
	return textChunks(compose(req))
}

// repeatAfterMe returns what follows "repeat after me:" at the start of
// text (any letter case, leading spaces and one newline after the colon
// skipped).
func repeatAfterMe(text string) (string, bool) {
	const prefix = "repeat after me:"
	t := strings.TrimLeft(text, " \t\r\n")
	if len(t) < len(prefix) || !strings.EqualFold(t[:len(prefix)], prefix) {
		return "", false
	}
	rest := strings.TrimLeft(t[len(prefix):], " \t")
	rest = strings.TrimPrefix(strings.TrimPrefix(rest, "\r"), "\n")
	return rest, rest != ""
}

var markdownWord = regexp.MustCompile(`(?i)\b(markdown|code)\b`)

func wantsMarkdown(text string) bool { return markdownWord.MatchString(text) }

// markdownReply is the Markdown answer to text: the same shape every
// time, about text's first content words.
func markdownReply(text string) string {
	words, _ := topics(markdownWord.ReplaceAllString(text, ""))
	topic := "your question"
	if len(words) > 0 {
		topic = list(words)
	}
	first := "it"
	if len(words) > 0 {
		first = words[0]
	}
	return fmt.Sprintf(`## %[1]s, in short

Here is a **structured** answer about *%[1]s*, formatted the way a real model would format it.

1. Define what %[2]s means for you.
2. Try the smallest version that works.
3. Review the result and adjust.

What is done so far:

- [x] Read the question
- [ ] Try it yourself

| Step | What | Time |
|:-----|:----:|-----:|
| 1 | Define %[2]s | 5 min |
| 2 | Build the smallest version | 15 min |
| 3 | Review | 10 min |

`+"```go"+`
package main

import "fmt"

func main() {
	fmt.Println("hello, %[2]s")
}
`+"```"+`

> Keep it ~~complicated~~ simple: one step at a time.

More in [the Go tour](https://go.dev/tour/) or at https://go.dev/doc/ — and `+"`go doc fmt`"+` on the command line.`, capitalize(topic), first)
}

func capitalize(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToUpper(r)) + s[n:]
}

// verbatimChunks streams text as chunks of one word each with the white
// space before it (newlines included), so joined they are text exactly.
func verbatimChunks(text string) []model.Chunk {
	var out []model.Chunk
	for len(text) > 0 {
		i := strings.IndexFunc(text, func(r rune) bool { return !unicode.IsSpace(r) })
		if i < 0 {
			out = append(out, model.Chunk{Text: text})
			break
		}
		j := strings.IndexFunc(text[i:], unicode.IsSpace)
		if j < 0 {
			j = len(text) - i
		}
		out = append(out, model.Chunk{Text: text[:i+j]})
		text = text[i+j:]
	}
	return out
}

// textChunks streams text one word per chunk, each word but the first with
// its separating space.
func textChunks(text string) []model.Chunk {
	words := strings.Fields(text)
	out := make([]model.Chunk, len(words))
	for i, w := range words {
		if i > 0 {
			w = " " + w
		}
		out[i] = model.Chunk{Text: w}
	}
	return out
}

// resumed prefixes a tool-flow text with what happened to the stopped
// previous attempt, when the request says there was one.
func resumed(req model.Request, text string) string {
	if req.ResumeNote == "" {
		return text
	}
	return "Picking up from the saved point after the previous answer was " + why(req.ResumeNote) + ": " + text
}

func offered(req model.Request, name string) bool {
	for _, t := range req.Tools {
		if t.Name == name {
			return true
		}
	}
	return false
}

// token is one whitespace-separated piece of a message.
type token struct {
	raw   string // as written
	word  string // without surrounding punctuation
	lower string // word, lowercased
}

func tokenize(text string) []token {
	fields := strings.Fields(strings.ReplaceAll(text, "’", "'"))
	out := make([]token, len(fields))
	for i, f := range fields {
		w := trimPunct(f)
		out[i] = token{raw: f, word: w, lower: strings.ToLower(w)}
	}
	return out
}

// wordy reports whether w can be a content word: two runes or more, with a
// letter or digit, not an email address.
func wordy(w string) bool {
	return utf8.RuneCountInString(w) >= 2 && !strings.Contains(w, "@") &&
		strings.IndexFunc(w, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }) >= 0
}

func set(words string) map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(words) {
		m[w] = true
	}
	return m
}

var (
	searchVerbs = set("search find lookup")
	emailNouns  = set("email e-mail")
	emailVerbs  = set("send write draft mail")
	// Words that say where to search or how, not what.
	queryStop = set("search find lookup look up catalog catalogue shop store i'd i'm i'll we'd let's")
	// Words of an email request that are not its topic.
	emailStop = set("send write draft mail email e-mail emails i'd i'm i'll we'd let's short")
	// Words of an order request that are neither items nor quantities.
	orderStop = set(`order orders ordering place buy purchase item items piece pieces pcs pc unit units
		pack packs packet packets box boxes bottle bottles bag bags kg gr grams ml liter liters litre litres
		i'd i'm i'll we'd let's short`)
	numberWords = map[string]int{"one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
		"six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "dozen": 12}
	// Words that make the "order" after them a request.
	orderLead  = set("place make new create submit another my your our i'd we'd")
	aboutWords = set("about regarding concerning")
	// Words dropped from the start of an email's topic.
	phraseLead   = set("to for on with and please that saying re about regarding concerning")
	emailAddress = regexp.MustCompile(`[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}`)
)

// Intents of a user message that the tool flows handle.
const (
	intentNone = iota
	intentEmail
	intentSearch
	intentOrder
)

// intent classifies a user message; email wins over search, search over
// order. It returns, for search, the index of the token after the verb.
func intent(toks []token) (kind, after int) {
	email, verb := false, false
	search := -1
	for i, t := range toks {
		switch {
		case emailNouns[t.lower]:
			email = true
		case emailVerbs[t.lower]:
			verb = true
		}
		if search < 0 {
			if searchVerbs[t.lower] {
				search = i + 1
			} else if t.lower == "look" && i+1 < len(toks) && toks[i+1].lower == "up" {
				search = i + 2
			}
		}
	}
	switch {
	case email && verb:
		return intentEmail, 0
	case search >= 0:
		return intentSearch, search
	case orderIndex(toks) >= 0:
		return intentOrder, 0
	}
	return intentNone, 0
}

// orderIndex returns the index of the first "order"/"orders" that asks for
// an order, or -1. It counts where a request puts it: first in the message
// or clause (after punctuation), or after a stopword or a request word
// ("to order", "an order", "please order", "place order"). So "vector
// clocks order events" does not count, and neither does "order" with "in"
// one or two words before it ("in order to", "in what order").
func orderIndex(toks []token) int {
	for i, t := range toks {
		if t.lower != "order" && t.lower != "orders" {
			continue
		}
		if i > 0 && toks[i-1].lower == "in" || i > 1 && toks[i-2].lower == "in" {
			continue
		}
		if i == 0 || !strings.HasSuffix(toks[i-1].raw, toks[i-1].word) || !strings.HasPrefix(t.raw, t.word) {
			return i
		}
		if prev := toks[i-1].lower; stopwords[prev] || orderLead[prev] {
			return i
		}
	}
	return -1
}

// toolTurn is the reply to a user message that starts a tool flow, or nil
// when the message starts none (or its tool is not offered).
func toolTurn(req model.Request, text string) []model.Chunk {
	if name, args, ok := useTool(text); ok {
		return explicitCall(req, name, args)
	}
	toks := tokenize(text)
	switch kind, after := intent(toks); kind {
	case intentEmail:
		if !offered(req, ToolSendEmail) {
			return nil
		}
		args := draftEmail(text, toks)
		return withCall(req, resumed(req, "I drafted the email below. Please confirm before I send it."), ToolSendEmail, args)
	case intentSearch:
		if !offered(req, ToolCatalogSearch) {
			return nil
		}
		q := searchQuery(toks, after)
		if q == "" {
			return textChunks(resumed(req, "What should I search the catalog for? Tell me a product name or a few words that describe it."))
		}
		return withCall(req, resumed(req, "Let me search the catalog for "+q+"."), ToolCatalogSearch, map[string]string{"query": q})
	case intentOrder:
		return cardChunks(orderCard(toks))
	}
	return nil
}

// useToolPattern is a request to call a tool by name: "use NAME with
// {JSON object}" (any letter case; from the "{" to the end of the message
// must be the object).
var useToolPattern = regexp.MustCompile(`(?is)^\s*use\s+([A-Za-z0-9_-]+)\s+with\s+(\{.*?)\s*$`)

// useTool reads "use NAME with {json}" from text.
func useTool(text string) (name, args string, ok bool) {
	m := useToolPattern.FindStringSubmatch(text)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// explicitCall answers "use NAME with {json}": the call, when the tool is
// offered and the arguments are a JSON object; otherwise words saying what
// to fix (the tools offered, or that the arguments are not JSON).
func explicitCall(req model.Request, name, args string) []model.Chunk {
	if !offered(req, name) {
		var names []string
		for _, t := range req.Tools {
			names = append(names, t.Name)
		}
		if len(names) == 0 {
			return textChunks(resumed(req, "No tool named "+name+" is configured, and no tools are offered."))
		}
		return textChunks(resumed(req, "No tool named "+name+" is offered. The tools are: "+strings.Join(names, ", ")+"."))
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(args)); err != nil || compact.Bytes()[0] != '{' {
		return textChunks(resumed(req, "The arguments for "+name+" are not a JSON object; write them as use "+name+" with {\"name\": \"value\"}."))
	}
	return withCall(req, resumed(req, "Calling "+name+"."), name, json.RawMessage(compact.Bytes()))
}

// withCall streams text word by word and ends with the call.
func withCall(req model.Request, text, name string, args any) []model.Chunk {
	raw, err := json.Marshal(args)
	if err != nil {
		panic(err) // maps and structs of strings always marshal
	}
	return append(textChunks(text), model.Chunk{Call: &model.ToolCall{ID: callID(req, name, raw), Name: name, Arguments: raw}})
}

// callID is "call_" and 12 hex digits of a hash of the conversation and the
// call. It ignores the resume note, so a re-run of a stopped step asks for
// the same call with the same id.
func callID(req model.Request, name string, args []byte) string {
	h := fnv.New64a()
	for _, m := range req.Messages {
		fmt.Fprintf(h, "%s\x00%t\x00%t\x00%s\x00", m.Role, m.Fragment, m.Card, m.Content)
	}
	fmt.Fprintf(h, "%s\x00%s", name, args)
	return fmt.Sprintf("call_%012x", h.Sum64()>>16)
}

// contentWords returns the distinct content words of toks (not stopwords,
// not in skip), in order, as written.
func contentWords(toks []token, skip map[string]bool) []string {
	var out []string
	seen := map[string]bool{}
	for _, t := range toks {
		if !wordy(t.word) || stopwords[t.lower] || skip[t.lower] || seen[t.lower] {
			continue
		}
		seen[t.lower] = true
		out = append(out, t.word)
	}
	return out
}

// searchQuery is at most five lowercased content words after the search
// verb (toks[after:]), or of the whole message when there are none there.
func searchQuery(toks []token, after int) string {
	words := contentWords(toks[after:], queryStop)
	if len(words) == 0 {
		words = contentWords(toks, queryStop)
	}
	words = words[:min(len(words), 5)]
	return strings.ToLower(strings.Join(words, " "))
}

// draftEmail builds the send_email arguments from the request's words.
func draftEmail(text string, toks []token) map[string]string {
	to := emailAddress.FindString(text)
	if to == "" {
		to = DefaultRecipient
	}
	// The topic: what follows "about"/"regarding"/"concerning", else what
	// follows "that"/"saying", else what follows the word "email".
	lead, start := "I am writing to you about", -1
	if i := slices.IndexFunc(toks, func(t token) bool { return aboutWords[t.lower] }); i >= 0 {
		start = i + 1
	} else if i := slices.IndexFunc(toks, func(t token) bool { return t.lower == "that" || t.lower == "saying" }); i >= 0 {
		lead, start = "I wanted to let you know that", i+1
	} else if i := slices.IndexFunc(toks, func(t token) bool { return emailNouns[t.lower] }); i >= 0 {
		start = i + 1
	}
	var phrase []token
	for i := start; i >= 0 && i < len(toks); i++ {
		t := toks[i]
		if strings.Contains(t.raw, "@") || t.lower == "to" && i+1 < len(toks) && strings.Contains(toks[i+1].raw, "@") {
			continue
		}
		if t.word == "" || len(phrase) == 0 && phraseLead[t.lower] {
			continue
		}
		phrase = append(phrase, t)
	}
	for len(phrase) > 0 && phrase[len(phrase)-1].lower == "please" {
		phrase = phrase[:len(phrase)-1]
	}
	topic := make([]string, len(phrase))
	for i, t := range phrase {
		topic[i] = t.raw
	}
	about := strings.TrimRightFunc(strings.Join(topic, " "), func(r rune) bool { return unicode.IsPunct(r) || unicode.IsSpace(r) })
	words := contentWords(phrase, emailStop)
	if about == "" || len(words) == 0 {
		words = contentWords(toks, emailStop)
		lead, about = "I am writing to you about", list(words)
		if about == "" {
			about = "your recent message"
		}
	}
	subject := "A quick note"
	if len(words) > 0 {
		subject = strings.Join(words[:min(len(words), 5)], " ")
		r, n := utf8.DecodeRuneInString(subject)
		subject = string(unicode.ToUpper(r)) + subject[n:]
	}
	body := "Hello,\n\n" + lead + " " + about + ". Please let me know if you have any questions. Thank you for your time.\n\nBest regards"
	return map[string]string{"to": to, "subject": subject, "body": body}
}

// Order card.

type orderItem struct {
	Name     string      `json:"name"`
	Quantity int         `json:"quantity"`
	Price    json.Number `json:"price"`
}

type order struct {
	Type     string      `json:"type"`
	Items    []orderItem `json:"items"`
	Currency string      `json:"currency"`
	Total    json.Number `json:"total"`
}

// quantity reads "3", "3x", "x3" or "three".
func quantity(w string) (int, bool) {
	if n, ok := numberWords[w]; ok {
		return n, true
	}
	w = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSuffix(w, "×"), "x"), "x")
	n, err := strconv.Atoi(w)
	return n, err == nil && n > 0 && n < 1000
}

func cents(c int) json.Number { return json.Number(fmt.Sprintf("%d.%02d", c/100, c%100)) }

// price is the demo price of an item, in cents: x.99 from 1.99 to 48.99.
func price(name string) int {
	h := fnv.New32a()
	h.Write([]byte(name))
	return 199 + int(h.Sum32()%48)*100
}

// orderCard is the order a message asks for, as one compact JSON object:
// items are runs of content words (at most three words, five items), each
// with the quantity written before it (else the one written right after the
// last item, else 1).
func orderCard(toks []token) string {
	var items []orderItem
	var name []string
	pending, explicit := 0, false
	seen := map[string]bool{}
	flush := func() {
		if len(name) == 0 {
			return
		}
		n := strings.Join(name[:min(len(name), 3)], " ")
		name = name[:0]
		if seen[n] || len(items) == 5 {
			return
		}
		seen[n] = true
		q := max(pending, 1)
		explicit, pending = pending > 0, 0
		items = append(items, orderItem{Name: n, Quantity: q})
	}
	for _, t := range toks {
		if q, ok := quantity(t.lower); ok {
			flush()
			pending = q
			continue
		}
		if !wordy(t.word) || stopwords[t.lower] || orderStop[t.lower] {
			flush()
			continue
		}
		name = append(name, strings.TrimFunc(t.lower, func(r rune) bool { return unicode.IsPunct(r) || unicode.IsSymbol(r) }))
		if !strings.HasSuffix(t.raw, t.word) {
			flush() // "mugs," ends an item
		}
	}
	flush()
	if pending > 0 && len(items) > 0 && !explicit {
		items[len(items)-1].Quantity = pending // "coffee beans, 2 kg"
	}
	if len(items) == 0 {
		items = append(items, orderItem{Name: "demo item", Quantity: max(pending, 1)})
	}
	total := 0
	for i := range items {
		p := price(items[i].Name)
		items[i].Price = cents(p)
		total += p * items[i].Quantity
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(order{Type: "order", Items: items, Currency: "EUR", Total: cents(total)}); err != nil {
		panic(err) // strings, ints and well-formed numbers always encode
	}
	return strings.TrimSpace(buf.String())
}

// cardChunks splits a JSON document into pieces of a few characters to
// about one word: after each ',' ':' '{' '[' outside strings, and after a
// space inside a string. Every piece is marked Card. The document is an
// object, so no concatenation of the pieces short of all of them is valid
// JSON.
func cardChunks(doc string) []model.Chunk {
	var out []model.Chunk
	start, inString, escaped := 0, false, false
	for i := 0; i < len(doc); i++ {
		c, cut := doc[i], false
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case inString:
			cut = c == ' '
		case c == ',' || c == ':':
			cut = true
		case c == '{' || c == '[':
			cut = i+1 < len(doc) && doc[i+1] != '{' && doc[i+1] != '['
		}
		if cut {
			out = append(out, model.Chunk{Text: doc[start : i+1], Card: true})
			start = i + 1
		}
	}
	if start < len(doc) {
		out = append(out, model.Chunk{Text: doc[start:], Card: true})
	}
	return out
}

// After a tool result.

// afterTool answers the result of a tool call in words. It never calls a
// tool, so a result can never loop into the same call.
func afterTool(m model.Message) string {
	name := ""
	var args map[string]any
	if m.Call != nil {
		name = m.Call.Name
		_ = json.Unmarshal(m.Call.Arguments, &args)
	}
	switch name {
	case ToolCatalogSearch:
		q, _ := args["query"].(string)
		return searchAnswer(m.Content, q)
	case ToolSendEmail:
		to, _ := args["to"].(string)
		return emailAnswer(m.Content, to)
	case "":
		return "I received a tool result. Tell me what you would like to do next."
	}
	return toolAnswer(name, m.Content)
}

// toolAnswer is the answer to the result of any other tool: what the
// recorded status says (rejected, voided, unknown, failed), or the start
// of what it returned. It never says an action did not happen when the
// status is unknown.
func toolAnswer(name, content string) string {
	var r map[string]any
	dec := json.NewDecoder(strings.NewReader(content))
	dec.UseNumber()
	_ = dec.Decode(&r)
	switch strings.ToLower(str(r["status"])) {
	case "rejected":
		return "I did not call " + name + ", because you rejected it. Tell me what to change."
	case "voided":
		return "The call to " + name + " was cancelled before it was made, so it did nothing."
	case "unknown":
		if str(r["lookup"]) == "none" {
			// Nothing more will be learned: say where the answer is.
			return "I do not know whether " + name + " acted: it did not confirm, so it may have, and it cannot be asked. The page shows the call and its key; only the system behind " + name + " can tell, from its own records."
		}
		return "I do not know whether " + name + " acted: it did not confirm, so it may have. The page shows the call and its key, and anything learned later."
	case "failed":
		if e := str(r["error"]); e != "" {
			return "The " + name + " tool failed: " + strings.TrimRightFunc(e, func(r rune) bool { return r == '.' || unicode.IsSpace(r) }) + "."
		}
		return "The " + name + " tool failed without giving a reason."
	}
	out := strings.Join(strings.Fields(content), " ")
	if utf8.RuneCountInString(out) > 300 {
		out = string([]rune(out)[:300]) + "…"
	}
	return "The " + name + " tool returned: " + out
}

// str reads v as text: a string, or a number written plainly.
func str(v any) string {
	switch v := v.(type) {
	case string:
		return strings.TrimSpace(v)
	case json.Number:
		return v.String()
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return ""
}

const unreadable = "Sorry, I could not read the search result, so I cannot list any matches. Shall I try the search again?"

// searchAnswer lists up to five matches of a catalog_search result.
func searchAnswer(content, query string) string {
	var matches []map[string]any
	dec := json.NewDecoder(strings.NewReader(content))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return unreadable
	}
	var found []any
	switch v := v.(type) {
	case map[string]any:
		l, ok := v["matches"].([]any)
		if !ok && v["matches"] != nil {
			return unreadable
		}
		found = l
	case []any:
		found = v
	default:
		return unreadable
	}
	for _, x := range found {
		if m, ok := x.(map[string]any); ok {
			matches = append(matches, m)
		}
	}
	forQuery := ""
	if query != "" {
		forQuery = " for " + query
	}
	if len(matches) == 0 {
		return "Nothing in the catalog matched your search" + forQuery + ". Try other words and I will search again."
	}
	var parts []string
	for _, m := range matches[:min(len(matches), 5)] {
		name := str(m["name"])
		if name == "" {
			name = str(m["title"])
		}
		if name == "" {
			name = str(m["sku"])
		}
		if name == "" {
			name = "an unnamed item"
		}
		if p := priceText(m["price"]); p != "" {
			if c := str(m["currency"]); c != "" {
				p += " " + c
			}
			name += " for " + p
		}
		parts = append(parts, name)
	}
	var b strings.Builder
	switch {
	case len(matches) == 1:
		fmt.Fprintf(&b, "I found one match%s: %s.", forQuery, parts[0])
		b.WriteString(" Would you like me to order it?")
		return b.String()
	case len(matches) > 5:
		fmt.Fprintf(&b, "I found %d matches%s; the first five are %s.", len(matches), forQuery, list(parts))
	default:
		fmt.Fprintf(&b, "I found %d matches%s: %s.", len(matches), forQuery, list(parts))
	}
	b.WriteString(" Would you like me to order one of them?")
	return b.String()
}

// priceText writes a price with two decimals.
func priceText(v any) string {
	s := str(v)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return strconv.FormatFloat(f, 'f', 2, 64)
	}
	return s
}

// emailAnswer says truthfully what became of a send_email call.
func emailAnswer(content, to string) string {
	var r map[string]any
	dec := json.NewDecoder(strings.NewReader(content))
	dec.UseNumber()
	if err := dec.Decode(&r); err != nil {
		return "I could not read the result of the send, so I cannot tell whether the email went out."
	}
	the := "The email"
	if to != "" {
		the = "The email to " + to
	}
	switch strings.ToLower(str(r["status"])) {
	case "committed":
		if id := str(r["provider_id"]); id != "" {
			return the + " was handed to the provider, which gave it the id " + id + ". Anything else I can do?"
		}
		return the + " was handed to the provider. Anything else I can do?"
	case "rejected":
		return "I did not send the email, because you rejected the draft. Tell me what to change and I will draft it again."
	case "voided":
		return "The send was cancelled before it happened, so no email went out."
	case "unknown":
		// The answer was lost: it may have gone out. Never say it did not.
		what := "whether the email went out"
		if to != "" {
			what = "whether the email to " + to + " went out"
		}
		key := ""
		if k := str(r["key"]); k != "" {
			key = " under the key " + k
		}
		return "I do not know yet " + what + ": the provider did not confirm it, so it may have been sent. The gateway keeps asking the provider" + key + " and shows what it finds on the page."
	case "failed":
		if e := str(r["error"]); e != "" {
			return "The provider refused the email, so it was not sent. The error was: " + strings.TrimRightFunc(e, func(r rune) bool { return r == '.' || unicode.IsSpace(r) }) + "."
		}
		return "The provider refused the email without giving a reason, so it was not sent."
	}
	return "I could not read the result of the send, so I cannot tell whether the email went out."
}
