package containment

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/manifest"
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
	es, join, err := joined(s, program, ExecOptions{Argv: []string{"sh", "-c", "true"}, Env: []string{"HOME=/tmp"}, Dir: "src/../lib"}, "/work")
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
	if _, _, err := joined(s, program, ExecOptions{}, "/work"); err == nil {
		t.Error("an empty command was accepted")
	}
}

// startScopedSleeper starts a real scoped session whose program marks its private
// /dev/shm and sleeps.
func startScopedSleeper(t *testing.T) (*ScopedRuntime, Spec, Process) {
	t.Helper()
	needRoot(t)
	rt, err := NewScopedRuntime(reachableDir(t), staticInit(t), testIDs())
	if err != nil {
		t.Fatal(err)
	}
	s := spec(t, "/bin/sh", "-c", "echo mark > /dev/shm/exec-mark; cat /proc/self/status > status; exec sleep 60")
	s.SessionID = "ses_" + strings.ToLower(t.Name())
	s.Class = manifest.Scoped
	s.Policy = sealedPolicy(t, "capabilities: {containment: scoped, shell: {allow: [sleep, cat]}}")
	s.CapsuleDir = t.TempDir()
	p, err := rt.Start(context.Background(), s)
	if err != nil {
		t.Fatalf("scoped start: %v", err)
	}
	t.Cleanup(func() {
		_ = p.Signal(syscall.SIGKILL)
		<-p.Done()
		_ = rt.Release(s.SessionID)
	})
	return rt, s, p
}

func runExec(t *testing.T, x *Execution) (string, string, ExitInfo) {
	t.Helper()
	out, _ := io.ReadAll(x.Stdout)
	errOut, _ := io.ReadAll(x.Stderr)
	info, err := x.Wait()
	if err != nil {
		t.Fatal(err)
	}
	x.Close()
	return string(out), string(errOut), info
}

// A command exec'd into a scoped session runs in its program's mount namespace (its private
// /dev/shm), as its uid, with its seccomp filter and no capability, under its allowlist.
func TestExecScopedJoinsTheProgram(t *testing.T) {
	rt, s, p := startScopedSleeper(t)
	status := filepath.Join(s.Dir, "status")
	var program string
	for i := 0; i < 200 && program == ""; i++ {
		if data, err := os.ReadFile(status); err == nil && strings.Contains(string(data), "NoNewPrivs") {
			program = string(data)
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	x, err := rt.Exec(context.Background(), s, p, ExecOptions{Argv: []string{"cat", "/dev/shm/exec-mark", "/proc/self/status"}})
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, info := runExec(t, x)
	if info.Code != 0 || !strings.HasPrefix(out, "mark\n") {
		t.Fatalf("exec: code %d, stdout %q, stderr %q", info.Code, out, errOut)
	}
	if _, err := os.Stat("/dev/shm/exec-mark"); err == nil {
		t.Errorf("the session's /dev/shm is the host's")
	}
	for _, field := range []string{"Uid", "Gid", "CapEff", "CapBnd", "Seccomp", "NoNewPrivs"} {
		if got, want := statusLine(out, field), statusLine(program, field); got != want || got == "" {
			t.Errorf("%s: exec %q, program %q", field, got, want)
		}
	}

	_, err = rt.Exec(context.Background(), s, p, ExecOptions{Argv: []string{"id"}})
	var se *StartError
	if !errors.As(err, &se) || !strings.HasPrefix(se.Msg, roostinit.RefusedPrefix) {
		t.Errorf("a command outside shell.allow: %v", err)
	}
	// A working directory the session's uid cannot enter is refused, though roostd is root.
	_, err = rt.Exec(context.Background(), s, p, ExecOptions{Argv: []string{"cat", "x"}, Dir: "/root"})
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "working directory /root") {
		t.Errorf("-w /root: %v", err)
	}
}

func statusLine(status, field string) string {
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}
