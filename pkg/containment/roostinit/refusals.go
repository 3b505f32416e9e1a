package roostinit

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"roost.dev/roost/pkg/containment/sysview"

	"golang.org/x/sys/unix"
	"roost.dev/roost/pkg/records"
)

// seccompData, seccompNotif and seccompNotifResp are the kernel's struct seccomp_data,
// seccomp_notif and seccomp_notif_resp (linux/seccomp.h); x/sys/unix has none of them.
type seccompData struct {
	Nr                 int32
	Arch               uint32
	InstructionPointer uint64
	Args               [6]uint64
}

type seccompNotif struct {
	ID    uint64
	PID   uint32
	Flags uint32
	Data  seccompData
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// The ioctls' numbers carry their structs' sizes; these hold the structs to them.
var (
	_ [unix.SECCOMP_IOCTL_NOTIF_RECV>>16&0x3fff - unsafe.Sizeof(seccompNotif{})]struct{}
	_ [unsafe.Sizeof(seccompNotif{}) - unix.SECCOMP_IOCTL_NOTIF_RECV>>16&0x3fff]struct{}
	_ [unix.SECCOMP_IOCTL_NOTIF_SEND>>16&0x3fff - unsafe.Sizeof(seccompNotifResp{})]struct{}
	_ [unsafe.Sizeof(seccompNotifResp{}) - unix.SECCOMP_IOCTL_NOTIF_SEND>>16&0x3fff]struct{}
)

func notifIoctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// execJudge decides, for one exec a session's process is about to make, whether the
// allowlist refuses it, the way Landlock and the mounts will: the file the exec names,
// resolved in the process's view (its root, its working directory, execveat's directory),
// is refused when it lies on a noexec mount, or when no exec rule covers it (its inode a
// rule's, or beneath a rule's directory), or when it is a #! script whose interpreter is
// refused. A name that does not resolve is the exec's own failure (a shell's PATH search),
// no refusal, except that with absent, a system program missing from the view is reported
// as a candidate.
type execJudge struct {
	// proc is a /proc of the session's pid namespace: the listener names processes there.
	proc   int
	files  map[fileID]bool
	trees  map[fileID]bool
	absent bool
	// verdicts caches what a file got, keyed by what would change it: a make -j execs the
	// same few compilers thousands of times, and each exec waits for its verdict.
	verdicts map[verdictKey]verdict
}

type verdictKey struct {
	id    fileID
	mnt   uint64
	ctime unix.StatxTimestamp
}

// verdict is a file's judgement: reason "" when the allowlist lets it run.
type verdict struct {
	reason      string
	interpreter string
}

// maxVerdicts bounds the cache; past it, it starts again (a hostile loop through distinct
// files only costs their judgements).
const maxVerdicts = 4096

func newExecJudge(proc int, h watchHello) *execJudge {
	j := &execJudge{proc: proc, files: map[fileID]bool{}, trees: map[fileID]bool{}, absent: h.Absent, verdicts: map[verdictKey]verdict{}}
	for _, f := range h.Files {
		j.files[f] = true
	}
	for _, t := range h.Trees {
		j.trees[t] = true
	}
	return j
}

// execCall is one exec call as the listener received it.
type execCall struct {
	tid     int
	dirfd   int32
	flags   uint64
	pathPtr uint64
	argvPtr uint64
}

// execOf reads which exec call a notification is; ok is false for any other.
func execOf(n *seccompNotif) (execCall, bool) {
	e := execCall{tid: int(n.PID), dirfd: unix.AT_FDCWD}
	switch n.Data.Nr {
	case unix.SYS_EXECVE:
		e.pathPtr, e.argvPtr = n.Data.Args[0], n.Data.Args[1]
	case unix.SYS_EXECVEAT:
		e.dirfd, e.pathPtr, e.argvPtr, e.flags = int32(n.Data.Args[0]), n.Data.Args[1], n.Data.Args[2], n.Data.Args[4]
	default:
		return e, false
	}
	// 0: the process is not visible in this pid namespace.
	return e, e.tid > 0
}

// judge returns the refusal e is, or nil. It reads the process's memory and descriptors
// while it waits in the exec.
func (j *execJudge) judge(e execCall) *records.ExecRefusal {
	pid := strconv.Itoa(e.tid)
	mem, err := unix.Openat(j.proc, pid+"/mem", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(mem)
	path, err := readString(mem, e.pathPtr, unix.PathMax)
	if err != nil {
		return nil
	}
	// argv[0] is read only for a refusal: most execs are allowed, and each waits.
	argv0 := func() string {
		if ptr, err := readWord(mem, e.argvPtr); err == nil && ptr != 0 {
			s, _ := readString(mem, ptr, records.MaxRefusalField)
			return s
		}
		return ""
	}
	fd, err := j.open(pid, e, path)
	if isMissing(err) {
		if !j.absent || !systemPath(path) {
			return nil
		}
		return &records.ExecRefusal{Path: path, Argv0: argv0(), Reason: records.RefusedAbsent, Absent: true}
	}
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	v, ok := j.fileVerdict(pid, fd, 0)
	if !ok || v.reason == "" {
		return nil
	}
	r := &records.ExecRefusal{Path: path, Argv0: argv0(), Reason: v.reason, Interpreter: v.interpreter}
	r.Resolved = j.readlink("self/fd/" + strconv.Itoa(fd))
	if path == "" {
		r.Path = r.Resolved
	}
	return r
}

// program names what tried the exec, while it still waits in it: the executable it runs.
func (j *execJudge) program(tid int) string {
	if p := j.readlink(strconv.Itoa(tid) + "/exe"); p != "" {
		return p
	}
	comm, _ := readAt(j.proc, strconv.Itoa(tid)+"/comm", 64)
	return strings.TrimSpace(comm)
}

func (j *execJudge) readlink(name string) string {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(j.proc, name, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// open resolves the file e names as the process would, and opens it O_PATH.
func (j *execJudge) open(pid string, e execCall, path string) (int, error) {
	const flags = unix.O_PATH | unix.O_CLOEXEC
	switch {
	case path == "" && e.flags&unix.AT_EMPTY_PATH != 0:
		// fexecve: the descriptor is the file.
		return unix.Openat(j.proc, pid+"/fd/"+strconv.Itoa(int(e.dirfd)), flags, 0)
	case filepath.IsAbs(path):
		root, err := unix.Openat(j.proc, pid+"/root", flags|unix.O_DIRECTORY, 0)
		if err != nil {
			return -1, err
		}
		defer unix.Close(root)
		return openInRoot(root, path)
	}
	base := pid + "/cwd"
	if e.dirfd != unix.AT_FDCWD {
		base = pid + "/fd/" + strconv.Itoa(int(e.dirfd))
	}
	dir, err := unix.Openat(j.proc, base, flags|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(dir)
	// An absolute symlink met on the way resolves in roost-init's root, which is the
	// session's but for a scoped session's private mounts.
	return unix.Openat(dir, path, flags, 0)
}

// openInRoot opens the absolute path with root as "/": its symlinks and ".." stay in the
// process's view.
func openInRoot(root int, path string) (int, error) {
	fd, err := unix.Openat2(root, path, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// No openat2 (before 5.6, or refused by a seccomp filter): the path from root as
		// it is.
		return unix.Openat(root, strings.TrimLeft(path, "/"), unix.O_PATH|unix.O_CLOEXEC, 0)
	}
	return fd, err
}

func isMissing(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR)
}

// systemPath says whether path names a system program's place: a sealed root holds only
// those of them the allowlist needs.
func systemPath(path string) bool {
	first, _, _ := strings.Cut(strings.TrimLeft(path, "/"), "/")
	return filepath.IsAbs(path) && (first == "usr" || first == "bin" || first == "sbin" || strings.HasPrefix(first, "lib"))
}

// fileVerdict judges the file open at fd; ok is false for one that is no refusal whatever
// the allowlist says (not a regular file, no execute bit: the exec fails for that).
func (j *execJudge) fileVerdict(pid string, fd, depth int) (verdict, bool) {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_TYPE|unix.STATX_MODE|unix.STATX_INO|unix.STATX_CTIME|unix.STATX_MNT_ID, &stx); err != nil {
		return verdict{}, false
	}
	if stx.Mode&unix.S_IFMT != unix.S_IFREG || stx.Mode&0o111 == 0 {
		return verdict{}, false
	}
	id := fileID{Dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor), Ino: stx.Ino}
	key := verdictKey{id: id, mnt: stx.Mnt_id, ctime: stx.Ctime}
	if v, ok := j.verdicts[key]; ok {
		return v, true
	}
	v, cacheable := j.decide(pid, fd, id, depth)
	if cacheable {
		if len(j.verdicts) >= maxVerdicts {
			clear(j.verdicts)
		}
		j.verdicts[key] = v
	}
	return v, true
}

// decide is fileVerdict without the cache; cacheable is false when the verdict hangs on the
// process's working directory (a relative #! interpreter).
func (j *execJudge) decide(pid string, fd int, id fileID, depth int) (v verdict, cacheable bool) {
	var sfs unix.Statfs_t
	if unix.Fstatfs(fd, &sfs) == nil && sfs.Flags&unix.ST_NOEXEC != 0 {
		return verdict{reason: records.RefusedNoexec}, true
	}
	if !j.files[id] && !j.inTree(pid, fd) {
		return verdict{reason: records.RefusedNotAllowed}, true
	}
	if depth >= maxInterpreterDepth {
		return verdict{}, true
	}
	interp := j.shebang(fd)
	if interp == "" {
		return verdict{}, true
	}
	cacheable = filepath.IsAbs(interp)
	var ifd int
	var err error
	if cacheable {
		var root int
		if root, err = unix.Openat(j.proc, pid+"/root", unix.O_PATH|unix.O_CLOEXEC|unix.O_DIRECTORY, 0); err == nil {
			ifd, err = openInRoot(root, interp)
			unix.Close(root)
		}
	} else {
		var cwd int
		if cwd, err = unix.Openat(j.proc, pid+"/cwd", unix.O_PATH|unix.O_CLOEXEC|unix.O_DIRECTORY, 0); err == nil {
			ifd, err = unix.Openat(cwd, interp, unix.O_PATH|unix.O_CLOEXEC, 0)
			unix.Close(cwd)
		}
	}
	if err != nil {
		// A missing interpreter fails the exec with ENOENT: no refusal.
		return verdict{}, cacheable
	}
	defer unix.Close(ifd)
	iv, ok := j.fileVerdict(pid, ifd, depth+1)
	if !ok || iv.reason == "" {
		return verdict{}, cacheable
	}
	if iv.interpreter == "" {
		iv.interpreter = interp
	}
	return iv, cacheable
}

// inTree says whether a directory rule covers the file open at fd: one of its ancestors, in
// the process's view, is a rule's directory.
func (j *execJudge) inTree(pid string, fd int) bool {
	if len(j.trees) == 0 {
		return false
	}
	path := j.readlink("self/fd/" + strconv.Itoa(fd))
	if !filepath.IsAbs(path) {
		return false
	}
	root, err := unix.Openat(j.proc, pid+"/root", unix.O_PATH|unix.O_CLOEXEC|unix.O_DIRECTORY, 0)
	if err != nil {
		return false
	}
	defer unix.Close(root)
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		rel := strings.TrimLeft(dir, "/")
		if rel == "" {
			rel = "."
		}
		var st unix.Stat_t
		if unix.Fstatat(root, rel, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && j.trees[fileID{Dev: st.Dev, Ino: st.Ino}] {
			return true
		}
		if dir == "/" {
			return false
		}
	}
}

// shebang is the interpreter a #! script at fd names ("" for any other file), as the kernel
// reads it.
func (j *execJudge) shebang(fd int) string {
	f, err := unix.Openat(j.proc, "self/fd/"+strconv.Itoa(fd), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(f)
	head := make([]byte, scriptHead)
	n, err := unix.Pread(f, head, 0)
	if err != nil {
		return ""
	}
	rest, ok := bytes.CutPrefix(head[:n], []byte("#!"))
	if !ok {
		return ""
	}
	name, _ := sysview.Shebang(rest)
	return name
}

// readString reads a NUL-terminated string of at most max bytes at addr in the process's
// memory (mem, its /proc/<pid>/mem), a page at a time: the string may end just before an
// unmapped page.
func readString(mem int, addr uint64, max int) (string, error) {
	const page = 4096
	var out []byte
	for len(out) < max {
		chunk := min(page-int(addr%page), max-len(out))
		buf := make([]byte, chunk)
		n, err := unix.Pread(mem, buf, int64(addr))
		if n <= 0 {
			if err == nil {
				err = errors.New("unreadable")
			}
			return "", err
		}
		if i := bytes.IndexByte(buf[:n], 0); i >= 0 {
			return string(append(out, buf[:i]...)), nil
		}
		out = append(out, buf[:n]...)
		addr += uint64(n)
	}
	return string(out), nil
}

// readWord reads one pointer at addr in the process's memory.
func readWord(mem int, addr uint64) (uint64, error) {
	var buf [8]byte
	size := int(unsafe.Sizeof(uintptr(0)))
	if n, err := unix.Pread(mem, buf[:size], int64(addr)); n != size {
		if err == nil {
			err = errors.New("short read")
		}
		return 0, err
	}
	if size == 4 {
		return uint64(binary.NativeEndian.Uint32(buf[:4])), nil
	}
	return binary.NativeEndian.Uint64(buf[:]), nil
}

// readAt reads at most max bytes of the file name beneath dir.
func readAt(dir int, name string, max int) (string, error) {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	buf := make([]byte, max)
	n, err := unix.Read(fd, buf)
	if n < 0 {
		return "", err
	}
	return string(buf[:n]), nil
}

// sessionProc opens a /proc of roost-init's pid namespace, where the listener names the
// session's processes: the mounted one when it is that (a sealed root's, or a test's), else
// one of its own, mounted nowhere (a scoped session's roost-init is born in the session's
// pid namespace but keeps the host's /proc).
func sessionProc() (int, error) {
	if link, err := os.Readlink("/proc/self"); err == nil && link == strconv.Itoa(os.Getpid()) {
		return unix.Open("/proc", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen(proc): %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("creating a proc instance: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOEXEC|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("fsmount(proc): %w", err)
	}
	return mnt, nil
}

// execWatch is roost-init's side of the exec listener: it receives it from roost-exec,
// serves it, and records what it judges refused.
type execWatch struct {
	sock int
	rec  *refusalRecorder
}

// newExecWatch makes the socket pair roost-exec gets one end of (child, at execWatchFD).
func newExecWatch(records int) (*execWatch, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	w := &execWatch{sock: fds[0], rec: newRefusalRecorder(records, time.Now)}
	return w, os.NewFile(uintptr(fds[1]), "exec-watch"), nil
}

// run receives the listener and serves it until it is closed; the refusals it records are
// written as they come (at most once a second) and at finish. Nothing it meets stops the
// session: without a listener the execs are simply not observed.
func (w *execWatch) run() {
	h, listener, err := receiveHello(w.sock)
	unix.Close(w.sock)
	if err != nil {
		if !errors.Is(err, os.ErrClosed) {
			fmt.Fprintf(os.Stderr, "roost-init: refused execs are not recorded: %v\n", err)
		}
		return
	}
	if listener < 0 {
		fmt.Fprintf(os.Stderr, "roost-init: refused execs are not recorded: %s\n", h.Error)
		return
	}
	proc, err := sessionProc()
	if err != nil {
		// Closed, the listener would fail every exec of the session with ENOSYS; left
		// unserved, each would wait for ever. Without a /proc nothing can be judged: every
		// exec goes on unjudged.
		fmt.Fprintf(os.Stderr, "roost-init: refused execs are not recorded: a /proc of the session: %v\n", err)
		serveBlind(listener)
		return
	}
	go w.rec.flusher()
	serve(listener, newExecJudge(proc, h), w.rec)
}

// refusalSink is where serve hands refusals: roost-init's recorder, or a test's.
type refusalSink interface {
	add(records.ExecRefusal)
}

// serve answers every notification on the listener CONTINUE, the exec going on to Landlock,
// and hands what judge finds refused to sink. It returns once no process under the filter
// is left, or on an error reading the listener. It never closes the listener: closed, it
// would fail every exec still to come with ENOSYS.
func serve(listener int, j *execJudge, sink refusalSink) {
	for {
		var n seccompNotif
		if !receive(listener, &n) {
			return
		}
		var refusal *records.ExecRefusal
		if e, ok := execOf(&n); ok {
			refusal = j.judge(e)
			if refusal != nil {
				refusal.PID, refusal.Program = e.tid, j.program(e.tid)
			}
		}
		// What was read is the process's only if it still waits in this very call: a pid
		// reused meanwhile would have been someone else's memory.
		if refusal != nil && !stillWaiting(listener, n.ID) {
			refusal = nil
		}
		// Counted before the exec goes on: once it does, the session may end, and with it
		// the recorder, before this goroutine runs again.
		if refusal != nil {
			refusal.Time = time.Now().UTC()
			sink.add(*refusal)
		}
		resp := seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		// ENOENT: it died meanwhile.
		_ = notifIoctl(listener, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
	}
}

// receive waits for the next notification; false once there will be none. A receive alone
// would wait for ever once the filter's last process is gone: poll says so (POLLHUP).
func receive(listener int, n *seccompNotif) bool {
	fds := []unix.PollFd{{Fd: int32(listener), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return false
		}
		if fds[0].Revents&unix.POLLIN == 0 {
			return false
		}
		*n = seccompNotif{}
		err := notifIoctl(listener, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(n))
		switch {
		case err == nil:
			return true
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.ENOENT):
			// ENOENT: the process died (or was signalled away) before it was received.
			continue
		default:
			return false
		}
	}
}

// notifIDValidBefore517 is SECCOMP_IOCTL_NOTIF_ID_VALID as kernels before 5.17 number it:
// read, not write, in the direction bits (on every encoding of them, the two flipped); later
// kernels take both.
const notifIDValidBefore517 = unix.SECCOMP_IOCTL_NOTIF_ID_VALID ^ 0xc0000000

// stillWaiting says whether the notification id still waits for its answer.
func stillWaiting(listener int, id uint64) bool {
	err := notifIoctl(listener, unix.SECCOMP_IOCTL_NOTIF_ID_VALID, unsafe.Pointer(&id))
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
		err = notifIoctl(listener, notifIDValidBefore517, unsafe.Pointer(&id))
	}
	return err == nil
}

// serveBlind lets every exec go on, judging none.
func serveBlind(listener int) {
	for {
		var n seccompNotif
		if !receive(listener, &n) {
			return
		}
		resp := seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		_ = notifIoctl(listener, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
	}
}

// finish writes what is left of the refusals once the session's processes are gone.
func (w *execWatch) finish() {
	if w == nil {
		return
	}
	w.rec.finish()
}
