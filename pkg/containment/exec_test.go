package containment

import (
	"strings"
	"testing"

	"roost.dev/roost/pkg/containment/roostinit"
)

func TestExecOverEnv(t *testing.T) {
	got, err := overEnv([]string{"PATH=/bin", "HOME=/root", "A=1"}, []string{"A=2", "B=x=y", "C="})
	if err != nil || strings.Join(got, " ") != "PATH=/bin HOME=/root A=2 B=x=y C=" {
		t.Fatalf("overEnv: %q %v", got, err)
	}
	for _, bad := range []string{"NOEQUALS", "=value", "A=\x00"} {
		if _, err := overEnv(nil, []string{bad}); err == nil {
			t.Errorf("overEnv accepted %q", bad)
		}
	}
}

func TestExecJoinedKeepsTheProgramsSpec(t *testing.T) {
	s := Spec{SessionID: "ses_x", Argv: []string{"/capsule/agent", "--flag"}}
	program := roostinit.ExecSpec{Argv: s.Argv, Env: []string{"PATH=/bin", "HOME=/root"}, Dir: "/work", Report: true,
		NoNewPrivileges: true, DropCapabilities: true, Seccomp: []byte{1, 2, 3}, Landlock: &roostinit.Landlock{Exec: []string{"sh"}},
		Mounts: &roostinit.Mounts{Shm: 1}}
	es, join, err := Joined(s, program, ExecOptions{Argv: []string{"sh", "-c", "true"}, Env: []string{"HOME=/tmp"}, Dir: "src/../lib"}, "/work")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(es.Argv, " ") != "sh -c true" || strings.Join(es.Env, " ") != "PATH=/bin HOME=/tmp" || es.Dir != "/work/lib" {
		t.Errorf("the command: %+v", es)
	}
	// What holds the program holds the command; it reports nothing and mounts nothing.
	if !es.NoNewPrivileges || !es.DropCapabilities || len(es.Seccomp) != 3 || es.Landlock == nil || es.Report || es.Mounts != nil {
		t.Errorf("the containment: %+v", es)
	}
	if join.Program != "/capsule/agent" || join.Dir != "/work/lib" {
		t.Errorf("join: %+v", join)
	}
	if _, _, err := Joined(s, program, ExecOptions{}, "/work"); err == nil {
		t.Error("an empty command was accepted")
	}
}
