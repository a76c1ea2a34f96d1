package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
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

var (
	helpFlag    = regexp.MustCompile(`^  -([a-z0-9-]+)`)
	helpDefault = regexp.MustCompile(`\(default (.*)\)$`)
	helpEnv     = regexp.MustCompile(`\((GATEWAY_[A-Z0-9_]+(?:=1)?)\)`)
	docFlagRow  = regexp.MustCompile("(?m)^\\| `-([a-z0-9-]+)` \\| `(GATEWAY_[A-Z0-9_]+(?:=1)?)` \\| ([^|]*) \\|")
)

// TestConfigurationDocAgreesWithHelp keeps docs/configuration.md's table
// and `gateway -h` from disagreeing (issue #32): every flag the server
// takes has a row with the same environment variable, every row names a
// flag that exists, and a default that -h prints is the row's default
// (durations compared as durations: 720h is 720h0m0s). A default -h does
// not print (the zero value) may be described in words ("half of
// -workers", "random", "off").
func TestConfigurationDocAgreesWithHelp(t *testing.T) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "GATEWAY_") {
			t.Setenv(name, "") // the defaults, not this machine's settings
		}
	}
	var help strings.Builder
	if _, err := parseServe([]string{"-h"}, &help); err == nil {
		t.Fatal("serve -h did not stop at the help")
	}
	type flagHelp struct{ env, def string }
	flags := map[string]*flagHelp{}
	var cur *flagHelp
	for _, line := range strings.Split(help.String(), "\n") {
		if m := helpFlag.FindStringSubmatch(line); m != nil {
			cur = &flagHelp{}
			flags[m[1]] = cur
			continue
		}
		if cur == nil {
			continue
		}
		if m := helpEnv.FindStringSubmatch(line); m != nil {
			cur.env = m[1]
		}
		if m := helpDefault.FindStringSubmatch(line); m != nil {
			cur.def = strings.Trim(m[1], `"`)
		}
	}
	if len(flags) < 40 {
		t.Fatalf("read %d flags from serve -h, fewer than the server has:\n%s", len(flags), help.String())
	}
	rows := map[string][]string{}
	for _, m := range docFlagRow.FindAllStringSubmatch(readDoc(t, "docs/configuration.md"), -1) {
		rows[m[1]] = []string{m[2], strings.TrimSpace(strings.ReplaceAll(m[3], "`", ""))}
	}
	for name, f := range flags {
		row, ok := rows[name]
		switch {
		case !ok:
			t.Errorf("-%s (serve -h) has no row in docs/configuration.md", name)
		case row[0] != f.env:
			t.Errorf("-%s: docs/configuration.md says %s, serve -h says %s", name, row[0], f.env)
		case f.def != "" && !sameDefault(row[1], f.def):
			t.Errorf("-%s: docs/configuration.md gives the default %q, serve -h %q", name, row[1], f.def)
		}
	}
	for name := range rows {
		if flags[name] == nil {
			t.Errorf("docs/configuration.md documents -%s, which serve -h does not list", name)
		}
	}
}

// sameDefault compares a documented default with the one -h prints.
func sameDefault(doc, help string) bool {
	if doc == help {
		return true
	}
	a, errA := time.ParseDuration(doc)
	b, errB := time.ParseDuration(help)
	return errA == nil && errB == nil && a == b
}
