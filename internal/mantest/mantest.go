// Package mantest holds roost's hand-written man pages (man/ at the top of the tree) to the
// code they describe: the tests of the packages that define roostd's flags, its
// configuration keys and the manifest's keys read a page's items through it, so that a key
// added without its item, or an item left after its key is gone, fails them; and Lint fails
// a page man or groff warns about.
package mantest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"roost.dev/roost/internal/testenv"
)

// Path is the page's file in the tree: man/<name>.
func Path(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "man", name)
}

// Item is one tagged paragraph (.TP) of a page, as it reads: font changes and escapes gone.
type Item struct {
	Term string
	Text string
}

// Items are the tagged paragraphs of the page's section (.SH) named section, its
// subsections' included, in order.
func Items(t testing.TB, page, section string) []Item {
	t.Helper()
	data, err := os.ReadFile(Path(page))
	if err != nil {
		t.Fatal(err)
	}
	var items []Item
	in, tag := false, false
	for _, line := range strings.Split(string(data), "\n") {
		macro, args, isMacro := strings.Cut(line, " ")
		if !isMacro {
			macro = line
		}
		switch {
		case macro == ".SH":
			in = unquote(args) == section
			tag = false
			continue
		case !in || strings.HasPrefix(line, `.\"`):
			continue
		case macro == ".TP":
			tag = true
			continue
		case macro == ".SS" || macro == ".PP" || macro == ".RS":
			tag = false
			items = append(items, Item{})
			continue
		}
		text := render(line)
		switch {
		case tag:
			items = append(items, Item{Term: text})
			tag = false
		case len(items) > 0 && items[len(items)-1].Term != "":
			last := &items[len(items)-1]
			last.Text = strings.TrimSpace(last.Text + " " + text)
		}
	}
	var out []Item
	for _, it := range items {
		if it.Term != "" {
			out = append(out, it)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no items in section %s", page, section)
	}
	return out
}

// Example is the first unfilled block (.nf to .fi) of the page's section, as it reads.
func Example(t testing.TB, page, section string) string {
	t.Helper()
	data, err := os.ReadFile(Path(page))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in, nf := false, false
	for _, line := range strings.Split(string(data), "\n") {
		macro, args, _ := strings.Cut(line, " ")
		switch {
		case macro == ".SH":
			in = unquote(args) == section
		case in && macro == ".nf":
			nf = true
		case in && nf && macro == ".fi":
			return strings.Join(out, "\n") + "\n"
		case in && nf:
			out = append(out, render(line))
		}
	}
	t.Fatalf("%s has no example in section %s", page, section)
	return ""
}

// render is a line of roff source as it reads: a macro's arguments (joined without spaces
// for the alternating-font macros), font changes and escapes gone.
func render(line string) string {
	if strings.HasPrefix(line, ".") {
		macro, args, _ := strings.Cut(line, " ")
		sep := " "
		switch macro {
		case ".BR", ".RB", ".BI", ".IB", ".IR", ".RI":
			sep = ""
		}
		line = strings.Join(splitArgs(args), sep)
	}
	return strings.NewReplacer(`\fB`, "", `\fI`, "", `\fR`, "", `\fP`, "", `\-`, "-", `\e`, `\`, `\&`, "", `\(aq`, "'").Replace(line)
}

// splitArgs splits a macro's arguments as roff does: at spaces, a quoted one whole.
func splitArgs(s string) []string {
	var args []string
	var cur strings.Builder
	quoted, has := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, has = !quoted, true
		case r == ' ' && !quoted:
			if has {
				args = append(args, cur.String())
			}
			cur.Reset()
			has = false
		default:
			cur.WriteRune(r)
			has = true
		}
	}
	if has {
		args = append(args, cur.String())
	}
	return args
}

func unquote(s string) string { return strings.Trim(s, `"`) }

// Lint fails t when man (man --warnings -l), groff (-man -ww -z) or mandoc (-Tlint, at
// warnings and above) says anything about the page at path, or fails on it.
func Lint(t testing.TB, path string) {
	t.Helper()
	for _, tool := range [][]string{
		{"man", "--warnings", "-l", path},
		{"groff", "-man", "-ww", "-z", path},
		{"mandoc", "-Tlint", "-W", "warning", path},
	} {
		_, err := exec.LookPath(tool[0])
		testenv.Need(t, tool[0], err)
		cmd := exec.Command(tool[0], tool[1:]...)
		// mandoc -Tlint says what it finds on stdout, the others on stderr; what they render
		// goes nowhere (-z, -Tlint) or to stdout.
		var said bytes.Buffer
		cmd.Stderr = &said
		if tool[0] == "mandoc" {
			cmd.Stdout = &said
		}
		// man would page its output on a terminal.
		cmd.Env = append(os.Environ(), "MANPAGER=cat", "PAGER=cat")
		if err := cmd.Run(); err != nil || said.Len() > 0 {
			t.Errorf("%s: %v\n%s", strings.Join(tool, " "), err, said.String())
		}
	}
}
