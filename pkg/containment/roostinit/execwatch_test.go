package roostinit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"

	"golang.org/x/sys/unix"
	"roost.dev/roost/pkg/records"
)

// execWatchHelperEnv makes the test binary a helper that installs the exec listener on
// itself, sends it on descriptor 3, and then does what the mode says: a filter cannot be
// taken off, so each run needs a process of its own.
const execWatchHelperEnv = "ROOST_TEST_EXECWATCH_HELPER"

// TestExecWatchHelper is the helper's body; run normally, it does nothing.
//
//	attempts:SCRIPT  exec python3 with SCRIPT (every exec it tries is watched)
//	gone             exec /usr/bin/true once the parent has closed the listener
//	fail:PATH:N[:none]  exec PATH, no program, N times, and print the ns it took
//	loop:N:P[:none]  a shell that forks and execs /usr/bin/true N times, P loops at once, and
//	                 print the ns it took; with none, without the listener
func TestExecWatchHelper(t *testing.T) {
	mode := os.Getenv(execWatchHelperEnv)
	if mode == "" {
		t.Skip("a helper process for the exec listener's tests and BenchmarkExecLoop")
	}
	runtime.LockOSThread()
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	watched := !strings.HasSuffix(mode, ":none")
	if watched {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			fail(err)
		}
		listener, err := installExecListener()
		if err != nil {
			fail(err)
		}
		sendHello(3, watchHello{}, listener)
		unix.Close(listener)
	}
	unix.Close(3)
	kind, arg, _ := strings.Cut(mode, ":")
	switch kind {
	case "attempts":
		fail(syscall.Exec("/usr/bin/python3", []string{"python3", "-c", arg}, os.Environ()))
	case "gone":
		// Wait for the parent to drop the listener, then exec: the kernel must fail it at
		// once (ENOSYS), not leave it waiting for an answer that cannot come.
		time.Sleep(200 * time.Millisecond)
		err := syscall.Exec("/usr/bin/true", []string{"true"}, nil)
		fmt.Println(err)
		os.Exit(0)
	case "fail":
		// exec alone, no process made: a file that is no program fails with ENOEXEC once
		// the kernel has read it, after the listener's judgement.
		path, count, _ := strings.Cut(arg, ":")
		count, _, _ = strings.Cut(count, ":")
		n, _ := strconv.Atoi(count)
		argv := []string{"x"}
		began := time.Now()
		for range n {
			if err := syscall.Exec(path, argv, nil); !errors.Is(err, syscall.ENOEXEC) {
				fail(fmt.Errorf("exec %s: %v, want ENOEXEC", path, err))
			}
		}
		fmt.Println(time.Since(began).Nanoseconds())
		os.Exit(0)
	case "loop":
		f := strings.Split(arg, ":")
		n, _ := strconv.Atoi(f[0])
		p, _ := strconv.Atoi(f[1])
		// A shell's loops, as make's recipes run: fork and exec per command, p at once.
		loop := fmt.Sprintf(`( i=0; while [ $i -lt %d ]; do /usr/bin/true; i=$((i+1)); done ) & `, n/p)
		script := strings.Repeat(loop, p) + "wait"
		began := time.Now()
		pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", script}, &syscall.ProcAttr{Files: []uintptr{0, 1, 2}})
		if err != nil {
			fail(err)
		}
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil || ws.ExitStatus() != 0 {
			fail(fmt.Errorf("the loop: %v, %v", err, ws))
		}
		fmt.Println(time.Since(began).Nanoseconds())
		os.Exit(0)
	}
	fail(fmt.Errorf("mode %q", mode))
}

// collected is a refusalSink a test reads.
type collected struct {
	mu  sync.Mutex
	got []records.ExecRefusal
}

func (c *collected) add(r records.ExecRefusal) {
	c.mu.Lock()
	c.got = append(c.got, r)
	c.mu.Unlock()
}

// watchedHelper starts the helper in mode and, unless serve is nil, serves its listener
// with a judge of rules (serve returns when the helper and all it started are gone). It
// returns the helper's output once it has ended.
func watchedHelper(t testing.TB, mode string, rules watchHello, sink refusalSink, served func(listener int)) string {
	t.Helper()
	testenv.NeedRoot(t, "the listener reads the helper's memory and descriptors through /proc")
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	child := os.NewFile(uintptr(fds[1]), "helper-watch")
	cmd := exec.Command(os.Args[0], "-test.run=^TestExecWatchHelper$")
	cmd.Env = append(os.Environ(), execWatchHelperEnv+"="+mode)
	cmd.ExtraFiles = []*os.File{child}
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child.Close()
	serving := make(chan struct{})
	go func() {
		defer close(serving)
		defer unix.Close(fds[0])
		if strings.HasSuffix(mode, ":none") {
			return
		}
		_, listener, err := receiveHello(fds[0])
		if err != nil {
			t.Errorf("receiving the listener: %v", err)
			return
		}
		if served != nil {
			served(listener)
			return
		}
		defer unix.Close(listener)
		proc, err := sessionProc()
		if err != nil {
			t.Errorf("a /proc: %v", err)
			return
		}
		defer unix.Close(proc)
		serve(listener, newExecJudge(proc, rules), sink)
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("helper (%s): %v\n%s", mode, err, out)
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("helper (%s) did not end:\n%s", mode, out)
	}
	select {
	case <-serving:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener is still served once every process under it has ended")
	}
	return out.String()
}

func idOf(t testing.TB, path string) fileID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fileID{Dev: st.Dev, Ino: st.Ino}
}

// The judge, case by case, as a process's execs reach it: only what the rules would refuse
// is reported, named as the process named it, with the program that tried.
func TestExecJudgeVerdicts(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		testenv.Need(t, "/usr/bin/python3", err)
	}
	tree := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(tree, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	perlScript := write("perl.sh", "#!/usr/bin/perl\nexit 0;\n", 0o755)
	trueScript := write("true.sh", "#!/usr/bin/true\n", 0o755)
	relScript := write("rel.sh", "#!bin/x\n", 0o755)
	noexecDir := t.TempDir()
	noexec := ""
	if err := unix.Mount("tmpfs", noexecDir, "tmpfs", unix.MS_NOEXEC, "size=1m"); err == nil {
		t.Cleanup(func() { _ = unix.Unmount(noexecDir, unix.MNT_DETACH) })
		noexec = filepath.Join(noexecDir, "true")
		data, _ := os.ReadFile("/usr/bin/true")
		if err := os.WriteFile(noexec, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	python, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Fatal(err)
	}
	rules := watchHello{
		Files:  []fileID{idOf(t, python), idOf(t, "/usr/bin/true")},
		Trees:  []fileID{idOf(t, tree)},
		Absent: true,
	}
	script := `import os
def attempt(path, argv0="tried", cwd=None, fd=False):
    pid = os.fork()
    if pid == 0:
        try:
            if cwd:
                os.chdir(cwd)
            if fd:
                os.execve(os.open(path, os.O_RDONLY), [argv0], {})
            os.execv(path, [argv0])
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
attempt("/usr/bin/true")
attempt("/usr/bin/id", "ident")
attempt("/usr/bin/id", "ident")
attempt("` + perlScript + `")
attempt("` + trueScript + `")
attempt("` + relScript + `", cwd="/")
attempt("/usr/bin/nonexistent-roost-test")
attempt("/nonexistent/roost-test")
attempt("./id", cwd="/usr/bin")
attempt("/usr/bin/cat", fd=True)
attempt("/usr/bin")
attempt("/etc/passwd")
if "` + noexec + `":
    attempt("` + noexec + `")
`
	sink := &collected{}
	watchedHelper(t, "attempts:"+script, rules, sink, nil)
	got := map[string]records.ExecRefusal{}
	for _, r := range sink.got {
		if prev, ok := got[r.Path]; ok {
			r.Count = prev.Count
		}
		r.Count++
		got[r.Path] = r
	}
	t.Logf("reported: %+v", sink.got)
	expect := func(path, reason, interpreter string, count int64) {
		t.Helper()
		r, ok := got[path]
		if !ok {
			t.Errorf("%s: not reported", path)
			return
		}
		delete(got, path)
		if r.Reason != reason || r.Interpreter != interpreter || r.Count != count {
			t.Errorf("%s: %+v, want reason %q, interpreter %q, %d times", path, r, reason, interpreter, count)
		}
		if r.Program != python || r.PID <= 0 || r.Time.IsZero() {
			t.Errorf("%s: program %q (want %s), pid %d, time %v", path, r.Program, python, r.PID, r.Time)
		}
	}
	expect("/usr/bin/id", records.RefusedNotAllowed, "", 2)
	if r := sink.got[0]; r.Argv0 != "ident" || r.Resolved != "/usr/bin/id" {
		t.Errorf("argv[0] %q, resolved %q", r.Argv0, r.Resolved)
	}
	expect(perlScript, records.RefusedNotAllowed, "/usr/bin/perl", 1)
	expect("/usr/bin/nonexistent-roost-test", records.RefusedAbsent, "", 1)
	expect("./id", records.RefusedNotAllowed, "", 1)
	expect("/usr/bin/cat", records.RefusedNotAllowed, "", 1)
	if noexec != "" {
		expect(noexec, records.RefusedNoexec, "", 1)
	}
	for path, r := range got {
		t.Errorf("%s reported, but is no refusal: %+v", path, r)
	}
}

// A listener nobody serves any more must not leave the session's execs waiting: the kernel
// fails them with ENOSYS. roost-init never closes it while the session runs (its processes
// die with it, pid 1 of their namespace), so this is only what a crash of its listener
// would come to.
func TestExecListenerGoneFailsFast(t *testing.T) {
	out := watchedHelper(t, "gone", watchHello{}, nil, func(listener int) { unix.Close(listener) })
	if !strings.Contains(out, syscall.ENOSYS.Error()) {
		t.Fatalf("the exec after the listener closed: %q, want %v", out, syscall.ENOSYS)
	}
}

// What the listener costs an exec, unwatched, watched with the file allowed (each exec read
// and judged from the cache) and watched with it refused (read, judged and recorded,
// coalesced):
//
//	exec: the exec call alone, of a file that is no program (ENOEXEC), no process made;
//	fork-exec: a shell's loop of fork and exec of /usr/bin/true, alone and four at once
//	(a make -j), each exec a process started and waited for.
//
//	go test -run '^$' -bench ExecLoop ./pkg/containment/roostinit/
func BenchmarkExecLoop(b *testing.B) {
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		b.Fatal(err)
	}
	noProgram := filepath.Join(b.TempDir(), "no-program")
	if err := os.WriteFile(noProgram, []byte("not a program\n"), 0o755); err != nil {
		b.Fatal(err)
	}
	type loop struct {
		name, mode string
		allowed    []fileID
	}
	loops := []loop{{"exec", "fail:" + noProgram + ":%d", []fileID{idOf(b, noProgram)}}}
	for _, p := range []int{1, 4} {
		loops = append(loops, loop{fmt.Sprintf("fork-exec/parallel=%d", p), "loop:%d:" + strconv.Itoa(p), []fileID{idOf(b, "/usr/bin/true"), idOf(b, sh)}})
	}
	for _, l := range loops {
		for _, watch := range []string{"unwatched", "allowed", "refused"} {
			b.Run(l.name+"/"+watch, func(b *testing.B) {
				n := max(b.N, 200) / 4 * 4
				mode := fmt.Sprintf(l.mode, n)
				if watch == "unwatched" {
					mode += ":none"
				}
				rules := watchHello{}
				if watch == "allowed" {
					rules.Files = l.allowed
				}
				sink := newRefusalRecorder(benchDir(b), time.Now)
				go sink.flusher()
				out := watchedHelper(b, mode, rules, sink, nil)
				sink.finish()
				ns, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
				if err != nil {
					b.Fatalf("helper printed %q", out)
				}
				b.ReportMetric(ns/float64(n), "ns/op")
			})
		}
	}
}

// benchDir is a records directory for a benchmark's recorder, as a descriptor.
func benchDir(b *testing.B) int {
	fd, err := unix.Open(b.TempDir(), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(fd) })
	return fd
}

// The recorder's bounds and coalescing, on its own.
func TestRefusalRecorderBoundsAndCoalesces(t *testing.T) {
	dir := t.TempDir()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	r := newRefusalRecorder(fd, time.Now)
	for range 50 {
		r.add(records.ExecRefusal{Path: "/usr/bin/id", Program: "/usr/bin/dash", Reason: records.RefusedNotAllowed})
	}
	r.flush()
	for range 50 {
		r.add(records.ExecRefusal{Path: "/usr/bin/id", Program: "/usr/bin/dash", Reason: records.RefusedNotAllowed})
	}
	long := strings.Repeat("x", 4*records.MaxRefusalField)
	for i := range 3 * records.MaxRefusalKeys {
		r.add(records.ExecRefusal{Path: "/p/" + strconv.Itoa(i) + long, Program: "/usr/bin/dash", Reason: records.RefusedNotAllowed})
	}
	r.finish()
	r.add(records.ExecRefusal{Path: "/after/the/end"})
	lines, _, _, err := records.NewRefusals(dir)
	if err != nil {
		t.Fatal(err)
	}
	var id, more, total int64
	for _, l := range lines {
		total += l.Refusals()
		more += l.More
		if l.Path == "/usr/bin/id" {
			id += l.Count
		}
		if len(l.Path) > records.MaxRefusalField+len("…") {
			t.Fatalf("a path of %d bytes kept", len(l.Path))
		}
	}
	if id != 100 || total != 100+3*records.MaxRefusalKeys || more == 0 {
		t.Fatalf("id %d, total %d, more %d over %d lines", id, total, more, len(lines))
	}
	if len(lines) > records.MaxRefusalKeys+2 || slices.ContainsFunc(lines, func(l records.ExecRefusal) bool { return l.Path == "/after/the/end" }) {
		t.Fatalf("%d lines", len(lines))
	}
	if info, err := os.Stat(filepath.Join(dir, records.RefusalsFile)); err != nil || info.Size() > records.MaxRefusalBytes+4096 {
		t.Fatalf("the file: %v %v", info, err)
	}
}
