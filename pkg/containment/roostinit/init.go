package roostinit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"roost.dev/roost/pkg/records"
)

// The binary plays two roles, told apart by argv[0]: roost-init (the per-session supervisor
// that outlives the daemon and records the program's end) and roost-exec (a short-lived
// stage that applies the limits a process can only set on itself, then execs the program).
const (
	InitName = "roost-init"
	ExecName = "roost-exec"
)

// Descriptors roost-init is started with, after stdin, stdout and stderr (/dev/null: it
// never writes to them). The records directory comes as a descriptor, not a path: in a
// sealed session it is outside roost-init's root, and a descriptor of it held by a
// non-dumpable PID 1 is out of the program's reach. roost-init writes the program's output
// there itself (see records.LogsFile), as it writes init.json and exit.json.
const (
	initSpecFD    = 3 // read: the InitSpec, JSON, until EOF
	initReportFD  = 4 // write: one Report line once the program runs or has failed to start
	initRecordsFD = 5 // the session's records directory: output, init.json, exit.json
)

// Descriptors roost-exec is started with, after the program's stdin, stdout and stderr.
const (
	execSpecFD = 3 // read: the ExecSpec, JSON, until EOF
	execErrFD  = 4 // write: why exec failed; closed by a successful exec (close-on-exec)
	// execReportFD, with ExecSpec.Report only: the program's report pipe, which roost-exec
	// moves to OutcomeFD (execSpecFD's number, free once the spec is read).
	execReportFD = 5
)

// maxSpecSize bounds what a helper reads from its spec pipe.
const maxSpecSize = 4 << 20

// Run runs the role args[0] names and exits; it returns false when args name no role, and
// the caller goes on as whatever else it is. Call it first thing in main.
func Run(args []string) bool {
	if len(args) == 0 {
		return false
	}
	switch filepath.Base(args[0]) {
	case InitName:
		// libcontainer starts an extra process in a sealed session (roostctl exec) by the
		// binary's path in the root, which names roost-init: the role comes second.
		if len(args) == 2 && args[1] == ExecName {
			execMain()
			os.Exit(127)
		}
		// Started in a sealed container's pid namespace from the host (SetMemfdNoExecIn).
		if len(args) == 3 && args[1] == MemfdArg {
			os.Exit(memfdMain(args[2]))
		}
		os.Exit(initMain())
	case ExecName:
		execMain()
		os.Exit(127)
	}
	return false
}

func readSpec(fd int, v any) error {
	f := os.NewFile(uintptr(fd), "spec")
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSpecSize+1))
	if err != nil {
		return err
	}
	if len(data) > maxSpecSize {
		return errors.New("spec too large")
	}
	return json.Unmarshal(data, v)
}

// initMain is roost-init: it starts the program through roost-exec, reports it, forwards
// signals to its process group, reaps everything below it, and records the end in exit.json
// before it exits. It runs in its own session so nothing aimed at roostd reaches it.
func initMain() int {
	// Nothing roost-init was handed may reach the program: above all not the records
	// directory, where it could forge its own exit.
	for fd := initSpecFD; fd <= initRecordsFD; fd++ {
		syscall.CloseOnExec(fd)
	}
	const recordsFD = initRecordsFD
	report := os.NewFile(initReportFD, "report")
	// roost-exec starts before the rest of roost-init's setup, on the program's pipes, and
	// waits for its spec (hand): its own start, a process start like any, overlaps that
	// setup. A sandbox made ahead (WarmArg) does all of it before its session exists; a cold
	// start reads its spec, already waiting, first.
	warm := len(os.Args) > 2 && os.Args[2] == WarmArg
	var sigs chan os.Signal
	var pipes *logPump
	var early *pendingExec
	if warm {
		var err error
		if sigs, err = setUp(recordsFD); err == nil {
			premake(recordsFD)
			if pipes, err = newPump(); err == nil {
				early, err = spawnExec(pipes, "", false, nil)
			}
		}
		if err != nil {
			writeReport(report, Report{Error: "roost-init: starting roost-exec ahead: " + err.Error()})
			return 1
		}
	}
	var spec InitSpec
	if err := readSpec(initSpecFD, &spec); err != nil {
		if early != nil {
			early.abandon()
		}
		writeReport(report, Report{Error: "roost-init: reading spec: " + err.Error()})
		return 1
	}
	var pump *logPump
	var watch *execWatch
	fail := func(msg string) int {
		if early != nil {
			early.abandon()
		}
		watch.finish()
		info := ExitInfo{Code: 127, StartError: msg, EndedAt: time.Now().UTC()}
		if pump != nil {
			st := pump.finish(drainGrace)
			info.Logs = &st
		}
		if err := writeExit(recordsFD, info); err != nil {
			msg += "; and writing exit.json: " + err.Error()
		}
		writeReport(report, Report{Error: msg})
		return 1
	}
	var outcome *outcomeReader
	if spec.Exec.Report {
		if warm {
			return fail("roost-init: a program with a report pipe cannot start in a sandbox made ahead")
		}
		var err error
		if outcome, err = newOutcomeReader(); err != nil {
			return fail("roost-init: the program's report pipe: " + err.Error())
		}
	}
	if warm && spec.Exec.Mounts != nil {
		return fail("roost-init: a program with mounts of its own cannot start in a sandbox made ahead")
	}
	if !warm {
		var err error
		if pipes, err = newPump(); err != nil {
			return fail("roost-init: the program's output pipes: " + err.Error())
		}
		if early, err = spawnExec(pipes, spec.Exec.Dir, spec.Exec.Mounts != nil, outcome.childEnd()); err != nil {
			return fail(spawnFailure(spec.Exec.Dir, err))
		}
		if sigs, err = setUp(recordsFD); err != nil {
			return fail("roost-init: " + err.Error())
		}
	}
	// The program writes to pipes roost-init drains into the records directory, each
	// stream held to resources.log_max_bytes.
	if err := pipes.begin(recordsFD, spec.LogMaxBytes); err != nil {
		return fail("roost-init: the session's output files: " + err.Error())
	}
	pump = pipes
	roostExec := early
	early = nil // hand reaps it when it fails; fail must not abandon it again
	watch = roostExec.watch
	pid, startErr := roostExec.hand(spec.Exec)
	pump.closeChildEnds()
	outcome.started()
	if startErr != "" {
		outcome.discard()
		return fail(startErr)
	}
	startedAt := time.Now().UTC()
	hostInit, hostPID, err := hostPIDs(pid)
	if err != nil {
		_ = SignalGroup(pid, syscall.SIGKILL)
		reapAll(pid)
		outcome.discard()
		return fail("roost-init: " + err.Error())
	}
	ref := records.ProcessRef{InitPID: hostInit, PID: hostPID, StartedAt: startedAt}
	ref.InitStart, _ = StartTime(ref.InitPID)
	ref.PIDStart, _ = StartTime(ref.PID)
	// init.json only has to outlive roostd, not the host (the processes it names would not
	// survive a host crash either): an atomic rename is enough, no fsync.
	if err := writeJSONAtomically(recordsFD, InitFile, ref); err != nil {
		// Without init.json a restarted daemon cannot find the session; end it now rather
		// than run something nobody can supervise.
		_ = SignalGroup(pid, syscall.SIGKILL)
		reapAll(pid)
		outcome.discard()
		return fail("roost-init: writing init.json: " + err.Error())
	}
	writeReport(report, Report{Ref: &ref})
	report.Close()
	premakeEnd(recordsFD)

	go func() {
		for sig := range sigs {
			_ = SignalGroup(pid, sig.(syscall.Signal))
		}
	}()

	status := waitFor(pid)
	info := ExitInfo{PID: ref.PID, StartedAt: startedAt, EndedAt: time.Now().UTC()}
	switch {
	case status.Signaled():
		info.Signal = int(status.Signal())
		info.Code = 128 + info.Signal
	default:
		info.Code = status.ExitStatus()
	}
	// The session ends with its program: nothing it left behind outlives it. Once they are
	// gone nobody holds the output pipes, and the pump drains what is left in them: the
	// output and its counts are complete before exit.json says the session ended.
	reapAll(pid)
	// Before exit.json: roostd reads the last refusals once it sees the end.
	watch.finish()
	st := pump.finish(drainGrace)
	info.Logs = &st
	info.Report = outcome.finish(drainGrace)
	if err := writeExit(recordsFD, info); err != nil {
		return 1
	}
	return 0
}

// exitRetry is how often roost-init tries again to write exit.json on a full disk.
const exitRetry = 100 * time.Millisecond

// writeExit writes exit.json durably. roostd needs that record to end the session with its
// exact outcome, so a full disk or quota is waited out, retrying for as long as it takes
// (roost-init outlives roostd; an operator can still kill it). Other errors are final.
func writeExit(records int, info ExitInfo) error {
	for {
		err := writeJSONDurably(records, ExitFile, info)
		if !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.EDQUOT) {
			return err
		}
		time.Sleep(exitRetry)
	}
}

// ownOutput sends what roost-init itself writes to stderr (above all the Go runtime's trace if
// it ever crashes) to init.log in the records directory: its stdout and stderr are /dev/null,
// the program's output going through the log pump instead.
func ownOutput(records int) {
	fd, err := unix.Openat(records, InitLogFile, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return
	}
	_ = unix.Dup3(fd, 2, 0)
	unix.Close(fd)
}

// initThreads is how many OS threads roost-init makes before the program starts: more than
// its goroutines ever block in system calls at once (wait4, the two streams' writes, logs.json,
// exit.json, a forwarded signal, the exec listener's wait and its refusals' writes).
const initThreads = 10

// prewarmThreads makes the Go runtime start n OS threads now, while the session's pids allow
// it. The runtime starts a thread whenever one blocks in a system call and another goroutine
// must run; once a fork bomb has taken every pid of the session's cgroup, that fails and the
// runtime aborts — and roost-init must outlive whatever its program does. Threads a locked
// goroutine released are kept idle by the runtime, never freed.
func prewarmThreads(n int) {
	var ready, release sync.WaitGroup
	ready.Add(n)
	release.Add(1)
	for range n {
		go func() {
			runtime.LockOSThread()
			ready.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	ready.Wait()
	release.Done()
}

func writeReport(w io.Writer, r Report) {
	data, _ := json.Marshal(r)
	// The daemon may be gone; a failed write changes nothing here.
	_, _ = w.Write(append(data, '\n'))
}

// WarmArg, third in roost-init's arguments, says it runs in a sandbox made ahead of its
// session: it starts roost-exec before its spec comes (see initMain).
const WarmArg = "warm"

// setUp is what roost-init does before the program whatever the program: it makes itself
// undumpable, starts its threads, sends its own output to init.log, becomes the subreaper
// and catches the signals it forwards, which it returns.
func setUp(records int) (chan os.Signal, error) {
	// The program must not be able to read this process's memory or descriptors.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	prewarmThreads(initThreads)
	ownOutput(records)
	// Become the reaper of every orphan below us, so a daemonised grandchild stays ours to
	// kill when the session ends.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("PR_SET_CHILD_SUBREAPER: %w", err)
	}
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	return sigs, nil
}

// pendingExec is roost-exec started and waiting for its spec.
type pendingExec struct {
	pid   int
	specW *os.File
	errR  *os.File
	// watch receives the exec listener, if roost-exec is asked to install one (hand).
	watch *execWatch
}

// spawnExec starts roost-exec in a new process group in dir, its stdout and stderr the
// pump's pipes; report, when not nil, is the program's report pipe (execReportFD). With
// newNS it gets a mount namespace of its own. It waits for its spec (hand). Started with
// no dir, before the session's trees are mounted, it enters the spec's working directory
// itself once the spec comes.
func spawnExec(pump *logPump, dir string, newNS bool, report *os.File) (*pendingExec, error) {
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		specR.Close()
		specW.Close()
		return nil, err
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		specR.Close()
		specW.Close()
		errR.Close()
		errW.Close()
		return nil, err
	}
	watch, watchChild, err := newExecWatch(initRecordsFD)
	if err != nil {
		specR.Close()
		specW.Close()
		errR.Close()
		errW.Close()
		devnull.Close()
		return nil, err
	}
	stdout, stderr := pump.childFDs()
	attr := &syscall.ProcAttr{
		Dir:   dir,
		Env:   []string{},
		Files: []uintptr{devnull.Fd(), uintptr(stdout), uintptr(stderr), specR.Fd(), errW.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	// execReportFD, or closed in the child (-1), so the socket is always execWatchFD.
	reportFD := ^uintptr(0)
	if report != nil {
		reportFD = report.Fd()
	}
	attr.Files = append(attr.Files, reportFD, watchChild.Fd())
	if newNS {
		// Its own mount namespace, with every mount private: nothing roost-exec mounts
		// there reaches the host, or roost-init.
		attr.Sys.Unshareflags = syscall.CLONE_NEWNS
	}
	argv := []string{ExecName}
	if dir == "" {
		argv = append(argv, WarmArg)
	}
	pid, err := syscall.ForkExec("/proc/self/exe", argv, attr)
	devnull.Close()
	specR.Close()
	errW.Close()
	// Held by roost-exec alone from here, the socket reads EOF once it execs or ends.
	watchChild.Close()
	if err != nil {
		specW.Close()
		errR.Close()
		unix.Close(watch.sock)
		return nil, err
	}
	// Served from now: roost-exec's own exec of the program is the listener's first.
	go watch.run()
	return &pendingExec{pid: pid, specW: specW, errR: errR, watch: watch}, nil
}

// hand gives roost-exec its spec and returns the program's pid once exec succeeded, or why
// the program could not start.
func (e *pendingExec) hand(spec ExecSpec) (int, string) {
	spec.WatchFD = 0
	if spec.Refusals != nil && spec.Landlock != nil {
		spec.WatchFD = execWatchFD
	}
	data, _ := json.Marshal(spec)
	_, werr := e.specW.Write(data)
	e.specW.Close()
	msg, _ := io.ReadAll(io.LimitReader(e.errR, 64<<10))
	e.errR.Close()
	if len(msg) > 0 || werr != nil {
		waitFor(e.pid)
		if len(msg) == 0 {
			msg = []byte("roost-init: handing the spec to roost-exec: " + werr.Error())
		}
		return 0, strings.TrimSpace(string(msg))
	}
	return e.pid, ""
}

// abandon ends a roost-exec that will get no spec.
func (e *pendingExec) abandon() {
	_ = unix.Kill(e.pid, unix.SIGKILL)
	e.specW.Close()
	e.errR.Close()
	waitFor(e.pid)
}

// spawnFailure says why roost-exec could not start in dir.
func spawnFailure(dir string, err error) string {
	if dir != "" {
		if _, statErr := os.Stat(dir); statErr != nil {
			return fmt.Sprintf("working directory %s: %v", dir, statErr)
		}
	}
	return "roost-init: starting roost-exec: " + err.Error()
}

// waitFor reaps children until pid has ended and returns its status. Other children reaped
// meanwhile are orphans adopted as subreaper.
func waitFor(pid int) syscall.WaitStatus {
	for {
		var status syscall.WaitStatus
		got, err := syscall.Wait4(-1, &status, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return syscall.WaitStatus(0xff << 8)
		}
		if got == pid {
			return status
		}
	}
}

// reapAll kills the program's process group and every process still below roost-init, and
// reaps them, until none is left. As pid 1 of its pid namespace roost-init kills everything
// in it (a command roostctl exec started there too, which is not its child): the /proc it
// sees may be the host's, whose /proc/1 is not roost-init.
func reapAll(pgid int) {
	_ = SignalGroup(pgid, syscall.SIGKILL)
	self := os.Getpid()
	for {
		if self == 1 {
			_ = syscall.Kill(-1, syscall.SIGKILL)
		} else {
			for _, child := range ChildrenOf(self) {
				_ = syscall.Kill(child, syscall.SIGKILL)
			}
		}
		_, err := syscall.Wait4(-1, nil, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return
		}
	}
}

// hostPIDs is how the host names roost-init and its child pid (the program): roostd, the
// registry and init.json know processes by the host's pids. They are this process's own but
// where roost-init was born pid 1 of a pid namespace of the session's (a scoped session's)
// while its /proc is still the host's, which names it by its host pid; there the child is
// the one whose innermost pid is pid. A sealed session's roost-init, pid 1 under a /proc of
// its namespace, names its own pids (the sealed runtime turns them into the host's).
func hostPIDs(pid int) (self, child int, err error) {
	self = os.Getpid()
	if self != 1 {
		return self, pid, nil
	}
	link, err := os.Readlink("/proc/self")
	if err != nil {
		return 0, 0, fmt.Errorf("its pid on the host: %w", err)
	}
	host, err := strconv.Atoi(link)
	if err != nil {
		return 0, 0, fmt.Errorf("its pid on the host: /proc/self is %q", link)
	}
	if host == self {
		return self, pid, nil
	}
	// A pidfd's fdinfo names its process from the /proc's namespace inward (Linux 5.5): one
	// file, where the scan below reads one per thread of roost-init and then the children's.
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		data, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
		unix.Close(fd)
		if ns := nsPIDs(data); err == nil && len(ns) > 1 && ns[len(ns)-1] == pid {
			return host, ns[0], nil
		}
	}
	// Not yet reaped, the program is among the children whatever it has done.
	for _, c := range ChildrenOf(host) {
		if ns := nsPIDs(readStatus(c)); len(ns) > 0 && ns[len(ns)-1] == pid {
			return host, c, nil
		}
	}
	return 0, 0, fmt.Errorf("its program (pid %d in the session) is not among its children on the host (pid %d)", pid, host)
}

func readStatus(pid int) []byte {
	data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	return data
}

// nsPIDs is the NSpid line of a /proc status or pidfd fdinfo: a process's pids from the
// /proc's pid namespace inward.
func nsPIDs(data []byte) []int {
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			var out []int
			for _, f := range strings.Fields(rest) {
				n, err := strconv.Atoi(f)
				if err != nil {
					return nil
				}
				out = append(out, n)
			}
			return out
		}
	}
	return nil
}

// ChildrenOf lists the processes whose parent is ppid: from the kernel's per-thread
// children lists, which cost what the children number (an orphan adopted as subreaper joins
// one of them too); only on a kernel without them, from a walk of every process on the host.
func ChildrenOf(ppid int) []int {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", ppid))
	if err == nil && len(tasks) > 0 {
		var out []int
		listed := false
		for _, t := range tasks {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", ppid, t.Name()))
			if err != nil {
				continue
			}
			listed = true
			for _, f := range strings.Fields(string(data)) {
				if n, err := strconv.Atoi(f); err == nil {
					out = append(out, n)
				}
			}
		}
		if listed {
			return out
		}
	}
	return scanChildren(ppid)
}

// scanChildren is ChildrenOf from every process's stat.
func scanChildren(ppid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(data), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(data[i+1:]))
		if len(fields) > 1 {
			if p, err := strconv.Atoi(fields[1]); err == nil && p == ppid {
				out = append(out, pid)
			}
		}
	}
	return out
}

// outcomeReader is roost-init's end of the program's report pipe (ExecSpec.Report): it
// reads what the program writes there, at most MaxOutcomeSize bytes and one more to tell a
// longer report, until EOF or until the program has ended. A nil reader does nothing.
type outcomeReader struct {
	r, w *os.File
	done chan struct{}
	data []byte
	err  error
}

func newOutcomeReader() (*outcomeReader, error) {
	// The read end stays non-blocking (os.Pipe), so a deadline can end a read that waits
	// on a write end something still holds.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	return &outcomeReader{r: r, w: w, done: make(chan struct{})}, nil
}

// childEnd is the write end roost-exec is handed.
func (o *outcomeReader) childEnd() *os.File {
	if o == nil {
		return nil
	}
	return o.w
}

// started drops roost-init's write end, so the pipe reads EOF once the program and
// everything it passed the descriptor to are gone, and starts reading.
func (o *outcomeReader) started() {
	if o == nil {
		return
	}
	o.w.Close()
	go func() {
		defer close(o.done)
		o.data, o.err = io.ReadAll(io.LimitReader(o.r, MaxOutcomeSize+1))
		if o.err == nil && len(o.data) > MaxOutcomeSize {
			// Too long to keep; read on, so a program that writes more is not blocked on a
			// full pipe.
			_, _ = io.Copy(io.Discard, o.r)
		}
	}()
}

// discard stops reading: the program never ran.
func (o *outcomeReader) discard() {
	if o == nil {
		return
	}
	_ = o.r.SetReadDeadline(time.Now())
	<-o.done
	o.r.Close()
}

// finish returns the report once the program has ended and everything below roost-init is
// reaped, waiting at most grace for the last of it (only a process outside the session can
// hold the write end longer; what was read by then is judged). Nothing written, or anything
// but one JSON object within MaxOutcomeSize, gives nil; the latter with a note in init.log.
func (o *outcomeReader) finish(grace time.Duration) json.RawMessage {
	if o == nil {
		return nil
	}
	_ = o.r.SetReadDeadline(time.Now().Add(grace))
	<-o.done
	o.r.Close()
	if o.err != nil {
		fmt.Fprintf(os.Stderr, "roost-init: reading the program's report: %v\n", o.err)
	}
	if len(bytes.TrimSpace(o.data)) == 0 {
		return nil
	}
	report, err := ParseReport(o.data)
	if err != nil {
		fmt.Fprintf(os.Stderr, "roost-init: the program's report (%d bytes) is %v; dropped\n", len(o.data), err)
		return nil
	}
	return report
}
