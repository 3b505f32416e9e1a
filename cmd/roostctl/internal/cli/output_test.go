package cli

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShellJoinRoundTrips checks inspect's command line the way an operator uses it: pasted
// into a shell, it must give back the same argv, and stay on one line.
func TestShellJoinRoundTrips(t *testing.T) {
	argvs := [][]string{
		{"/bin/sh", "-c", "echo \"$HOME\"; echo 'it''s'\nexit 3"},
		{"python3", "-c", "print('a b')", ""},
		{"x", "tab\there", "bell\a", "quote\"'mix"},
	}
	for _, argv := range argvs {
		line := shellJoin(argv)
		if strings.Contains(line, "\n") {
			t.Errorf("shellJoin(%q) = %q: spans lines", argv, line)
		}
		out, err := exec.Command("bash", "-c", `for a in `+line+`; do printf '%s\0' "$a"; done`).Output()
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		if strings.Join(got, "\x00") != strings.Join(argv, "\x00") {
			t.Errorf("shellJoin(%q) = %s; bash reads it back as %q", argv, line, got)
		}
	}
}
