package scoped

import (
	"context"
	"fmt"

	"roost.dev/roost/pkg/containment"
)

// Exec runs one more command in the scoped session proc runs, spec being the session's own
// start: in its program's mount and network namespaces, its cgroup, as its uid, under its
// Landlock rules, exec allowlist, seccomp filter and rlimits, with no capability.
func (r *Runtime) Exec(ctx context.Context, spec containment.Spec, proc containment.Process, opts containment.ExecOptions) (*containment.Execution, error) {
	user, err := spec.User()
	if err != nil {
		return nil, err
	}
	p, ok := proc.(*scopedProcess)
	if !ok {
		return nil, fmt.Errorf("session %s: not a process of this runtime", spec.SessionID)
	}
	es, err := r.execSpec(spec, user, r.TmpDir(spec.SessionID))
	if err != nil {
		return nil, err
	}
	return r.plain.ExecJoined(ctx, spec, p.PlainProcess, es, opts, true)
}
