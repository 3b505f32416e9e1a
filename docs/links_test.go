// Package docs holds roost's documentation; its test keeps the pages reachable from
// README.md and their relative links pointing at files and headings that exist.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// link is a Markdown inline link's target: [text](target), target up to a space or ")".
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// pages are README.md and every page in docs/, by path relative to the repository.
func pages(t *testing.T) []string {
	t.Helper()
	found, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Fatal("docs/ holds no .md page")
	}
	out := []string{"README.md"}
	for _, p := range found {
		out = append(out, filepath.Join("docs", p))
	}
	return out
}

func read(t *testing.T, repoPath string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", repoPath))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// prose is text with its fenced code blocks blanked out: a link or heading in a code
// block is an example, not a part of the page.
func prose(text string) string {
	lines := strings.Split(text, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// anchors are the ids GitHub gives a page's headings: lower case, spaces to hyphens,
// punctuation other than hyphens and underscores dropped, repeats numbered -1, -2, ….
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range strings.Split(prose(text), "\n") {
		title, ok := strings.CutPrefix(strings.TrimLeft(l, "#"), " ")
		if !ok || !strings.HasPrefix(l, "#") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(title)) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		id := b.String()
		if n := seen[id]; n > 0 {
			out[id+"-"+strconv.Itoa(n)] = true
		} else {
			out[id] = true
		}
		seen[id]++
	}
	return out
}

// TestEveryPageLinkedFromReadme: a page README.md does not link is a page no reader finds.
func TestEveryPageLinkedFromReadme(t *testing.T) {
	readme := prose(read(t, "README.md"))
	linked := map[string]bool{}
	for _, m := range link.FindAllStringSubmatch(readme, -1) {
		target, _, _ := strings.Cut(m[1], "#")
		linked[filepath.Clean(target)] = true
	}
	for _, p := range pages(t)[1:] {
		if !linked[p] {
			t.Errorf("README.md does not link %s", p)
		}
	}
}

// TestRelativeLinksResolve: every relative link of README.md and docs/*.md names a file of
// the repository and, with a #fragment, a heading of that page.
func TestRelativeLinksResolve(t *testing.T) {
	for _, p := range pages(t) {
		text := read(t, p)
		for _, m := range link.FindAllStringSubmatch(prose(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			dest := p
			if file != "" {
				dest = filepath.Join(filepath.Dir(p), file)
				if _, err := os.Stat(filepath.Join("..", dest)); err != nil {
					t.Errorf("%s: link %q: %v", p, target, err)
					continue
				}
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				t.Errorf("%s: link %q: a fragment of a file that is no Markdown page", p, target)
				continue
			}
			if !anchors(read(t, dest))[frag] {
				t.Errorf("%s: link %q: %s has no heading #%s", p, target, dest, frag)
			}
		}
	}
}
