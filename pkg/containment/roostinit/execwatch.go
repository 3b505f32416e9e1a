package roostinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Refused execs are recorded through a seccomp listener: roost-exec installs a filter that
// notifies on every execve and execveat of the program and all it starts, and hands the
// listener to roost-init, which reads what each exec names, judges whether the allowlist
// refuses it, records it if so and always lets the exec go on (SECCOMP_USER_NOTIF_FLAG_CONTINUE).
// Landlock alone decides: what the listener reads can change before the kernel acts on it,
// so it observes and never enforces.

// Refusals asks for the execs the session's allowlist refuses to be recorded
// (records.RefusalsFile).
type Refusals struct {
	// Absent: a system program missing from the session's view (a sealed root holding only
	// the allowlist's closure) may be a refusal too; such misses are recorded as candidates
	// (records.ExecRefusal.Absent), which roostd keeps when the host has the program.
	Absent bool `json:"absent,omitempty"`
}

// execWatchFD is the descriptor roost-init starts roost-exec with for the listener: one end
// of a socket pair. ExecSpec.WatchFD names it once roost-init has a use for it.
const execWatchFD = 6

// watchHello is what roost-exec sends roost-init with the listener: what the allowlist's
// Landlock rules hold, as the kernel names files, so roost-init judges each exec as
// Landlock will. Error, instead, says why there is no listener.
type watchHello struct {
	// Files are the exec rules on single files; Trees those on directories, all beneath
	// them executable (shell.allow trees and the trees workdir_exec makes executable).
	Files []fileID `json:"files,omitempty"`
	Trees []fileID `json:"trees,omitempty"`
	// Absent is Refusals.Absent.
	Absent bool   `json:"absent,omitempty"`
	Error  string `json:"error,omitempty"`
}

// fileID names a file as the kernel does, whatever path reaches it.
type fileID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

// execRuleSet is what Landlock lets execute, as roost-exec resolved it for the rules.
type execRuleSet struct {
	files, trees []string
}

// hello is the rule set as the listener's judge takes it; paths that do not exist (a
// workdir_exec tree missing) have no rule.
func (s *execRuleSet) hello(absent bool) watchHello {
	h := watchHello{Absent: absent}
	for _, set := range []struct {
		paths []string
		into  *[]fileID
	}{{s.files, &h.Files}, {s.trees, &h.Trees}} {
		for _, p := range set.paths {
			var st unix.Stat_t
			if unix.Stat(p, &st) == nil {
				*set.into = append(*set.into, fileID{Dev: st.Dev, Ino: st.Ino})
			}
		}
	}
	return h
}

// watchExecs installs the exec listener on this thread (which execs the program: the filter
// passes to it and to everything it starts) and sends it over sock to roost-init with the
// rules. It never fails the start: a session whose refusals cannot be recorded still runs,
// and roost-init notes why in init.log. no_new_privs must already be set.
func watchExecs(sock int, rules *execRuleSet, want Refusals) {
	defer unix.Close(sock)
	if rules == nil {
		sendHello(sock, watchHello{Error: "the kernel enforces no Landlock exec rules here"}, -1)
		return
	}
	listener, err := installExecListener()
	if err != nil {
		sendHello(sock, watchHello{Error: "installing the seccomp listener on execve and execveat: " + err.Error()}, -1)
		return
	}
	sendHello(sock, rules.hello(want.Absent), listener)
	// The program must never hold its own listener: it could answer its own execs.
	unix.Close(listener)
}

func sendHello(sock int, h watchHello, listener int) {
	data, _ := json.Marshal(h)
	var oob []byte
	if listener >= 0 {
		oob = unix.UnixRights(listener)
	}
	// Lost, roost-init records nothing and the session runs as it would without it.
	_ = unix.Sendmsg(sock, data, oob, nil, 0)
}

// maxHello bounds the message roost-init reads from roost-exec: a rule is some 40 bytes.
const maxHello = 4 << 20

// installExecListener loads the notifying filter and returns its listener.
func installExecListener() (int, error) {
	prog, err := execNotifyProgram()
	if err != nil {
		return -1, err
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return -1, errno
	}
	syscall.CloseOnExec(int(fd))
	return int(fd), nil
}

// execNotifyProgram is the filter: execve and execveat of the native ABI notify the
// listener; every other call goes on to the session's own filter. A foreign ABI is left to
// that filter too, which refuses it (see pkg/containment/seccomp).
func execNotifyProgram() ([]unix.SockFilter, error) {
	arch, ok := auditArch()
	if !ok {
		return nil, fmt.Errorf("no seccomp architecture known for %s", runtime.GOARCH)
	}
	const (
		archOffset = 4 // struct seccomp_data: int nr; __u32 arch; ...
		nrOffset   = 0
	)
	return []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: archOffset},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: arch},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: nrOffset},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 2, Jf: 0, K: unix.SYS_EXECVE},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, Jf: 0, K: unix.SYS_EXECVEAT},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_USER_NOTIF},
	}, nil
}

// auditArch is the native ABI's AUDIT_ARCH value, as seccomp_data.arch holds it.
func auditArch() (uint32, bool) {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64, true
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64, true
	case "riscv64":
		return unix.AUDIT_ARCH_RISCV64, true
	case "ppc64le":
		return unix.AUDIT_ARCH_PPC64LE, true
	case "s390x":
		return unix.AUDIT_ARCH_S390X, true
	case "loong64":
		return unix.AUDIT_ARCH_LOONGARCH64, true
	}
	return 0, false
}

// receiveHello reads roost-exec's message and the listener with it: the listener is -1 when
// roost-exec sent none (h.Error says why) or ended without a word (an error).
func receiveHello(sock int) (h watchHello, listener int, err error) {
	listener = -1
	var data []byte
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			closeFD(&listener)
			return h, -1, err
		}
		if oobn > 0 {
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				fds, _ := unix.ParseUnixRights(&m)
				for _, fd := range fds {
					if listener < 0 {
						listener = fd
					} else {
						unix.Close(fd)
					}
				}
			}
		}
		if n == 0 {
			break
		}
		data = append(data, buf[:n]...)
		if len(data) > maxHello {
			closeFD(&listener)
			return h, -1, errors.New("roost-exec's message is too long")
		}
	}
	if len(data) == 0 {
		closeFD(&listener)
		return h, -1, os.ErrClosed
	}
	if err := json.Unmarshal(data, &h); err != nil {
		closeFD(&listener)
		return h, -1, fmt.Errorf("roost-exec's message: %w", err)
	}
	return h, listener, nil
}

func closeFD(fd *int) {
	if *fd >= 0 {
		unix.Close(*fd)
		*fd = -1
	}
}
