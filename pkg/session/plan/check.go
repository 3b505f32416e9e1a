package plan

import (
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/toolchain"
)

// deadlineAbove refuses a requested deadline above the capsule's own (declared, or the
// default when it declares none): --deadline can only lower it.
func deadlineAbove(p manifest.Policy, d time.Duration) error {
	limit := p.Limits.DeadlineSeconds
	if d <= time.Duration(limit.Value)*time.Second {
		return nil
	}
	whose := fmt.Sprintf("the capsule's limits.deadline_seconds (%d s)", limit.Value)
	if limit.Declared == nil {
		whose = fmt.Sprintf("the default deadline (%d s; the capsule declares no limits.deadline_seconds)", limit.Value)
	}
	return fmt.Errorf("--deadline %s is above %s; it can only lower it: %w", d, whose, errdefs.ErrInvalidArgument)
}

// memoryAbove refuses a requested cgroup memory above the capsule's own (declared, or the
// default when it declares none): --memory can only lower it.
func memoryAbove(p manifest.Policy, bytes int64) error {
	limit := p.Resources.CgroupMemoryBytes
	if bytes <= limit.Value {
		return nil
	}
	whose := fmt.Sprintf("the capsule's resources.cgroup_memory_bytes (%s)", manifest.FormatSize(limit.Value))
	if limit.Declared == nil {
		whose = fmt.Sprintf("the default cgroup memory (%s; the capsule declares no resources.cgroup_memory_bytes)", manifest.FormatSize(limit.Value))
	}
	return fmt.Errorf("--memory %s is above %s; it can only lower it: %w", manifest.FormatSize(bytes), whose, errdefs.ErrInvalidArgument)
}

// shellAllowRefused says, of a shell.allow name found nowhere, where a sealed session would
// have looked (the sealed root binds the host's /usr, so the host's PATH is its PATH), and
// what a program the session installs itself needs instead.
func shellAllowRefused(err error, floor manifest.Class) error {
	if !errors.Is(err, toolchain.ErrNotOnPath) {
		return err
	}
	where := ""
	if floor == manifest.Sealed {
		where = "; the sealed root's PATH is the host's (its /usr is bound read-only)"
	}
	return fmt.Errorf("%w%s; a program the session installs in its workdir needs filesystem.workdir_exec, not shell.allow", err, where)
}
