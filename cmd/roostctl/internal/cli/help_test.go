package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/spf13/cobra"
)

func walkCommands(c *cobra.Command, visit func(*cobra.Command)) {
	visit(c)
	for _, sub := range c.Commands() {
		walkCommands(sub, visit)
	}
}

// TestHelpFitsWidth renders every command's help as `roostctl CMD --help` prints it and
// holds each line to helpWidth columns: an operator's 100-column terminal shows it unwrapped.
func TestHelpFitsWidth(t *testing.T) {
	root := (&app{}).rootCommand()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	walkCommands(root, func(c *cobra.Command) {
		if c.Hidden {
			return
		}
		var out bytes.Buffer
		c.SetOut(&out)
		if err := c.Help(); err != nil {
			t.Fatalf("%s: %v", c.CommandPath(), err)
		}
		for i, line := range strings.Split(out.String(), "\n") {
			if n := utf8.RuneCountInString(line); n > helpWidth {
				t.Errorf("%s --help, line %d is %d columns (at most %d):\n%s", c.CommandPath(), i+1, n, helpWidth, line)
			}
			if strings.TrimRight(line, " \t") != line {
				t.Errorf("%s --help, line %d ends in spaces: %q", c.CommandPath(), i+1, line)
			}
		}
		if c != root && c.Short == "" {
			t.Errorf("%s has no description in roostctl --help", c.CommandPath())
		}
	})
}

// TestCLITourMatchesCommands reads docs/cli.md's tour of roostctl as an operator would
// copy from it: each roostctl line must name a command that exists, with flags it has, and
// every command roostctl offers must appear there.
func TestCLITourMatchesCommands(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "## A tour of roostctl")
	if start < 0 {
		t.Fatal(`docs/cli.md has no "## A tour of roostctl" section`)
	}
	section := text[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	root := (&app{}).rootCommand()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	seen := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			continue
		}
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		for _, part := range strings.FieldsFunc(line, func(r rune) bool { return r == '&' || r == '|' || r == ';' }) {
			words := strings.Fields(strings.NewReplacer("[", " ", "]", " ").Replace(part))
			if len(words) < 2 || words[0] != "roostctl" {
				continue
			}
			cmd, rest, err := root.Find(words[1:])
			if err != nil || cmd == root {
				t.Errorf("docs/cli.md: %q: roostctl has no command %q", strings.TrimSpace(part), words[1])
				continue
			}
			// A subcommand shown shows its group too (roostctl files ls shows roostctl files).
			for c := cmd; c != nil; c = c.Parent() {
				seen[c.CommandPath()] = true
			}
			for _, w := range rest {
				if !strings.HasPrefix(w, "-") || w == "--" {
					continue
				}
				name, _, _ := strings.Cut(w, "=")
				var found bool
				if long, ok := strings.CutPrefix(name, "--"); ok {
					found = cmd.Flags().Lookup(long) != nil || cmd.InheritedFlags().Lookup(long) != nil
				} else if len(name) == 2 {
					found = cmd.Flags().ShorthandLookup(name[1:]) != nil || cmd.InheritedFlags().ShorthandLookup(name[1:]) != nil
				} else {
					found = true // -1, a number, not a flag
				}
				if !found {
					t.Errorf("docs/cli.md: %q: %s has no flag %s", strings.TrimSpace(part), cmd.CommandPath(), name)
				}
			}
		}
	}
	walkCommands(root, func(c *cobra.Command) {
		if c.Hidden || !c.Runnable() || c == root || c.Name() == "help" || c.HasParent() && c.Parent().Name() == "completion" {
			return
		}
		if !seen[c.CommandPath()] {
			t.Errorf("docs/cli.md's tour of roostctl never shows %q", c.CommandPath())
		}
	})
}
