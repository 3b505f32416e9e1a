package containment

import (
	"errors"
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/containment/seccomp"
	"roost.dev/roost/pkg/manifest"
)

// MemfdNoExec says whether vm.memfd_noexec holds memfds here: by it a scoped or sealed
// session without filesystem.workdir_exec runs no memfd at all (see
// roostinit.MemfdNoExecSysctl). Where it does not (MemfdNoExecWhy says why) the seccomp
// filter refuses what it can read (seccomp.Options.NoMemfdExec), and a memfd run by its
// /proc/self/fd path still runs.
func MemfdNoExec() bool { return MemfdNoExecWhy() == "" }

// MemfdNoExecWhy is why vm.memfd_noexec cannot hold memfds here, "" when it can: the kernel
// must have it (6.3 and later), and this process write it, as sessions' pid namespaces
// are given it from the host's /proc/sys (host root, not read-only). A check of both ahead
// of every session: a session whose setting failed would not start.
func MemfdNoExecWhy() string {
	err := unix.Access(roostinit.MemfdNoExecSysctl, unix.W_OK)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, fs.ErrNotExist):
		return "this kernel has no vm.memfd_noexec (before 6.3)"
	}
	return fmt.Sprintf("roostd cannot write %s (%v)", roostinit.MemfdNoExecSysctl, err)
}

// MemfdSysctl says whether the runtime the options configure holds memfds with
// vm.memfd_noexec: where MemfdNoExec, unless WithoutMemfdSysctl.
func (o Options) MemfdSysctl() bool { return !o.NoMemfdSysctl && MemfdNoExec() }

// WithoutMemfdSysctl has a scoped or sealed runtime hold memfds as where vm.memfd_noexec
// cannot be had, with the seccomp filter alone: that fallback, made testable on a kernel
// that has the sysctl.
func WithoutMemfdSysctl() Option { return func(o *Options) { o.NoMemfdSysctl = true } }

// SeccompOptions are the rules of roost's own a session with policy p gets in its seccomp
// filter; memfdSysctl says vm.memfd_noexec holds its memfds, so the filter need not.
// workdir_exec lets what the session writes run, memfds too.
func SeccompOptions(p *manifest.Policy, memfdSysctl bool) seccomp.Options {
	return seccomp.Options{
		UnixSockets: p.Network.UnixSockets,
		NoMemfdExec: !p.Filesystem.WorkdirExec && !memfdSysctl,
	}
}
