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

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
)

// kit is this test binary's; its sessions' ids start at 0x60000000, apart from roostd's
// default block and from the other containment packages' tests.
var kit = &testkit.Kit{FirstID: 0x60000000}

// The test binary plays roost-init and roost-exec (kit.Main), as roostd's binary does.
func TestMain(m *testing.M) { os.Exit(kit.Main(m)) }

func TestProcessRecordsExitAndOutput(t *testing.T) {
	s := kit.Spec(t, "/bin/sh", "-c", `echo out; echo err >&2; pwd; exit 3`)
	p, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	ref := p.Ref()
	if ref.PID <= 0 || ref.InitPID <= 0 || ref.PID == ref.InitPID || ref.PIDStart == 0 {
		t.Fatalf("ref %+v", ref)
	}
	info := testkit.WaitDone(t, p)
	if info.Code != 3 || info.Signal != 0 || info.PID != ref.PID {
		t.Fatalf("exit %+v", info)
	}
	if got := testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile)); got != "out\n"+s.Dir+"\n" {
		t.Fatalf("stdout %q", got)
	}
	if got := testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StderrFile)); got != "err\n" {
		t.Fatalf("stderr %q", got)
	}
	onDisk, err := containment.ReadExit(s.RecordsDir)
	if err != nil || onDisk.Code != 3 {
		t.Fatalf("exit.json: %+v %v", onDisk, err)
	}
	init, err := containment.ReadInit(s.RecordsDir)
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
			s := kit.Spec(t, argv...)
			_, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
			var se *containment.StartError
			if !errors.As(err, &se) {
				t.Fatalf("want StartError, got %v", err)
			}
			if !strings.Contains(se.Msg, argv[0]) {
				t.Fatalf("message %q does not name %s", se.Msg, argv[0])
			}
			info, err := containment.ReadExit(s.RecordsDir)
			if err != nil || info.StartError == "" {
				t.Fatalf("exit.json after a failed start: %+v %v", info, err)
			}
		})
	}
}

func TestProcessMissingWorkdir(t *testing.T) {
	s := kit.Spec(t, "/bin/true")
	s.Dir = filepath.Join(s.Dir, "gone")
	_, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
	var se *containment.StartError
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "gone") {
		t.Fatalf("want StartError naming the directory, got %v", err)
	}
}

func TestProcessSignalGroup(t *testing.T) {
	// The shell's child sleeps too: a group signal must reach both.
	s := kit.Spec(t, "/bin/sh", "-c", "sleep 60 & wait")
	p, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	info := testkit.WaitDone(t, p)
	if info.Signal != int(syscall.SIGTERM) || info.Code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %+v", info)
	}
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, containment.ErrGone) {
		t.Fatalf("signal after end: %v", err)
	}
}

func TestProcessLeavesNothingBehind(t *testing.T) {
	// A daemonised grandchild in a session of its own must still end with the session.
	s := kit.Spec(t, "/bin/sh", "-c", `setsid sleep 300 & echo $! > bg.pid; sleep 0.2; exit 0`)
	p, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if info := testkit.WaitDone(t, p); info.Code != 0 {
		t.Fatalf("exit %+v", info)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(testkit.ReadFile(t, filepath.Join(s.Dir, "bg.pid"))))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
		t.Fatalf("background process %d outlived the session (kill 0: %v)", pid, err)
	}
}

func TestProcessRlimits(t *testing.T) {
	s := kit.Spec(t, "/bin/sh", "-c", `ulimit -n; ulimit -f; ulimit -t`)
	s.Rlimits = []containment.Rlimit{
		{Name: "resources.max_open_files", Resource: unix.RLIMIT_NOFILE, Value: 77},
		{Name: "resources.max_file_size_bytes", Resource: unix.RLIMIT_FSIZE, Value: 512 * 1024},
		{Name: "resources.cpu_seconds", Resource: unix.RLIMIT_CPU, Value: 42},
	}
	p, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitDone(t, p)
	// ulimit -f counts 512-byte blocks in POSIX shells.
	if got := testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile)); got != "77\n1024\n42\n" {
		t.Fatalf("limits seen by the program: %q", got)
	}
}

func TestProcessFileSizeLimitKills(t *testing.T) {
	s := kit.Spec(t, "/bin/sh", "-c", `head -c 100000 /dev/zero > big`)
	s.Rlimits = []containment.Rlimit{{Name: "resources.max_file_size_bytes", Resource: unix.RLIMIT_FSIZE, Value: 4096}}
	p, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	info := testkit.WaitDone(t, p)
	// head is killed by SIGXFSZ; the shell reports it as 128+25.
	if info.Code != 128+int(syscall.SIGXFSZ) {
		t.Fatalf("exit %+v", info)
	}
	if st, err := os.Stat(filepath.Join(s.Dir, "big")); err != nil || st.Size() > 4096 {
		t.Fatalf("file grew past the limit: %v %v", st.Size(), err)
	}
}

func TestAttachAfterRestart(t *testing.T) {
	s := kit.Spec(t, "/bin/sh", "-c", `trap 'exit 7' TERM; touch ready; while :; do sleep 0.05; done`)
	first, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFile(t, filepath.Join(s.Dir, "ready"))
	// A second runtime, as a restarted daemon would have, finds the session from init.json.
	ref, err := containment.ReadInit(s.RecordsDir)
	if err != nil {
		t.Fatal(err)
	}
	again, err := kit.NewProcessRuntime(containment.SelfInit).Attach(s.SessionID, s.RecordsDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if info := testkit.WaitDone(t, again); info.Code != 7 {
		t.Fatalf("exit %+v", info)
	}
	testkit.WaitDone(t, first)

	// Once it has ended, attaching reports it gone, and a recycled pid is not mistaken for it.
	if _, err := kit.NewProcessRuntime(containment.SelfInit).Attach(s.SessionID, s.RecordsDir, &ref); !errors.Is(err, containment.ErrGone) {
		t.Fatalf("attach to ended session: %v", err)
	}
	self := containment.ProcessRef{InitPID: os.Getpid(), InitStart: 12345}
	if _, err := kit.NewProcessRuntime(containment.SelfInit).Attach(s.SessionID, s.RecordsDir, &self); !errors.Is(err, containment.ErrGone) {
		t.Fatalf("attach with a wrong start time: %v", err)
	}
}

func TestStartTime(t *testing.T) {
	st, err := containment.StartTime(os.Getpid())
	if err != nil || st == 0 {
		t.Fatalf("StartTime: %d %v", st, err)
	}
	if _, err := containment.StartTime(1 << 30); err == nil {
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
	s := kit.Spec(t, "/bin/sh", "-c", `for f in /proc/self/fd/*; do echo "${f##*/}"; done`)
	p, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitDone(t, p)
	// The shell lists its descriptors through one of its own: the directory it reads (3).
	if got := testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile)); got != "0\n1\n2\n3\n" {
		t.Fatalf("the program holds descriptors besides its stdio (fd %d was leaked into roostd):\n%s", leak, got)
	}
}
