package demo

import (
	"context"
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/honestcancel/gateway/model"
)

// Title names a conversation from its first request, as a model asked for
// a title would, deterministically: the last four content words of the
// request (stop words, words of asking, "short" and single letters left
// out; numbers kept: "part 2" is not "part 3"), the first
// capitalised, so two requests that start alike ("Can you help me with …")
// get titles that differ. A request with no content word has no title (error): the
// conversation keeps the start of its request.
func (b *Backend) Title(ctx context.Context, request []model.Message) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	var text string
	for _, m := range request {
		if m.Role == model.RoleUser {
			text = m.Content
		}
	}
	if said, ok := repeatAfterMe(text); ok {
		text = said
	}
	var words []string
	seen := map[string]bool{}
	for _, f := range strings.Fields(text) {
		w := trimPunct(f)
		lw := strings.ToLower(w)
		number := w != "" && strings.IndexFunc(w, func(r rune) bool { return !unicode.IsDigit(r) }) < 0
		if (utf8.RuneCountInString(w) < 2 && !number) || stopwords[lw] || requestWords[lw] || lw == "short" || seen[lw] ||
			strings.IndexFunc(w, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }) < 0 {
			continue
		}
		seen[lw] = true
		words = append(words, w)
	}
	if len(words) == 0 {
		return "", errors.New("demo: the request has no word to name it by")
	}
	// What a request is about tends to come last ("can you help me think
	// through how to … repaint a wooden boat"): its last four words.
	return capitalize(strings.Join(words[max(0, len(words)-4):], " ")), nil
}

// requestWords are words of asking rather than of a subject, left out of
// titles.
var requestWords = set(`help think through step steps detail details explain tell describe show give
	could would please tips idea ideas ways`)
