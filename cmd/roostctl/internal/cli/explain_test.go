package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func sampleExplanation() *roostv1.Explanation {
	long := "the session's endpoint, inside its own network namespace, referees every spawn (spawn.allow, depth, live children, then the child's envelope); roostd's socket is absent from the root"
	return &roostv1.Explanation{
		Capsule: &roostv1.CapsuleRef{Name: "x", Version: "0.1.0", Sha256: "sha256:" + strings.Repeat("ab", 32), Source: "/work/x"},
		Containment: &roostv1.ContainmentDecision{Declared: "sealed", Achieved: "sealed", FloorMet: true,
			Mechanism: "libcontainer: a user namespace (root inside is an unprivileged host uid range of the session's own), mount, pid, ipc, uts, net and cgroup namespaces; composed read-only root; cgroup memory, pids and cpu; seccomp; no capabilities; no_new_privs",
			Sources:   []*roostv1.FloorSource{{Source: "capabilities.containment", Class: "sealed"}}},
		Readable: []string{"only its root: /usr (read-only), a generated /etc, /capsule (read-only), /work, /tmp, /root, /dev/shm, /proc (masked), a minimal /dev"},
		Grants: []*roostv1.Grant{
			{Key: "containment", Value: "sealed", Enforcement: "enforced", Mechanism: "libcontainer: a user namespace and the rest"},
			{Key: "spawn.allow", Value: "none", Enforcement: "enforced", Mechanism: long},
			{Key: "resources.cgroup_pids_max", Value: "64", Enforcement: "enforced", Mechanism: "cgroup pids.max"},
		},
	}
}

// TestExplainWraps: explain's human output fits the width it is given, continuation lines
// indented under the text they continue, and no word is lost.
func TestExplainWraps(t *testing.T) {
	for _, width := range []int{100, 80, 60} {
		var out bytes.Buffer
		printExplanation(&out, sampleExplanation(), width)
		text := out.String()
		for _, line := range strings.Split(text, "\n") {
			// A word longer than the width (a digest) cannot be broken; it stands alone.
			if n := utf8.RuneCountInString(line); n > width && strings.Contains(strings.TrimSpace(line), " ") {
				t.Errorf("width %d: line of %d columns: %q", width, n, line)
			}
		}
		for _, word := range []string{"no_new_privs", "envelope);", "absent", "(masked),", "pids.max"} {
			if !strings.Contains(text, word) {
				t.Errorf("width %d: %q lost:\n%s", width, word, text)
			}
		}
		// Hanging indent: the mechanism's second line starts under its first's text.
		lines := strings.Split(text, "\n")
		for i, l := range lines {
			if strings.HasPrefix(l, "mechanism") && i+1 < len(lines) && !strings.HasPrefix(lines[i+1], strings.Repeat(" ", 13)) {
				t.Errorf("width %d: no hanging indent after %q: %q", width, l, lines[i+1])
			}
		}
	}
}

// TestExplainSaysMechanismOnce: the class's mechanism is said once, in the header, not again
// as the containment grant's row.
func TestExplainSaysMechanismOnce(t *testing.T) {
	var out bytes.Buffer
	printExplanation(&out, sampleExplanation(), 100)
	if n := strings.Count(out.String(), "libcontainer"); n != 1 {
		t.Errorf("the mechanism is said %d times:\n%s", n, out.String())
	}
}

// TestOCINote: the OCI spec of a capsule that would not run sealed comes with why.
func TestOCINote(t *testing.T) {
	e := sampleExplanation()
	if note := ociNote(e); note != "" {
		t.Errorf("a sealed capsule got a note: %s", note)
	}
	e.Containment = &roostv1.ContainmentDecision{Declared: "advisory", Achieved: "advisory", FloorMet: true,
		Sources: []*roostv1.FloorSource{{Source: "capabilities.containment", Class: "advisory"}}}
	note := ociNote(e)
	for _, want := range []string{"what a sealed session", "would run advisory", "capabilities.containment", "--containment sealed"} {
		if !strings.Contains(note, want) {
			t.Errorf("note %q does not say %q", note, want)
		}
	}
	e.Containment = &roostv1.ContainmentDecision{Declared: "sealed", FloorMet: false, ShortfallReason: "no user namespaces"}
	if note := ociNote(e); !strings.Contains(note, "no user namespaces") {
		t.Errorf("note for an unmet floor: %q", note)
	}
}

// TestIsCapsuleRef: NAME@VERSION and a path that exists are capsules; anything else is a
// session for roostd to resolve.
func TestIsCapsuleRef(t *testing.T) {
	dir := t.TempDir()
	for arg, want := range map[string]bool{
		"hello@0.1.0":            true,
		dir:                      true,
		dir + "/capsule.yaml":    false,
		"web":                    false,
		"ses_0193":               false,
		"./no/such/capsule@1.0":  false,
		"7f3a9c0d1e2f":           false,
		dir + "/../" + "nothing": false,
	} {
		if got := isCapsuleRef(arg); got != want {
			t.Errorf("isCapsuleRef(%q) = %v, want %v", arg, got, want)
		}
	}
}

// TestSessionHead: explain SESSION names the session and its state, and the host ids stage
// gave it: the range a sealed session's root maps, the one uid any other runs as.
func TestSessionHead(t *testing.T) {
	s := &roostv1.Session{Id: "ses_01", Name: "web", State: "staged", Identity: &roostv1.Identity{Uid: 1000, Gid: 1000, Size: 100}}
	for class, want := range map[string]string{"sealed": "host ids     uids and gids 1000-1099\n", "scoped": "host ids     uid and gid 1000\n"} {
		var out bytes.Buffer
		printSessionHead(&out, s, &roostv1.Explanation{Containment: &roostv1.ContainmentDecision{Achieved: class}}, 100)
		if !strings.HasPrefix(out.String(), "session      ses_01 (web)\nstate        staged\n") || !strings.Contains(out.String(), want) {
			t.Errorf("%s:\n%s", class, out.String())
		}
	}
	var out bytes.Buffer
	printSessionHead(&out, &roostv1.Session{Id: "ses_01", State: "staged", Identity: &roostv1.Identity{HostRoot: true}}, &roostv1.Explanation{}, 100)
	if strings.Contains(out.String(), "host ids") || !strings.HasPrefix(out.String(), "session      ses_01\n") {
		t.Errorf("host root:\n%s", out.String())
	}
}

// TestExplainCompletes: explain takes a session as well as a capsule, and still completes
// capsule directories.
func TestExplainCompletes(t *testing.T) {
	t.Setenv("ROOST_SOCKET", t.TempDir()+"/none.sock")
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "hello"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hello", "capsule.yaml"), []byte("name: hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	cmd, _, err := (&app{}).rootCommand().Find([]string{"explain"})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := cmd.ValidArgsFunction(cmd, nil, "he")
	if len(got) != 1 || !strings.HasPrefix(string(got[0]), "hello\t") {
		t.Fatalf("explain he<TAB>: %q, want the capsule hello", got)
	}
}
