package cli

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
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

// inspect lists the five most refused egress keys under the totals, the overflow key as
// "other hosts", and says how many more --json has.
func TestPrintSessionEgressRefused(t *testing.T) {
	e := &roostv1.Egress{Connections: 11, Denied: 10000, BytesDown: 220, UsedBytes: 220}
	e.Refused = append(e.Refused, &roostv1.EgressRefusal{Host: "*", Reason: "not_allowed", Count: 4000})
	for i := range 6 {
		e.Refused = append(e.Refused, &roostv1.EgressRefusal{Host: fmt.Sprintf("h%d.test", i), Port: 443, Reason: "not_allowed", Count: int64(1000 - i)})
	}
	var b strings.Builder
	printSession(&b, &roostv1.Session{Id: "ses_x", Egress: e})
	out := b.String()
	for _, want := range []string{
		"egress:       11 connection(s), 10000 denied; 0 B up, 220 B down; 220 B counted against egress_max_bytes\n",
		"refused:      4000× other hosts: not_allowed\n",
		"              1000× h0.test:443: not_allowed\n",
		"              997× h3.test:443: not_allowed\n",
		"              … 2 more (inspect --json)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "h4.test") {
		t.Errorf("more than five keys listed:\n%s", out)
	}
}
