package cli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Every docker flag with a hint is one its command lacks, and using it is a usage error
// (125 for run, wait and exec, whose other codes are a program's; 2 for the others) that
// says what to use instead.
func TestDockerFlagHints(t *testing.T) {
	root := (&app{}).rootCommand()
	for name, hints := range flagHints {
		cmd, _, err := root.Find([]string{name})
		if err != nil || cmd.Name() != name {
			t.Fatalf("flagHints names %q, which is no command", name)
		}
		want := exitUsage
		if name == "run" || name == "wait" || name == "exec" {
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
	// A flag of the docker command roostctl lacks: the command is what is missing.
	if code, msg := execute([]string{"build", "-t", "web:1", "."}); code != exitUsage || !strings.Contains(msg, "docker's build: "+commandHints["build"]) {
		t.Errorf("roostctl build -t web:1 .: exit %d, %q", code, msg)
	}
	// artifacts rm is not rm.
	if code, msg := execute([]string{"artifacts", "rm", "-v", "x@1"}); code != exitUsage || strings.Contains(msg, "docker") {
		t.Errorf("roostctl artifacts rm -v x@1: exit %d, %q", code, msg)
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

// checkCommands holds what text tells a user to type to roostctl's command tree: each
// roostctl command it names, and the flags given with it, or with own (the command a flag
// hint is for) before any roostctl is named.
func checkCommands(t *testing.T, root *cobra.Command, where, text string, own *cobra.Command) {
	t.Helper()
	// Each clause on its own: "roostctl rm SESSION or roostctl prune", "ps -a | head".
	for _, clause := range strings.FieldsFunc(text, func(r rune) bool {
		return r == '\n' || r == ';' || r == '|' || r == '&' || r == ',' || r == '(' || r == ')' || r == ':'
	}) {
		words := strings.Fields(clause)
		cmd := own
		for i, w := range words {
			switch {
			case w == "roostd", w == "--":
				cmd = nil // roostd's flags are its own, and after -- come a command's
			case w == "roostctl" && i+1 < len(words):
				found, _, err := root.Find(words[i+1 : min(i+3, len(words))])
				if err != nil || found == root {
					t.Errorf("%s: %q: roostctl has no command %q", where, clause, words[i+1])
					cmd = nil
					continue
				}
				cmd = found
			case strings.HasPrefix(w, "-") && cmd != nil:
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

// What the hints tell a user to type exists.
func TestDockerHintsNameWhatExists(t *testing.T) {
	root := (&app{}).rootCommand()
	for name, hints := range flagHints {
		own, _, _ := root.Find([]string{name})
		for spelt, hint := range hints {
			checkCommands(t, root, "roostctl "+name+" "+spelt, hint, own)
		}
	}
	for name, hint := range commandHints {
		checkCommands(t, root, "roostctl "+name, hint, nil)
	}
	checkCommands(t, root, "roostctl run --help", dockerRunHelp, nil)
}

// docs/coming-from-docker.md names only commands and flags roostctl has, in its shell
// blocks and in every roostctl command quoted in its text, and has a row for every docker
// command roostctl has a hint for.
func TestComingFromDockerMatchesCommands(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "docs", "coming-from-docker.md"))
	if err != nil {
		t.Fatal(err)
	}
	root := (&app{}).rootCommand()
	root.InitDefaultCompletionCmd()
	inShell, inConsole, spans := false, false, 0
	var said []string // a console block's lines: "$ roostctl ...", then what it says
	for n, line := range strings.Split(string(data), "\n") {
		where := fmt.Sprintf("docs/coming-from-docker.md:%d", n+1)
		switch {
		case strings.HasPrefix(line, "```"):
			// sh blocks are what to type; a console block shows what roostctl says.
			if inConsole {
				checkSaid(t, where, said)
			}
			inShell, inConsole, said = line == "```sh", line == "```console", nil
		case inConsole:
			said = append(said, line)
		case inShell:
			if i := strings.Index(line, " #"); i >= 0 {
				line = line[:i]
			}
			checkCommands(t, root, where, line, nil)
		default:
			quoted := strings.Split(line, "`")
			for i := 1; i < len(quoted); i += 2 {
				if strings.HasPrefix(quoted[i], "roostctl ") {
					checkCommands(t, root, where, quoted[i], nil)
					spans++
				}
			}
		}
	}
	if spans < 20 {
		t.Fatalf("found %d roostctl commands in the text; the table quotes more", spans)
	}
	for name := range commandHints {
		if !strings.Contains(string(data), "`docker "+name) {
			t.Errorf("docs/coming-from-docker.md has no row for docker %s", name)
		}
	}
}

// checkSaid runs a console block's command, which needs no roostd, and holds what it says
// on stderr to the block's lines after it.
func checkSaid(t *testing.T, where string, said []string) {
	t.Helper()
	args, ok := strings.CutPrefix(said[0], "$ roostctl ")
	if !ok {
		t.Fatalf("%s: a console block begins %q, not with a roostctl command", where, said[0])
	}
	_, msg := execute(strings.Fields(args))
	if want := strings.Join(said[1:], "\n"); "roostctl: "+msg != want {
		t.Errorf("%s: roostctl %s says\nroostctl: %s\nnot\n%s", where, args, msg, want)
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
