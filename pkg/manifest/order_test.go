package manifest

import (
	"strings"
	"testing"
)

// TestErrorsInFileOrder: a manifest with several problems lists them as an operator reads
// the file, by line and then column, whatever order the decoder found them in.
func TestErrorsInFileOrder(t *testing.T) {
	src := "name: x\n" +
		"run: {args: [a]}\n" +
		"capabilities:\n" +
		"  limits: {deadline_seconds: 0}\n" +
		"  foo: 1\n" +
		"version: bad\n"
	err := parseErr(t, src)
	want := []string{
		`capsule.yaml:2:1: run: needs exactly one of command or wasm; it has neither`,
		`capsule.yaml:4:30: capabilities.limits.deadline_seconds: must be greater than 0`,
		`capsule.yaml:5:3: capabilities.foo: unknown key`,
		`capsule.yaml:6:10: version: "bad" is not a semantic version`,
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("want %d problems, got:\n%v", len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("problem %d:\n got %s\nwant %s…", i, lines[i], w)
		}
	}
}

// TestMisspeltRunKey: a misspelt key under run is reported at that key, under its own path,
// once; run is not also said to lack a command, which only follows from the misspelling.
func TestMisspeltRunKey(t *testing.T) {
	for _, c := range []struct{ name, src, want string }{
		{"block", "name: x\nversion: 0.1.0\nrun:\n  comand: [/bin/true]\n", `capsule.yaml:4:3: run.comand: unknown key (did you mean "command"?)`},
		{"flow", "name: x\nversion: 0.1.0\nrun: {comand: [/bin/true]}\n", `capsule.yaml:3:7: run.comand: unknown key (did you mean "command"?)`},
		{"wasm", "name: x\nversion: 0.1.0\nrun: {wsam: a.wasm}\n", `capsule.yaml:3:7: run.wsam: unknown key (did you mean "wasm"?)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := parseErr(t, c.src)
			if got := err.Error(); got != c.want {
				t.Fatalf("error:\n%s\nwant exactly:\n%s", got, c.want)
			}
		})
	}
	// A run with no program and no typo still says what it lacks, at the run key.
	err := parseErr(t, "name: x\nversion: 0.1.0\nrun:\n  args: [a]\n")
	if want := `capsule.yaml:3:1: run: needs exactly one of command or wasm; it has neither`; err.Error() != want {
		t.Fatalf("error:\n%s\nwant exactly:\n%s", err, want)
	}
}
