package cli

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Every docker flag with a hint is one its command lacks, and using it is a usage error
// (125 for run, 2 for the others) that says what to use instead.
func TestDockerFlagHints(t *testing.T) {
	root := (&app{}).rootCommand()
	for name, hints := range flagHints {
		cmd, _, err := root.Find([]string{name})
		if err != nil || cmd.Name() != name {
			t.Fatalf("flagHints names %q, which is no command", name)
		}
		want := exitUsage
		if name == "run" {
			want = exitNoLaunch
		}
		for spelt, hint := range hints {
			code, msg := execute([]string{name, spelt, "x"})
			if code != want || !strings.Contains(msg, "docker's "+spelt+": "+hint) || !strings.Contains(msg, spelt) {
				t.Errorf("roostctl %s %s x: exit %d, %q; want exit %d with the hint", name, spelt, code, msg, want)
			}
		}
	}
	// A flag of a shorthand group is told by the one that failed: -it by -i.
	if code, msg := execute([]string{"run", "-it", "x"}); code != exitNoLaunch || !strings.Contains(msg, "docker's -i: "+runFlagHints["-i"]) {
		t.Errorf("roostctl run -it x: exit %d, %q", code, msg)
	}
	// A flag docker lacks too is told as it was.
	if code, msg := execute([]string{"ps", "--bogus"}); code != exitUsage || msg != "unknown flag: --bogus" {
		t.Errorf("roostctl ps --bogus: exit %d, %q", code, msg)
	}
	// A flag with a hint for one command is no hint for another that has it.
	if code, msg := execute([]string{"logs", "-t", "--bogus"}); code != exitUsage || strings.Contains(msg, "docker") {
		t.Errorf("roostctl logs -t --bogus: exit %d, %q", code, msg)
	}
}

// Every docker command with a hint is one roostctl lacks, and naming it says what to use.
func TestDockerCommandHints(t *testing.T) {
	for name, hint := range commandHints {
		code, msg := execute([]string{name, "x"})
		if code != exitUsage || msg != "unknown command \""+name+"\"\n  docker's "+name+": "+hint {
			t.Errorf("roostctl %s x: exit %d, %q; want exit 2 with the hint", name, code, msg)
		}
	}
	if code, msg := execute([]string{"lgs"}); code != exitUsage || !strings.Contains(msg, "did you mean logs") {
		t.Errorf("roostctl lgs: exit %d, %q", code, msg)
	}
}

// What the hints tell a user to type exists: each roostctl command, and the flags given
// with it or with the command a flag hint is for.
func TestDockerHintsNameWhatExists(t *testing.T) {
	root := (&app{}).rootCommand()
	root.InitDefaultHelpCmd()
	check := func(where, text string, own *cobra.Command) {
		t.Helper()
		// Each clause on its own: "roostctl rm SESSION or roostctl prune", "ps -a | head".
		for _, clause := range strings.FieldsFunc(text, func(r rune) bool { return r == ';' || r == '|' || r == ',' || r == '(' || r == ')' || r == ':' }) {
			words := strings.Fields(clause)
			cmd := own
			for i, w := range words {
				switch {
				case w == "roostd":
					cmd = nil // roostd's flags are its own
				case w == "roostctl" && i+1 < len(words):
					found, _, err := root.Find(words[i+1 : min(i+3, len(words))])
					if err != nil || found == root {
						t.Errorf("%s: %q: roostctl has no command %q", where, clause, words[i+1])
						cmd = nil
						continue
					}
					cmd = found
				case strings.HasPrefix(w, "-") && w != "--" && cmd != nil:
					name, _, _ := strings.Cut(w, "=")
					var ok bool
					if long, isLong := strings.CutPrefix(name, "--"); isLong {
						ok = cmd.Flags().Lookup(long) != nil
					} else if _, err := strconv.Atoi(name[1:]); err == nil {
						ok = true // -2 is a number (head -2), not a flag
					} else {
						ok = true
						for _, c := range name[1:] {
							ok = ok && cmd.Flags().ShorthandLookup(string(c)) != nil
						}
					}
					if !ok {
						t.Errorf("%s: %q: %s has no flag %s", where, clause, cmd.CommandPath(), name)
					}
				}
			}
		}
	}
	for name, hints := range flagHints {
		own, _, _ := root.Find([]string{name})
		for spelt, hint := range hints {
			check("roostctl "+name+" "+spelt, hint, own)
		}
	}
	for name, hint := range commandHints {
		check("roostctl "+name, hint, nil)
	}
}

// roostctl run --help ends with what docker's habits are in roost.
func TestRunHelpComesFromDocker(t *testing.T) {
	root := (&app{}).rootCommand()
	run, _, _ := root.Find([]string{"run"})
	var out bytes.Buffer
	run.SetOut(&out)
	if err := run.Help(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out.String(), dockerRunHelp) || !strings.Contains(out.String(), "Flags:") {
		t.Fatalf("roostctl run --help:\n%s", out.String())
	}
	stage, _, _ := root.Find([]string{"stage"})
	out.Reset()
	stage.SetOut(&out)
	if err := stage.Help(); err != nil || strings.Contains(out.String(), "Coming from docker") {
		t.Fatalf("roostctl stage --help: %v\n%s", err, out.String())
	}
}
