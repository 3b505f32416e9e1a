package seccomp

import (
	"runtime"
	"slices"
	"sort"

	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Options are the rules of roost's own a profile takes or leaves, by the session's policy
// and the host.
type Options struct {
	// UnixSockets (network.unix_sockets) allows AF_UNIX sockets; without it socket(AF_UNIX,
	// ...) fails with EACCES, and so does every AF_UNIX socketpair but a stream or seqpacket
	// one (see unixPairs).
	UnixSockets bool
	// NoMemfdExec refuses, with EACCES, memfd_create with MFD_EXEC and execveat with
	// AT_EMPTY_PATH (see denyMemfdExec): what holds memfds where the kernel has no
	// vm.memfd_noexec (before 6.3), for a session without filesystem.workdir_exec.
	NoMemfdExec bool
}

// Profile is moby's default profile for the spec's capability set, plus roost's own rules:
// no new namespaces, no ptrace, and those o takes.
//
// A syscall restricted by argument must not also be allowed outright (an unconditional
// allow wins), so the AF_UNIX rule first takes socket, socketpair and socketcall out of the
// profile's unconditional and domain-range rules, then puts back exactly what stays allowed.
func Profile(spec *specs.Spec, o Options) (*specs.LinuxSeccomp, error) {
	profile, err := mobyseccomp.GetDefaultProfile(spec)
	if err != nil {
		return nil, err
	}
	// Only the native ABI: on x86 the 32-bit socket(2) is reached through socketcall, whose
	// arguments sit behind a pointer no filter reads, so libseccomp cannot hold an argument
	// rule there; a session has no business running 32-bit code anyway.
	if native, ok := nativeArch[runtime.GOARCH]; ok {
		profile.Architectures = []specs.Arch{native}
	}
	restrictUnshare(profile)
	denyTracing(profile)
	if o.NoMemfdExec {
		denyMemfdExec(profile)
	}
	if o.UnixSockets {
		return profile, nil
	}
	var domains []uint64
	var kept []specs.LinuxSyscall
	for _, sc := range profile.Syscalls {
		if slices.Contains(sc.Names, "socket") && sc.Action == specs.ActAllow && len(sc.Args) == 1 && sc.Args[0].Index == 0 {
			domains = append(domains, socketDomains(sc.Args[0])...)
			continue
		}
		sc.Names = slices.DeleteFunc(slices.Clone(sc.Names), func(n string) bool {
			// socketcall multiplexes socket(2) on 32-bit ABIs through a pointer no filter
			// can read; it goes too.
			return sc.Action == specs.ActAllow && (n == "socketpair" || n == "socketcall")
		})
		if len(sc.Names) > 0 {
			kept = append(kept, sc)
		}
	}
	domains = slices.DeleteFunc(domains, func(d uint64) bool { return d == unix.AF_UNIX })
	sort.Slice(domains, func(i, j int) bool { return domains[i] < domains[j] })
	domains = slices.Compact(domains)
	// moby allows socketpair outright, whatever the family. Here every other family gets
	// what socket(2) gets: socketpair creates its two sockets as socket(2) would, and a
	// rule "family != AF_UNIX" would not do, as the filter compares all 64 bits of the
	// argument and the kernel reads an int: AF_UNIX with a high bit set is not AF_UNIX to
	// the filter and is AF_UNIX to the kernel. Most families refuse socketpair anyway.
	for _, d := range domains {
		kept = append(kept, specs.LinuxSyscall{
			Names: []string{"socket", "socketpair"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: d, Op: specs.OpEqualTo}},
		})
	}
	eacces := uint(unix.EACCES)
	kept = append(kept, specs.LinuxSyscall{
		Names: []string{"socket"}, Action: specs.ActErrno, ErrnoRet: &eacces,
		Args: []specs.LinuxSeccompArg{{Index: 0, Value: unix.AF_UNIX, Op: specs.OpEqualTo}},
	})
	kept = append(kept, unixPairs(&eacces)...)
	profile.Syscalls = kept
	return profile, nil
}

// sockTypeMask is the kernel's SOCK_TYPE_MASK: socket(2) and socketpair(2) take flags
// (SOCK_NONBLOCK, SOCK_CLOEXEC) in the type argument's higher bits.
const sockTypeMask = 0xf

// unixPairs are the socketpair(AF_UNIX, ...) rules without network.unix_sockets.
//
// socketpair(AF_UNIX, SOCK_STREAM or SOCK_SEQPACKET, 0), with or without SOCK_NONBLOCK and
// SOCK_CLOEXEC, is allowed: both ends are born connected to each other in the calling
// process, a connected stream or seqpacket socket can neither connect(2) again nor
// sendto(2) an address (seqpacket ignores the address, stream refuses it), and listen(2)
// refuses it. It reaches nothing outside the session, and Node's child_process pipes and
// Python's asyncio event loop need it.
//
// A SOCK_DGRAM pair is refused: an AF_UNIX datagram socket, connected or not, may sendto(2)
// or connect(2) any named socket it can reach (/dev/log, journald's, an abstract name on
// the host's network namespace), which is what network.unix_sockets grants. SOCK_RAW, which
// AF_UNIX makes a datagram socket, goes with it.
//
// Every other AF_UNIX pair fails with EACCES, like socket(AF_UNIX): one rule per value of
// the type under sockTypeMask, and for the two allowed ones, a second with a protocol other
// than 0. libseccomp refuses a rule that overlaps another with a different action, so the
// rules split the arguments between them with no overlap; anything they miss (a family with
// bits above the int the kernel reads) takes the profile's default answer.
func unixPairs(eacces *uint) []specs.LinuxSyscall {
	var out []specs.LinuxSyscall
	for kind := uint64(0); kind <= sockTypeMask; kind++ {
		args := []specs.LinuxSeccompArg{
			{Index: 0, Value: unix.AF_UNIX, Op: specs.OpEqualTo},
			{Index: 1, Value: sockTypeMask, ValueTwo: kind, Op: specs.OpMaskedEqual},
		}
		if kind != unix.SOCK_STREAM && kind != unix.SOCK_SEQPACKET {
			out = append(out, specs.LinuxSyscall{Names: []string{"socketpair"}, Action: specs.ActErrno, ErrnoRet: eacces, Args: args})
			continue
		}
		out = append(out,
			specs.LinuxSyscall{
				Names: []string{"socketpair"}, Action: specs.ActAllow,
				Args: append(slices.Clone(args), specs.LinuxSeccompArg{Index: 2, Value: 0, Op: specs.OpEqualTo}),
			},
			specs.LinuxSyscall{
				Names: []string{"socketpair"}, Action: specs.ActErrno, ErrnoRet: eacces,
				Args: append(slices.Clone(args), specs.LinuxSeccompArg{Index: 2, Value: 0, Op: specs.OpNotEqual}),
			},
		)
	}
	return out
}

var nativeArch = map[string]specs.Arch{
	"amd64":   specs.ArchX86_64,
	"arm64":   specs.ArchAARCH64,
	"riscv64": specs.ArchRISCV64,
	"ppc64le": specs.ArchPPC64LE,
	"s390x":   specs.ArchS390X,
}

// namespaceFlags are the clone flags that make a new namespace (CLONE_NEWNS, CLONE_NEWCGROUP,
// CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET): the mask moby's
// profile already holds clone(2) to.
const namespaceFlags = 0x7E020000

// restrictUnshare holds unshare(2) to the same rule as clone(2): no new namespace. moby's
// profile allows unshare outright, which lets a program make a user namespace (and in it
// every other kind), kernel surface a session has no use for.
func restrictUnshare(profile *specs.LinuxSeccomp) {
	for i := range profile.Syscalls {
		sc := &profile.Syscalls[i]
		if sc.Action == specs.ActAllow && len(sc.Args) == 0 {
			sc.Names = slices.DeleteFunc(slices.Clone(sc.Names), func(n string) bool { return n == "unshare" })
		}
	}
	profile.Syscalls = slices.DeleteFunc(profile.Syscalls, func(sc specs.LinuxSyscall) bool { return len(sc.Names) == 0 })
	profile.Syscalls = append(profile.Syscalls, specs.LinuxSyscall{
		Names: []string{"unshare"}, Action: specs.ActAllow,
		Args: []specs.LinuxSeccompArg{{Index: 0, Value: namespaceFlags, ValueTwo: 0, Op: specs.OpMaskedEqual}},
	})
}

// tracing are the syscalls that reach into another process: moby's profile allows them on
// recent kernels, trusting the uid check. A session's processes all share one uid, so that
// check would let any of them read and steer the others; roost refuses them outright (the
// profile's default answer, EPERM). A session has no debugger to run.
var tracing = []string{"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"}

func denyTracing(profile *specs.LinuxSeccomp) {
	for i := range profile.Syscalls {
		sc := &profile.Syscalls[i]
		if sc.Action == specs.ActAllow {
			sc.Names = slices.DeleteFunc(slices.Clone(sc.Names), func(n string) bool { return slices.Contains(tracing, n) })
		}
	}
	profile.Syscalls = slices.DeleteFunc(profile.Syscalls, func(sc specs.LinuxSyscall) bool { return len(sc.Names) == 0 })
}

// memfdExecFlags are the flags denyMemfdExec refuses, by syscall: the argument and the
// bit. MFD_EXEC asks for an executable memfd; AT_EMPTY_PATH runs the file a descriptor
// holds, the only way to run a memfd but through /proc/self/fd.
var memfdExecFlags = []struct {
	name  string
	index uint
	flag  uint64
}{
	{"memfd_create", 1, unix.MFD_EXEC},
	{"execveat", 4, unix.AT_EMPTY_PATH},
}

// denyMemfdExec makes memfd_create with MFD_EXEC and execveat with AT_EMPTY_PATH fail with
// EACCES, as they do under vm.memfd_noexec=2, for kernels that lack it. It leaves a gap
// the sysctl does not: a memfd made without MFD_EXEC is executable on those kernels, and
// execve("/proc/self/fd/N") runs it, a path no filter reads. fexecve(3) of an allowed
// program fails with it too (glibc's is execveat with AT_EMPTY_PATH).
//
// Each bit is tested alone (the kernel reads the flags as an int, the filter all 64 bits:
// only a mask holds whatever the high bits say), in two rules that split the argument
// between them: libseccomp refuses overlapping rules of different actions.
func denyMemfdExec(profile *specs.LinuxSeccomp) {
	names := map[string]bool{}
	for _, f := range memfdExecFlags {
		names[f.name] = true
	}
	for i := range profile.Syscalls {
		sc := &profile.Syscalls[i]
		if sc.Action == specs.ActAllow {
			sc.Names = slices.DeleteFunc(slices.Clone(sc.Names), func(n string) bool { return names[n] })
		}
	}
	profile.Syscalls = slices.DeleteFunc(profile.Syscalls, func(sc specs.LinuxSyscall) bool { return len(sc.Names) == 0 })
	eacces := uint(unix.EACCES)
	for _, f := range memfdExecFlags {
		profile.Syscalls = append(profile.Syscalls,
			specs.LinuxSyscall{Names: []string{f.name}, Action: specs.ActAllow,
				Args: []specs.LinuxSeccompArg{{Index: f.index, Value: f.flag, ValueTwo: 0, Op: specs.OpMaskedEqual}}},
			specs.LinuxSyscall{Names: []string{f.name}, Action: specs.ActErrno, ErrnoRet: &eacces,
				Args: []specs.LinuxSeccompArg{{Index: f.index, Value: f.flag, ValueTwo: f.flag, Op: specs.OpMaskedEqual}}},
		)
	}
}

// socketDomains lists the address families one argument comparison of the profile allows.
func socketDomains(arg specs.LinuxSeccompArg) []uint64 {
	switch arg.Op {
	case specs.OpEqualTo:
		return []uint64{arg.Value}
	case specs.OpLessThan:
		var out []uint64
		for d := uint64(unix.AF_UNIX); d < arg.Value; d++ {
			out = append(out, d)
		}
		return out
	case specs.OpLessEqual:
		var out []uint64
		for d := uint64(unix.AF_UNIX); d <= arg.Value; d++ {
			out = append(out, d)
		}
		return out
	}
	return nil
}
