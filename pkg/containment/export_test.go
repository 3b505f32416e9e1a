package containment

import (
	"context"

	"roost.dev/roost/pkg/containment/roostinit"
)

// What the package's external tests (package containment_test) reach of its insides.

// StartPlain starts roost-init for s with es, in no cgroup.
func StartPlain(r *ProcessRuntime, ctx context.Context, s Spec, es roostinit.ExecSpec) (Process, error) {
	return r.start(ctx, s, es, nil)
}

// SpecUser is who s's program runs as.
func SpecUser(s Spec) (*roostinit.User, error) { return s.user() }

// ScopedSeccomp and ScopedExec are what a scoped session's program is held by.
var (
	ScopedSeccomp = scopedSeccomp
	ScopedExec    = scopedExec
)

// SealedWork and SealedCapsule are where a sealed session finds its workdir and capsule.
const (
	SealedWork    = sealedWork
	SealedCapsule = sealedCapsule
)
