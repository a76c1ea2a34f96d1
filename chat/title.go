package chat

import (
	"strings"
	"unicode/utf8"
)

// MaxTitleBytes bounds a thread title, in bytes of UTF-8 (the API, the
// rename form and the store use this one limit).
const MaxTitleBytes = 200

// CheckTitle is the rule for a thread title a client sends, on every
// transport (POST /api/threads, the rename form): 1 to MaxTitleBytes bytes of
// valid UTF-8, not only white space, and no control character (see
// IsControl). field names the input in the invalid_request it returns.
//
// A title is a one-line label shown in the sidebar, the page's title and
// other tabs: a line break, an escape sequence (which would reach a
// terminal reading the logs or a database dump) or a bidirectional
// override (which shows the text in another order than it is stored) has
// no business in one.
func CheckTitle(field, title string) error {
	switch {
	case title == "":
		return Invalid("%s must not be empty", field)
	case len(title) > MaxTitleBytes:
		return Invalid("%s is %d bytes; the maximum is %d", field, len(title), MaxTitleBytes)
	case !utf8.ValidString(title):
		return Invalid("%s is not valid UTF-8", field)
	case strings.TrimSpace(title) == "":
		return Invalid("%s must not be only white space", field)
	}
	if i := strings.IndexFunc(title, IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(title[i:])
		return Invalid(
			"%s contains the control character %U at byte %d: a title is one line of plain text (no line breaks, "+
				"tabs, escape sequences or bidirectional overrides)",
			field, r, i,
		)
	}
	return nil
}

// IsControl reports whether r is refused in a title: the C0 controls
// U+0000–U+001F (tab and line breaks included), DEL U+007F, the C1
// controls U+0080–U+009F, the line and paragraph separators U+2028 and
// U+2029, and the Unicode bidirectional formatting characters (the marks
// U+200E, U+200F and U+061C, the embeddings and overrides U+202A–U+202E,
// the isolates U+2066–U+2069) that "Trojan Source" text uses to display
// in another order than it is stored. Joiners (U+200C, U+200D), which
// emoji sequences and several scripts need, are allowed.
func IsControl(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x2028, r == 0x2029:
		return true
	case r == 0x200e, r == 0x200f, r == 0x061c:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}
