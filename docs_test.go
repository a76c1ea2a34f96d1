package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

var (
	mdFence   = regexp.MustCompile("(?ms)^```.*?^```[ \t]*$")
	mdLink    = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]*)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *#* *$`)
)

// TestDocs keeps the documentation honest: every relative link in the
// README, docs/ and the other top-level Markdown files names a file that
// exists and, with a #fragment, a heading of it (GitHub's slugs), and the
// README stays one page (issue #32: at most 250 lines).
func TestDocs(t *testing.T) {
	files, _ := filepath.Glob("docs/*.md")
	files = append(files, "README.md", "ARCHITECTURE.md", "RELIABILITY.md", "SECURITY.md", "BENCHMARKS.md")
	for _, file := range files {
		text := readDoc(t, file)
		if file == "README.md" {
			if n := strings.Count(text, "\n"); n > 250 {
				t.Errorf("README.md has %d lines, more than 250: move reference material into docs/", n)
			}
		}
		for _, m := range mdLink.FindAllStringSubmatch(mdFence.ReplaceAllString(text, ""), -1) {
			target := m[1]
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			resolved := file
			if path != "" {
				resolved = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s: link %q: %v", file, target, err)
					continue
				}
			}
			if anchor != "" && !headingSlugs(readDoc(t, resolved))[anchor] {
				t.Errorf("%s: link %q: %s has no heading #%s", file, target, resolved, anchor)
			}
		}
	}
}

func readDoc(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// headingSlugs returns the anchors GitHub gives a Markdown file's headings:
// lowercased, punctuation but '-' and '_' dropped, spaces turned into '-',
// a repeated slug numbered -1, -2, ….
func headingSlugs(text string) map[string]bool {
	slugs, seen := map[string]bool{}, map[string]int{}
	for _, m := range mdHeading.FindAllStringSubmatch(mdFence.ReplaceAllString(text, ""), -1) {
		slug := strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				return unicode.ToLower(r)
			}
			return -1
		}, m[1])
		if n := seen[slug]; n > 0 {
			slugs[slug+"-"+strconv.Itoa(n)] = true
		} else {
			slugs[slug] = true
		}
		seen[slug]++
	}
	return slugs
}
