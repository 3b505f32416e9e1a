//go:build seccomp

package seccomp

import (
	"fmt"
	"io"
	"os"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

// Compile turns an OCI seccomp profile into the BPF program roost-exec installs for a
// scoped session: roost-exec is small and static, so the compiling (libseccomp) happens here.
// It follows runc's conversion: repeated comparisons of one argument become separate rules,
// rules with the default action are dropped, unknown syscalls are skipped.
func Compile(p *specs.LinuxSeccomp) ([]byte, error) {
	defAct, err := seccompAction(p.DefaultAction, p.DefaultErrnoRet)
	if err != nil {
		return nil, err
	}
	filter, err := libseccomp.NewFilter(defAct)
	if err != nil {
		return nil, err
	}
	defer filter.Release()
	if err := filter.SetBadArchAction(libseccomp.ActKillProcess); err != nil {
		return nil, err
	}
	// roost-exec sets no_new_privs itself; the exported program must not depend on it.
	if err := filter.SetNoNewPrivsBit(false); err != nil {
		return nil, err
	}
	for _, a := range p.Architectures {
		arch, err := libseccomp.GetArchFromString(strings.ToLower(strings.TrimPrefix(string(a), "SCMP_ARCH_")))
		if err != nil {
			return nil, fmt.Errorf("architecture %s: %w", a, err)
		}
		if err := filter.AddArch(arch); err != nil {
			return nil, fmt.Errorf("architecture %s: %w", a, err)
		}
	}
	for _, sc := range p.Syscalls {
		act, err := seccompAction(sc.Action, sc.ErrnoRet)
		if err != nil {
			return nil, err
		}
		if act == defAct {
			continue
		}
		conds, split, err := seccompConditions(sc.Args)
		if err != nil {
			return nil, err
		}
		for _, name := range sc.Names {
			call, err := libseccomp.GetSyscallFromName(name)
			if err != nil {
				continue
			}
			switch {
			case len(conds) == 0:
				err = filter.AddRule(call, act)
			case split:
				for _, c := range conds {
					if err = filter.AddRuleConditional(call, act, []libseccomp.ScmpCondition{c}); err != nil {
						break
					}
				}
			default:
				err = filter.AddRuleConditional(call, act, conds)
			}
			if err != nil {
				return nil, fmt.Errorf("seccomp rule for %s: %w", name, err)
			}
		}
	}
	// ExportBPFMem needs libseccomp 2.6; a memfd works with every version.
	fd, err := unix.MemfdCreate("roost-seccomp", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "roost-seccomp")
	defer f.Close()
	if err := filter.ExportBPF(f); err != nil {
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

func seccompAction(a specs.LinuxSeccompAction, errno *uint) (libseccomp.ScmpAction, error) {
	code := int16(unix.EPERM)
	if errno != nil {
		code = int16(*errno)
	}
	switch a {
	case specs.ActAllow:
		return libseccomp.ActAllow, nil
	case specs.ActErrno:
		return libseccomp.ActErrno.SetReturnCode(code), nil
	case specs.ActKill, specs.ActKillThread:
		return libseccomp.ActKillThread, nil
	case specs.ActKillProcess:
		return libseccomp.ActKillProcess, nil
	case specs.ActTrap:
		return libseccomp.ActTrap, nil
	case specs.ActTrace:
		return libseccomp.ActTrace.SetReturnCode(code), nil
	case specs.ActLog:
		return libseccomp.ActLog, nil
	}
	return libseccomp.ActInvalid, fmt.Errorf("seccomp action %q is not supported", a)
}

var seccompOps = map[specs.LinuxSeccompOperator]libseccomp.ScmpCompareOp{
	specs.OpNotEqual:     libseccomp.CompareNotEqual,
	specs.OpLessThan:     libseccomp.CompareLess,
	specs.OpLessEqual:    libseccomp.CompareLessOrEqual,
	specs.OpEqualTo:      libseccomp.CompareEqual,
	specs.OpGreaterEqual: libseccomp.CompareGreaterEqual,
	specs.OpGreaterThan:  libseccomp.CompareGreater,
	specs.OpMaskedEqual:  libseccomp.CompareMaskedEqual,
}

// seccompConditions converts argument comparisons; split says two of them test the same
// argument, which libseccomp cannot AND, so each becomes a rule of its own.
func seccompConditions(args []specs.LinuxSeccompArg) ([]libseccomp.ScmpCondition, bool, error) {
	var conds []libseccomp.ScmpCondition
	seen := map[uint]bool{}
	split := false
	for _, a := range args {
		op, ok := seccompOps[a.Op]
		if !ok {
			return nil, false, fmt.Errorf("seccomp operator %q is not supported", a.Op)
		}
		var c libseccomp.ScmpCondition
		var err error
		if a.Op == specs.OpMaskedEqual {
			c, err = libseccomp.MakeCondition(a.Index, op, a.Value, a.ValueTwo)
		} else {
			c, err = libseccomp.MakeCondition(a.Index, op, a.Value)
		}
		if err != nil {
			return nil, false, err
		}
		split = split || seen[a.Index]
		seen[a.Index] = true
		conds = append(conds, c)
	}
	return conds, split, nil
}
