package chat

import (
	"strings"
	"testing"
)

func TestCheckTitle(t *testing.T) {
	for _, ok := range []string{
		"Lisbon in May",
		"Объясни горутины",
		"👩‍💻 pair session", // a zero-width joiner inside an emoji sequence
		"عنوان عربي",       // right-to-left text needs no control character
		`<script>alert(1)</script>`,
		strings.Repeat("a", MaxTitleBytes),
		strings.Repeat("é", MaxTitleBytes/2),
	} {
		if err := CheckTitle("title", ok); err != nil {
			t.Errorf("CheckTitle(%q) = %v, want nil", ok, err)
		}
	}
	for _, tc := range []struct{ title, want string }{
		{"", "must not be empty"},
		{"   ", "only white space"},
		{strings.Repeat("a", MaxTitleBytes+1), "the maximum is 200"},
		{strings.Repeat("é", MaxTitleBytes/2+1), "the maximum is 200"},
		{"ab\xffcd", "not valid UTF-8"},
		{"a\x00b", "U+0000"},
		{"tab\there", "U+0009"},
		{"two\nlines", "U+000A"},
		{"cr\rhere", "U+000D"},
		{"\x1b[31mred\x1b[0m", "U+001B"},
		{"del\x7f", "U+007F"},
		{"c1\u0085next line", "U+0085"},
		{"c1\u009b", "U+009B"},
		{"line\u2028sep", "U+2028"},
		{"para\u2029sep", "U+2029"},
		{"invoice\u202Efdp.exe", "U+202E"},
		{"embed\u202A", "U+202A"},
		{"isolate\u2066x\u2069", "U+2066"},
		{"mark\u200Fx", "U+200F"},
		{"mark\u200Ex", "U+200E"},
		{"arabic mark\u061C", "U+061C"},
	} {
		err := CheckTitle("title", tc.title)
		if ErrorCode(err) != CodeInvalidRequest || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "title") {
			t.Errorf("CheckTitle(%q) = %v, want invalid_request naming title and %q", tc.title, err, tc.want)
		}
	}
	if err := CheckTitle("the new title", "a\x01"); err == nil || !strings.HasPrefix(err.(*Error).Message, "the new title ") {
		t.Errorf("the error does not name the field it was given: %v", err)
	}
}

// A title made from a user message passes the rule a client's title must.
func TestTitleFromPassesCheckTitle(t *testing.T) {
	for in, want := range map[string]string{
		"\x1b[31mred\x1b[0m alert":           "[31mred [0m alert",
		"tab\tand\u202Eoverride":             "tab and override",
		"\x01\x02":                           "",
		strings.Repeat("😀", 70):              strings.Repeat("😀", 49) + "…",
		"first\rsecond\nthird":               "first second",
		"  How do I plan a trip?\nMore text": "How do I plan a trip?",
	} {
		got := TitleFrom(in)
		if got != want {
			t.Errorf("TitleFrom(%q) = %q, want %q", in, got, want)
		}
		if got != "" {
			if err := CheckTitle("title", got); err != nil {
				t.Errorf("TitleFrom(%q) = %q, which CheckTitle refuses: %v", in, got, err)
			}
		}
	}
}
