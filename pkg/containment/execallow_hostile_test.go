package containment_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/manifest"
)

// Hostile capsules against the exec allowlist: each tries to widen what Landlock lets its
// program execute through a file it controls (a #! line, a shell.allow entry, PATH).

// execAllowProbe runs a program nothing in the allowlist names: "ok id" only if the allowlist
// was widened beyond the shell, else "denied id:" and why.
const execAllowProbe = testkit.TryScript + `try id /usr/bin/id`

// execAllowCapsule is a capsule directory the session's uid can read, holding files
// (name to content), each executable.
func execAllowCapsule(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := testkit.ReachableDir(t)
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// capsulePath is where a session of class finds the capsule's file name.
func capsulePath(class manifest.Class, capsule, name string) string {
	if class == manifest.Sealed {
		return filepath.Join(sealed.Capsule, name)
	}
	return filepath.Join(capsule, name)
}

// execAllowRun starts a session of class with the capsule directory capsule, running argv
// under the capabilities caps, by a runtime made with opts; adjust, when set, changes the
// spec last. A refused start returns its StartError; otherwise the session's exit and
// stdout and stderr.
func execAllowRun(t *testing.T, class manifest.Class, caps, capsule string, argv []string, adjust func(*containment.Spec), opts ...containment.Option) (containment.ExitInfo, string, *containment.StartError) {
	t.Helper()
	info, out, _, se := execAllowRunFor(t, class, caps, capsule, argv, adjust, 0, opts...)
	return info, out, se
}

// execAllowRunFor is execAllowRun waiting up to wait for the session's end (0: the kit's
// usual bound), and also returning its records directory; opts make its runtime.
func execAllowRunFor(t *testing.T, class manifest.Class, caps, capsule string, argv []string, adjust func(*containment.Spec), wait time.Duration, opts ...containment.Option) (containment.ExitInfo, string, string, *containment.StartError) {
	t.Helper()
	testkit.NeedRoot(t)
	var rt interface {
		Start(context.Context, containment.Spec) (containment.Process, error)
		Release(string) error
	}
	var err error
	s := kit.Spec(t, argv...)
	s.SessionID = "ses_" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "_")
	s.Class = class
	s.CapsuleDir = capsule
	switch class {
	case manifest.Sealed:
		rt, err = kit.NewSealedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs(), append([]containment.Option{kit.Sealer(t)}, opts...)...)
		s.Env = []string{"PATH=/usr/bin:/bin", "HOME=/work"}
	case manifest.Scoped:
		rt, err = kit.NewScopedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs(), opts...)
	default:
		t.Fatalf("class %s", class)
	}
	if err != nil {
		t.Fatal(err)
	}
	s.Policy = testkit.Policy(t, "capabilities: {containment: "+class.String()+", "+caps+"}")
	if adjust != nil {
		adjust(&s)
	}
	p, err := rt.Start(context.Background(), s)
	if err != nil {
		var se *containment.StartError
		if !errors.As(err, &se) {
			t.Fatalf("%s start failed, but not as a refused program: %v", class, err)
		}
		return containment.ExitInfo{}, "", s.RecordsDir, se
	}
	var info containment.ExitInfo
	if wait == 0 {
		info = testkit.WaitDone(t, p)
	} else {
		select {
		case <-p.Done():
		case <-time.After(wait):
			testkit.KillAndWait(t, p)
			t.Fatalf("session did not end within %s", wait)
		}
		if info, err = p.Exit(); err != nil {
			t.Fatalf("Exit: %v", err)
		}
	}
	if err := rt.Release(s.SessionID); err != nil {
		t.Errorf("release: %v", err)
	}
	out := testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile)) + testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StderrFile))
	return info, out, s.RecordsDir, nil
}

// setPath gives the session path as its PATH.
func setPath(s *containment.Spec, path string) {
	env := []string{"PATH=" + path}
	for _, e := range s.Env {
		if !strings.HasPrefix(e, "PATH=") {
			env = append(env, e)
		}
	}
	s.Env = env
}

// expectRefusal fails unless the start was refused with a message holding every want.
func expectRefusal(t *testing.T, se *containment.StartError, out string, wants ...string) {
	t.Helper()
	if se == nil {
		t.Fatalf("the launch was not refused; the session ran:\n%s", out)
	}
	t.Logf("refused: %s", se.Msg)
	for _, w := range wants {
		if !strings.Contains(se.Msg, w) {
			t.Errorf("the refusal %q does not name %q", se.Msg, w)
		}
	}
}

var execAllowClasses = []manifest.Class{manifest.Scoped, manifest.Sealed}

// A script in shell.allow whose #! line names a directory (or anything else that is not an
// executable file) must not turn it into an exec rule: with #!/ everything would execute.
func TestHostileExecAllowShebangInShellAllow(t *testing.T) {
	for _, class := range execAllowClasses {
		for name, interp := range map[string]string{
			"root": "/", "dir": "/usr/bin", "missing": "/nonexistent/interp", "empty": "", "blank": "   ", "relative": "relative/x",
		} {
			t.Run(class.String()+"_"+name, func(t *testing.T) {
				capsule := execAllowCapsule(t, map[string]string{"helper.sh": "#!" + interp + "\necho helper\n"})
				helper := capsulePath(class, capsule, "helper.sh")
				_, out, se := execAllowRun(t, class, "shell: {allow: ["+helper+"]}", capsule, []string{"/bin/sh", "-c", execAllowProbe}, nil)
				if strings.Contains(out, "ok id") {
					t.Fatalf("#!%s in shell.allow let /usr/bin/id run:\n%s", interp, out)
				}
				wants := []string{helper}
				if strings.TrimSpace(interp) != "" {
					wants = append(wants, strconv.Quote(interp))
				}
				expectRefusal(t, se, out, wants...)
			})
		}
	}
}

// The program itself a script with a bad #! line: refused naming it and its interpreter,
// before anything runs.
func TestHostileExecAllowShebangProgram(t *testing.T) {
	for _, class := range execAllowClasses {
		for name, interp := range map[string]string{"root": "/", "dir": "/usr/bin", "missing": "/nonexistent/interp", "empty": "", "relative": "relative/x"} {
			t.Run(class.String()+"_"+name, func(t *testing.T) {
				capsule := execAllowCapsule(t, map[string]string{"run.sh": "#!" + interp + "\necho run\n"})
				run := capsulePath(class, capsule, "run.sh")
				_, out, se := execAllowRun(t, class, "shell: {allow: []}", capsule, []string{run}, nil)
				wants := []string{run, "interpreter"}
				if interp != "" {
					wants = append(wants, strconv.Quote(interp))
				}
				expectRefusal(t, se, out, wants...)
			})
		}
	}
}

// An interpreter that is itself a script: its own #! line is held to the same rule.
func TestHostileExecAllowNestedShebang(t *testing.T) {
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			capsule := execAllowCapsule(t, nil)
			interp := capsulePath(class, capsule, "interp.sh")
			for name, content := range map[string]string{"helper.sh": "#!" + interp + "\necho helper\n", "interp.sh": "#!/\n"} {
				if err := os.WriteFile(filepath.Join(capsule, name), []byte(content), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			helper := capsulePath(class, capsule, "helper.sh")
			_, out, se := execAllowRun(t, class, "shell: {allow: ["+helper+"]}", capsule, []string{"/bin/sh", "-c", execAllowProbe}, nil)
			if strings.Contains(out, "ok id") {
				t.Fatalf("a nested #!/ let /usr/bin/id run:\n%s", out)
			}
			expectRefusal(t, se, out, interp, `"/"`)
		})
	}
}

// An absolute shell.allow entry is one file: a directory (every program in it), a device
// or a file without an execute bit is refused, naming the entry; one that does not exist
// is simply absent.
func TestHostileExecAllowAbsoluteEntries(t *testing.T) {
	for _, class := range execAllowClasses {
		for name, entry := range map[string]string{"dir": "/usr/bin", "device": "/dev/null", "unexecutable": "/etc/passwd"} {
			t.Run(class.String()+"_"+name, func(t *testing.T) {
				_, out, se := execAllowRun(t, class, "shell: {allow: ["+entry+"]}", execAllowCapsule(t, nil), []string{"/bin/sh", "-c", execAllowProbe}, nil)
				if strings.Contains(out, "ok id") {
					t.Fatalf("shell.allow [%s] let /usr/bin/id run:\n%s", entry, out)
				}
				expectRefusal(t, se, out, "shell.allow", strconv.Quote(entry))
			})
		}
		t.Run(class.String()+"_missing", func(t *testing.T) {
			info, out, se := execAllowRun(t, class, "shell: {allow: [/nonexistent/tool]}", execAllowCapsule(t, nil), []string{"/bin/sh", "-c", execAllowProbe}, nil)
			if se != nil {
				t.Fatalf("a missing absolute entry refused the launch: %v", se)
			}
			if info.Code != 0 {
				t.Fatalf("exit %+v:\n%s", info, out)
			}
			// Landlock refuses the exec.
			testkit.ExpectDenied(t, out, syscall.EACCES, "id")
			// The control: allowed beside the missing entry, id runs.
			_, out, se = execAllowRun(t, class, "shell: {allow: [/nonexistent/tool, /usr/bin/id]}", execAllowCapsule(t, nil), []string{"/bin/sh", "-c", execAllowProbe}, nil)
			if se != nil {
				t.Fatalf("refused: %v", se)
			}
			testkit.ExpectAllowed(t, out, "id")
		})
	}
}

// PATH leading into the workdir: a shell.allow name found there would put a file the
// session can rewrite on the allowlist (Landlock's rule holds the inode, whatever is
// written into it). Refused at launch, naming the workdir.
func TestHostileExecAllowPathIntoWorkdir(t *testing.T) {
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			work := ""
			_, out, se := execAllowRun(t, class, "shell: {allow: [tool, cat]}", execAllowCapsule(t, nil),
				[]string{"/bin/sh", "-c", `cat /usr/bin/id > tool && tool >/dev/null 2>&1 && echo RAN || echo "tool refused"`},
				func(s *containment.Spec) {
					work = s.Dir
					tool := filepath.Join(s.Dir, "tool")
					if err := os.WriteFile(tool, []byte("#!/bin/sh\necho tool\n"), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.Chown(tool, int(s.IDs.First), int(s.IDs.First)); err != nil {
						t.Fatal(err)
					}
					view := s.Dir
					if class == manifest.Sealed {
						view = sealed.Work
					}
					setPath(s, view+":/usr/bin:/bin")
				})
			if strings.Contains(out, "RAN") {
				t.Fatalf("a program written into the workdir ran:\n%s", out)
			}
			if class == manifest.Sealed {
				work = sealed.Work
			}
			expectRefusal(t, se, out, "shell.allow", `"tool"`, work, "which the session can write")
		})
	}
}

// A shell.allow entry reaching into the workdir through a symlink in the capsule: where it
// resolves is what counts, as it is for exec.
func TestHostileExecAllowSymlinkIntoWorkdir(t *testing.T) {
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			capsule := execAllowCapsule(t, nil)
			view := sealed.Work
			_, out, se := execAllowRun(t, class, "shell: {allow: ["+capsulePath(class, capsule, "w/tool")+", cat]}", capsule,
				[]string{"/bin/sh", "-c", `cat /usr/bin/id > tool && ` + capsulePath(class, capsule, "w/tool") + ` >/dev/null 2>&1 && echo RAN || echo "tool refused"`},
				func(s *containment.Spec) {
					tool := filepath.Join(s.Dir, "tool")
					if err := os.WriteFile(tool, []byte("#!/bin/sh\necho tool\n"), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.Chown(tool, int(s.IDs.First), int(s.IDs.First)); err != nil {
						t.Fatal(err)
					}
					if class == manifest.Scoped {
						view = s.Dir
					}
					if err := os.Symlink(view, filepath.Join(capsule, "w")); err != nil {
						t.Fatal(err)
					}
				})
			if strings.Contains(out, "RAN") {
				t.Fatalf("a program written into the workdir ran:\n%s", out)
			}
			expectRefusal(t, se, out, "shell.allow", "w/tool", filepath.Join(view, "tool"), "which the session can write")
		})
	}
}

// The program itself in the workdir: the session could rewrite it before running it again.
func TestHostileExecAllowProgramInWorkdir(t *testing.T) {
	for _, class := range execAllowClasses {
		t.Run(class.String(), func(t *testing.T) {
			work, program := "", ""
			_, out, se := execAllowRun(t, class, "shell: {allow: []}", execAllowCapsule(t, nil), nil, func(s *containment.Spec) {
				if err := os.WriteFile(filepath.Join(s.Dir, "build.sh"), []byte("#!/bin/sh\necho BUILT\n"), 0o755); err != nil {
					t.Fatal(err)
				}
				work = s.Dir
				if class == manifest.Sealed {
					work = sealed.Work
				}
				program = filepath.Join(work, "build.sh")
				s.Argv = []string{program}
			})
			expectRefusal(t, se, out, program, work, "which the session can write")
		})
	}
}

// What the checks must leave alone: a capsule's script with an ordinary #! line, run as the
// program or listed in shell.allow, and #!/usr/bin/env.
func TestExecAllowScriptsStillRun(t *testing.T) {
	for _, class := range execAllowClasses {
		for name, shebang := range map[string]string{"sh": "#!/bin/sh", "env": "#!/usr/bin/env sh"} {
			t.Run(class.String()+"_"+name, func(t *testing.T) {
				capsule := execAllowCapsule(t, map[string]string{
					"run.sh":     shebang + "\necho run-ok\nhelper\n",
					"bin/helper": shebang + "\necho helper-ok\n",
				})
				run := capsulePath(class, capsule, "run.sh")
				info, out, se := execAllowRun(t, class, "shell: {allow: [helper]}", capsule, []string{run}, func(s *containment.Spec) {
					setPath(s, capsulePath(class, capsule, "bin")+":/usr/bin:/bin")
				})
				if se != nil {
					t.Fatalf("refused: %v", se)
				}
				if info.Code != 0 {
					t.Fatalf("exit %+v:\n%s", info, out)
				}
				testkit.ExpectOutput(t, out, "run-ok", "helper-ok")
			})
		}
	}
}
