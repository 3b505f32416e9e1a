package containment

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary plays roost-init and roost-exec, as roostd's binary does.
func TestMain(m *testing.M) {
	if RunHelper(os.Args) {
		return
	}
	os.Exit(runTests(m))
}

// runTests runs the tests with the runtimes' default cgroup parent a cgroup of this test
// binary's own, removed at the end from every hierarchy: what the tests leave there never
// reaches /roost, nor another test binary's sessions.
func runTests(m *testing.M) int {
	if os.Geteuid() == 0 {
		parent := "/roost-unit-" + strconv.Itoa(os.Getpid())
		if c, err := NewCgroups(CgroupConfig{Parent: parent}); err == nil {
			defaultOnce.Do(func() { defaultCg = c })
			defer func() {
				if err := removeCgroupTree(parent); err != nil {
					fmt.Fprintln(os.Stderr, "removing the tests' cgroups:", err)
				}
			}()
		}
	}
	return m.Run()
}

// firstTestID places this package's test sessions apart from roostd's default block and
// from other packages' tests.
const firstTestID = 0x60000000

var lastTestSlot atomic.Uint32

// testIDs is an id range no other session of this test binary holds.
func testIDs() IDs {
	return IDs{First: firstTestID + lastTestSlot.Add(1)*65536, Size: 65536}
}

// reachableDir is a temporary directory the sessions' unprivileged uids can pass through,
// as they can through roostd's state directory.
func reachableDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// spec is a session's start with its workdir owned by its ids, as roostd prepares it.
func spec(t *testing.T, argv ...string) Spec {
	t.Helper()
	dir := reachableDir(t)
	records := filepath.Join(dir, "records")
	work := filepath.Join(dir, "work")
	for _, d := range []string{records, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ids := testIDs()
	if err := os.Chown(work, int(ids.First), int(ids.First)); err != nil {
		t.Fatal(err)
	}
	return Spec{
		SessionID:  "ses_test",
		Argv:       argv,
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + work},
		Dir:        work,
		RecordsDir: records,
		IDs:        ids,
	}
}

func waitDone(t *testing.T, p Process) ExitInfo {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("session did not end")
	}
	info, err := p.Exit()
	if err != nil {
		t.Fatalf("Exit: %v", err)
	}
	return info
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestProcessRecordsExitAndOutput(t *testing.T) {
	s := spec(t, "/bin/sh", "-c", `echo out; echo err >&2; pwd; exit 3`)
	p, err := NewProcessRuntime(SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	ref := p.Ref()
	if ref.PID <= 0 || ref.InitPID <= 0 || ref.PID == ref.InitPID || ref.PIDStart == 0 {
		t.Fatalf("ref %+v", ref)
	}
	info := waitDone(t, p)
	if info.Code != 3 || info.Signal != 0 || info.PID != ref.PID {
		t.Fatalf("exit %+v", info)
	}
	if got := readFile(t, filepath.Join(s.RecordsDir, StdoutFile)); got != "out\n"+s.Dir+"\n" {
		t.Fatalf("stdout %q", got)
	}
	if got := readFile(t, filepath.Join(s.RecordsDir, StderrFile)); got != "err\n" {
		t.Fatalf("stderr %q", got)
	}
	onDisk, err := ReadExit(s.RecordsDir)
	if err != nil || onDisk.Code != 3 {
		t.Fatalf("exit.json: %+v %v", onDisk, err)
	}
	init, err := ReadInit(s.RecordsDir)
	if err != nil || init.PID != ref.PID || init.InitPID != ref.InitPID {
		t.Fatalf("init.json: %+v %v", init, err)
	}
}

func TestProcessStartFailure(t *testing.T) {
	for name, argv := range map[string][]string{
		"not on PATH":    {"no-such-command-roost"},
		"missing path":   {"/nonexistent/bin"},
		"not executable": {"/etc/hostname"},
	} {
		t.Run(name, func(t *testing.T) {
			s := spec(t, argv...)
			_, err := NewProcessRuntime(SelfInit).Start(context.Background(), s)
			var se *StartError
			if !errors.As(err, &se) {
				t.Fatalf("want StartError, got %v", err)
			}
			if !strings.Contains(se.Msg, argv[0]) {
				t.Fatalf("message %q does not name %s", se.Msg, argv[0])
			}
			info, err := ReadExit(s.RecordsDir)
			if err != nil || info.StartError == "" {
				t.Fatalf("exit.json after a failed start: %+v %v", info, err)
			}
		})
	}
}

func TestProcessMissingWorkdir(t *testing.T) {
	s := spec(t, "/bin/true")
	s.Dir = filepath.Join(s.Dir, "gone")
	_, err := NewProcessRuntime(SelfInit).Start(context.Background(), s)
	var se *StartError
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "gone") {
		t.Fatalf("want StartError naming the directory, got %v", err)
	}
}

func TestProcessSignalGroup(t *testing.T) {
	// The shell's child sleeps too: a group signal must reach both.
	s := spec(t, "/bin/sh", "-c", "sleep 60 & wait")
	p, err := NewProcessRuntime(SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	info := waitDone(t, p)
	if info.Signal != int(syscall.SIGTERM) || info.Code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %+v", info)
	}
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, ErrGone) {
		t.Fatalf("signal after end: %v", err)
	}
}

func TestProcessLeavesNothingBehind(t *testing.T) {
	// A daemonised grandchild in a session of its own must still end with the session.
	s := spec(t, "/bin/sh", "-c", `setsid sleep 300 & echo $! > bg.pid; sleep 0.2; exit 0`)
	p, err := NewProcessRuntime(SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if info := waitDone(t, p); info.Code != 0 {
		t.Fatalf("exit %+v", info)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(s.Dir, "bg.pid"))))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
		t.Fatalf("background process %d outlived the session (kill 0: %v)", pid, err)
	}
}

func TestProcessRlimits(t *testing.T) {
	s := spec(t, "/bin/sh", "-c", `ulimit -n; ulimit -f; ulimit -t`)
	s.Rlimits = []Rlimit{
		{Name: "resources.max_open_files", Resource: unix.RLIMIT_NOFILE, Value: 77},
		{Name: "resources.max_file_size_bytes", Resource: unix.RLIMIT_FSIZE, Value: 512 * 1024},
		{Name: "resources.cpu_seconds", Resource: unix.RLIMIT_CPU, Value: 42},
	}
	p, err := NewProcessRuntime(SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, p)
	// ulimit -f counts 512-byte blocks in POSIX shells.
	if got := readFile(t, filepath.Join(s.RecordsDir, StdoutFile)); got != "77\n1024\n42\n" {
		t.Fatalf("limits seen by the program: %q", got)
	}
}

func TestProcessFileSizeLimitKills(t *testing.T) {
	s := spec(t, "/bin/sh", "-c", `head -c 100000 /dev/zero > big`)
	s.Rlimits = []Rlimit{{Name: "resources.max_file_size_bytes", Resource: unix.RLIMIT_FSIZE, Value: 4096}}
	p, err := NewProcessRuntime(SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	info := waitDone(t, p)
	// head is killed by SIGXFSZ; the shell reports it as 128+25.
	if info.Code != 128+int(syscall.SIGXFSZ) {
		t.Fatalf("exit %+v", info)
	}
	if st, err := os.Stat(filepath.Join(s.Dir, "big")); err != nil || st.Size() > 4096 {
		t.Fatalf("file grew past the limit: %v %v", st.Size(), err)
	}
}

func TestAttachAfterRestart(t *testing.T) {
	s := spec(t, "/bin/sh", "-c", `trap 'exit 7' TERM; touch ready; while :; do sleep 0.05; done`)
	first, err := NewProcessRuntime(SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(s.Dir, "ready"))
	// A second runtime, as a restarted daemon would have, finds the session from init.json.
	ref, err := ReadInit(s.RecordsDir)
	if err != nil {
		t.Fatal(err)
	}
	again, err := NewProcessRuntime(SelfInit).Attach(s.SessionID, s.RecordsDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if info := waitDone(t, again); info.Code != 7 {
		t.Fatalf("exit %+v", info)
	}
	waitDone(t, first)

	// Once it has ended, attaching reports it gone, and a recycled pid is not mistaken for it.
	if _, err := NewProcessRuntime(SelfInit).Attach(s.SessionID, s.RecordsDir, &ref); !errors.Is(err, ErrGone) {
		t.Fatalf("attach to ended session: %v", err)
	}
	self := ProcessRef{InitPID: os.Getpid(), InitStart: 12345}
	if _, err := NewProcessRuntime(SelfInit).Attach(s.SessionID, s.RecordsDir, &self); !errors.Is(err, ErrGone) {
		t.Fatalf("attach with a wrong start time: %v", err)
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
	}
	t.Fatalf("%s never appeared", path)
}

func TestStartTime(t *testing.T) {
	st, err := StartTime(os.Getpid())
	if err != nil || st == 0 {
		t.Fatalf("StartTime: %d %v", st, err)
	}
	if _, err := StartTime(1 << 30); err == nil {
		t.Fatal("StartTime of a missing pid")
	}
}

// A descriptor roostd inherited without close-on-exec (from whatever started it) never
// reaches a session's program: it sees its stdio and nothing else.
func TestInheritedDescriptorsDoNotLeak(t *testing.T) {
	leak, err := syscall.Open("/etc/hostname", syscall.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(leak)
	s := spec(t, "/bin/sh", "-c", `for f in /proc/self/fd/*; do echo "${f##*/}"; done`)
	p, err := NewProcessRuntime(SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, p)
	// The shell lists its descriptors through one of its own: the directory it reads (3).
	if got := readFile(t, filepath.Join(s.RecordsDir, StdoutFile)); got != "0\n1\n2\n3\n" {
		t.Fatalf("the program holds descriptors besides its stdio (fd %d was leaked into roostd):\n%s", leak, got)
	}
}
