package web

import (
	"fmt"
	"unicode/utf8"

	"github.com/honestcancel/gateway/chat"
)

// What a conversation page holds at first, so that it loads whatever the
// conversation's length: the latest messages, at most firstPaintMessages
// of them (one page: what the script draws before the page can be used
// grows with it; measured in docs/page.md, "Long conversations") and, but
// for the latest, chat.HistoryPageBytes of content (the rest is fetched as
// the reader scrolls up, or with "Show earlier messages": GET
// /api/threads/{id}/messages), and of a reply longer than displayBytes
// only its start ("Show the whole reply"). The page script uses the same
// numbers (static/src/history.ts).
const (
	firstPaintMessages = chat.DefaultHistoryPage
	displayBytes       = 256 << 10
)

// clip is the start of a reply the page shows at first: the whole of it,
// or, past displayBytes, the longest start within it that ends on a code
// point, and true.
func clip(text string) (string, bool) {
	if len(text) <= displayBytes {
		return text, false
	}
	n := displayBytes
	for back := 0; back < utf8.UTFMax-1 && n > 0 && !utf8.RuneStart(text[n]); back++ {
		n--
	}
	return text[:n], true
}

// clippedLabel says how much of a long reply is shown.
func clippedLabel(text string) string {
	return fmt.Sprintf("Showing the first %s of %s.", size(displayBytes), size(len(text)))
}

// cutLabel says a reply was cut at the size limit, and where.
func cutLabel(text string) string {
	return fmt.Sprintf("Cut at the size limit: the model was stopped after %s, and nothing past that was kept.", size(len(text)))
}

// earlierLabel is the "Show earlier messages" button's text.
func earlierLabel(n int) string {
	if n == 1 {
		return "Show 1 earlier message"
	}
	return fmt.Sprintf("Show earlier messages (%d more)", n)
}

// size writes a byte count for people: "256 KiB", "1.5 MiB".
func size(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
