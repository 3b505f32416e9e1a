package containment_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/manifest"
)

// Hostile capsules against the exec allowlist through anonymous files: a memfd lives on the
// kernel's internal mount, which Landlock's rules and the noexec mounts never see, so a
// program copied into one would run past the allowlist. Without workdir_exec a scoped or
// sealed session runs none (vm.memfd_noexec=2 in its pid namespace).

// memfdAttempts are what testdata/memfdprobe tries, each its own way to run a memfd.
var memfdAttempts = []string{"execveat", "procfd", "python", "mfd_exec"}

// memfdCaps lets python3 run, for the python attempt; nothing else of the host.
const memfdCaps = "shell: {allow: [/usr/bin/python3]}"

// memfdCapsule is a capsule directory the sessions' uids can read, holding the probe,
// static, as memfdprobe.
func memfdCapsule(t *testing.T) string {
	t.Helper()
	dir := testkit.ReachableDir(t)
	cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "memfdprobe"), "./testdata/memfdprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v\n%s", err, out)
	}
	return dir
}

// memfdProbe is the probe's argv trying attempts, as a session of class names it.
func memfdProbe(class manifest.Class, capsule string, attempts ...string) []string {
	return append([]string{capsulePath(class, capsule, "memfdprobe")}, attempts...)
}

// memfdRun runs the probe's attempts as a session of class with the capabilities caps and
// returns what it said.
func memfdRun(t *testing.T, class manifest.Class, caps, capsule string, attempts ...string) string {
	t.Helper()
	return memfdRunWith(t, class, caps, capsule, nil, attempts...)
}

// memfdRunWith is memfdRun by a runtime made with opts.
func memfdRunWith(t *testing.T, class manifest.Class, caps, capsule string, opts []containment.Option, attempts ...string) string {
	t.Helper()
	info, out, se := execAllowRun(t, class, caps, capsule, memfdProbe(class, capsule, attempts...), nil, opts...)
	if se != nil {
		t.Fatalf("refused: %v", se)
	}
	if info.Code != 0 {
		t.Fatalf("exit %+v:\n%s", info, out)
	}
	return out
}

// memfdUnconfined runs the probe's attempts in an unconfined session: the positive control,
// where nothing holds them and every attempt runs its copy.
func memfdUnconfined(t *testing.T, capsule string, attempts ...string) string {
	t.Helper()
	return unconfinedRun(t, "", capsule, memfdProbe(manifest.Unconfined, capsule, attempts...))
}

// unconfinedRun runs argv in an unconfined session with the capabilities caps and the
// capsule directory capsule (either may be empty), and returns what it printed: the
// hostile tests' positive control.
func unconfinedRun(t *testing.T, caps, capsule string, argv []string) string {
	t.Helper()
	testkit.NeedRoot(t)
	s := kit.Spec(t, argv...)
	s.SessionID = "ses_" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "_")
	s.Class = manifest.Unconfined
	if caps != "" {
		caps = ", " + caps
	}
	s.Policy = testkit.Policy(t, "capabilities: {containment: unconfined"+caps+"}")
	s.CapsuleDir = capsule
	rt := kit.NewProcessRuntime(kit.Init(t))
	p, err := rt.Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitDone(t, p)
	if err := rt.Release(s.SessionID); err != nil {
		t.Errorf("release: %v", err)
	}
	return testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile)) + testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StderrFile))
}

// needMemfdSysctl stops a test that needs vm.memfd_noexec where roostd cannot have it (a
// failure on CI).
func needMemfdSysctl(t *testing.T) {
	t.Helper()
	if !containment.MemfdNoExec() {
		testenv.Need(t, "vm.memfd_noexec", errors.New(containment.MemfdNoExecWhy()))
	}
}

// memfdHostile tries one attempt in a scoped and a sealed session, where it must fail with
// EACCES, and unconfined, where it must run. sysctl says only vm.memfd_noexec refuses it:
// the seccomp fallback cannot.
func memfdHostile(t *testing.T, attempt string, sysctl bool) {
	if sysctl {
		needMemfdSysctl(t)
	}
	capsule := memfdCapsule(t)
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			testkit.ExpectDenied(t, memfdRun(t, class, memfdCaps, capsule, attempt), syscall.EACCES, attempt)
		})
	}
	t.Run("unconfined", func(t *testing.T) {
		testkit.ExpectAllowed(t, memfdUnconfined(t, capsule, attempt), attempt)
	})
}

// A copy of a program in a memfd, run as fexecve(3) does: execveat(fd, "", AT_EMPTY_PATH).
func TestHostileMemfdExecveat(t *testing.T) { memfdHostile(t, "execveat", false) }

// The same copy run by its path in /proc/self/fd, a magic link to the memfd.
func TestHostileMemfdProcFD(t *testing.T) { memfdHostile(t, "procfd", true) }

// Python's own: os.memfd_create and os.execve("/proc/self/fd/N"), python3 on the allowlist.
func TestHostileMemfdPython(t *testing.T) { memfdHostile(t, "python", true) }

// memfd_create(MFD_EXEC) asks for an executable memfd outright: refused at creation.
func TestHostileMemfdCreateExec(t *testing.T) { memfdHostile(t, "mfd_exec", false) }

// With workdir_exec what the session writes may run, a memfd too: its pid namespace keeps
// the host's vm.memfd_noexec.
func TestMemfdExecWithWorkdirExec(t *testing.T) {
	capsule := memfdCapsule(t)
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			out := memfdRun(t, class, "filesystem: {workdir_exec: true}, "+memfdCaps, capsule, memfdAttempts...)
			testkit.ExpectAllowed(t, out, memfdAttempts...)
		})
	}
}

// A sandbox made ahead of its session holds memfds as a container made for it would: the
// setting is the sandbox's from the start, and a session whose workdir_exec differs does not
// fit a sandbox made without it.
func TestHostileMemfdWarm(t *testing.T) {
	testkit.NeedRoot(t)
	needMemfdSysctl(t)
	capsule := memfdCapsule(t)
	rt, err := kit.NewSealedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs(), kit.Sealer(t))
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, name string, shape sealed.WarmShape, caps string) string {
		s := kit.SealedSpec(t, "ses_memfd_warm_"+name, "capabilities: {containment: sealed, "+caps+"}", "")
		s.Argv = memfdProbe(manifest.Sealed, capsule, memfdAttempts...)
		s.CapsuleDir = capsule
		s.Env = append(s.Env, "HOME=/work")
		if shape.Policy == nil {
			shape.Policy = s.Policy
		}
		if err := rt.Fits(shape, s.Policy, false); err != nil {
			t.Fatalf("the session does not fit its sandbox: %v", err)
		}
		sb := kit.Prepare(t, rt, shape, "memfd_"+name)
		testkit.ClaimSandbox(t, &s, sb.IDs, sb.Records)
		p, err := rt.StartWarm(context.Background(), sb, s)
		if err != nil {
			t.Fatalf("warm start: %v", err)
		}
		testkit.WaitDone(t, p)
		if err := rt.Release(s.SessionID); err != nil {
			t.Errorf("release: %v", err)
		}
		return testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile)) + testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StderrFile))
	}
	t.Run("default", func(t *testing.T) {
		testkit.ExpectDenied(t, run(t, "default", sealed.DefaultWarmShape(), memfdCaps), syscall.EACCES, memfdAttempts...)
	})
	t.Run("workdir_exec", func(t *testing.T) {
		caps := "filesystem: {workdir_exec: true}, " + memfdCaps
		if err := rt.Fits(sealed.DefaultWarmShape(), testkit.Policy(t, "capabilities: {containment: sealed, "+caps+"}"), false); err == nil {
			t.Fatal("a session with workdir_exec fits a sandbox made without it")
		}
		testkit.ExpectAllowed(t, run(t, "workdir_exec", sealed.WarmShape{Name: "its own"}, caps), memfdAttempts...)
	})
}

// A command roostctl exec starts in a running session joins its pid namespace, and is held
// as its program is.
func TestHostileMemfdExecJoined(t *testing.T) {
	testkit.NeedRoot(t)
	needMemfdSysctl(t)
	capsule := memfdCapsule(t)
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			type execer interface {
				Start(context.Context, containment.Spec) (containment.Process, error)
				Exec(context.Context, containment.Spec, containment.Process, containment.ExecOptions) (*containment.Execution, error)
				Release(string) error
			}
			var rt execer
			var err error
			s := kit.Spec(t, "/bin/sleep", "60")
			s.SessionID = "ses_memfd_joined_" + class.String()
			s.Class = class
			s.CapsuleDir = capsule
			switch class {
			case manifest.Sealed:
				rt, err = kit.NewSealedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs(), kit.Sealer(t))
				s.Env = []string{"PATH=/usr/bin:/bin", "HOME=/work"}
			default:
				rt, err = kit.NewScopedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs())
			}
			if err != nil {
				t.Fatal(err)
			}
			probe := memfdProbe(class, capsule, memfdAttempts...)
			s.Policy = testkit.Policy(t, "capabilities: {containment: "+class.String()+", shell: {allow: [/usr/bin/python3, "+probe[0]+"]}}")
			p, err := rt.Start(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				testkit.KillAndWait(t, p)
				_ = rt.Release(s.SessionID)
			})
			x, err := rt.Exec(context.Background(), s, p, containment.ExecOptions{Argv: probe})
			if err != nil {
				t.Fatalf("exec: %v", err)
			}
			out, _ := io.ReadAll(x.Stdout)
			errOut, _ := io.ReadAll(x.Stderr)
			if _, err := x.Wait(); err != nil {
				t.Fatal(err)
			}
			x.Close()
			testkit.ExpectDenied(t, string(out)+string(errOut), syscall.EACCES, memfdAttempts...)
		})
	}
}

// Where the kernel has no vm.memfd_noexec (before 6.3; made so here by WithoutMemfdSysctl)
// the seccomp filter refuses, with EACCES, an executable memfd and execveat of the file a
// descriptor holds. A memfd run by its /proc/self/fd path is beyond any filter: there it
// runs (see seccomp.Options.NoMemfdExec), as doctor and explain say. With workdir_exec the
// filter holds no such rule.
func TestHostileMemfdSeccompFallback(t *testing.T) {
	capsule := memfdCapsule(t)
	without := []containment.Option{containment.WithoutMemfdSysctl()}
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			out := memfdRunWith(t, class, memfdCaps, capsule, without, "execveat", "mfd_exec", "procfd")
			testkit.ExpectDenied(t, out, syscall.EACCES, "execveat", "mfd_exec")
			t.Logf("what the fallback leaves, where the host's vm.memfd_noexec lets memfds run: %+v", testkit.Attempts(out)["procfd"])
		})
		t.Run(class.String()+"_workdir_exec", func(t *testing.T) {
			out := memfdRunWith(t, class, "filesystem: {workdir_exec: true}, "+memfdCaps, capsule, without, "execveat", "mfd_exec")
			testkit.ExpectAllowed(t, out, "execveat", "mfd_exec")
		})
	}
}

// explain says how memfds are held, in both classes: none runs without workdir_exec, and
// how; with it they may, as what the session writes may.
func TestMemfdExplained(t *testing.T) {
	for _, class := range execAllowClasses {
		for _, workdirExec := range []bool{false, true} {
			p := testkit.Policy(t, fmt.Sprintf("capabilities: {containment: %s, filesystem: {workdir_exec: %v}}", class, workdirExec))
			var mechanism string
			for _, g := range containment.Grants(class, p, false, false) {
				if g.Key == "filesystem.workdir_exec" {
					mechanism = g.Mechanism
				}
			}
			want := []string{"so may a memfd", "keeps the host's vm.memfd_noexec"}
			switch {
			case workdirExec:
			case containment.MemfdNoExec():
				want = []string{"nor does a memfd", "vm.memfd_noexec=2 in its pid namespace", "memfd_create(MFD_EXEC) fails with EACCES"}
			default:
				want = []string{"memfds are held only in part", containment.MemfdNoExecWhy(), "/proc/self/fd path still executes"}
			}
			for _, w := range want {
				if !strings.Contains(mechanism, w) {
					t.Errorf("%s, workdir_exec %v: %q lacks %q", class, workdirExec, mechanism, w)
				}
			}
		}
	}
}

// The host sets vm.memfd_noexec in another pid namespace, never its own: the namespace of
// the process named reads 2, the host's value stays, and a process of the host's own pid
// namespace is refused.
func TestSetMemfdNoExecIn(t *testing.T) {
	testkit.NeedRoot(t)
	needMemfdSysctl(t)
	host := testkit.ReadFile(t, roostinit.MemfdNoExecSysctl)
	cmd := exec.Command("/bin/sh", "-c", "read x; cat "+roostinit.MemfdNoExecSysctl)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	setErr := roostinit.SetMemfdNoExecIn(kit.Init(t), cmd.Process.Pid)
	in.Write([]byte("\n"))
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if setErr != nil {
		t.Fatal(setErr)
	}
	if got := strings.TrimSpace(out.String()); got != "2" {
		t.Errorf("the pid namespace reads %q", got)
	}
	if err := roostinit.SetMemfdNoExecIn(kit.Init(t), os.Getpid()); err == nil || !strings.Contains(err.Error(), "the host's") {
		t.Errorf("setting it in the host's own pid namespace: %v", err)
	}
	if got := testkit.ReadFile(t, roostinit.MemfdNoExecSysctl); got != host {
		t.Fatalf("the host's vm.memfd_noexec changed from %q to %q", host, got)
	}
}
