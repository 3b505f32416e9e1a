package session

import (
	"fmt"

	"github.com/containerd/errdefs"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/plan"
	"roost.dev/roost/pkg/session/ranges"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/session/warmpool"
)

// WarmCapsule asks for sandboxes made for a capsule's own shape (roostd
// --warm-pool-capsule DIR=N): its seccomp variant, host_read, workdir_exec and rlimits.
type WarmCapsule struct {
	// Dir is the capsule's directory.
	Dir string
	// Size is how many sandboxes of its shape to keep.
	Size int
}

// warmShapes are the shapes Config asks for: the default capsule's (WarmPool), then each
// WarmCapsule's, planned as a stage would plan it. A capsule that would not start sealed,
// or runs WASM, has no sandbox shape.
func warmShapes(cfg Config, planner *plan.Planner) ([]warmpool.Shape, error) {
	var shapes []warmpool.Shape
	if cfg.WarmPool > 0 {
		shapes = append(shapes, warmpool.Shape{WarmShape: sealed.DefaultWarmShape(), Size: cfg.WarmPool})
	}
	for _, c := range cfg.WarmCapsules {
		p, err := planner.Plan(plan.Options{Capsule: c.Dir}, false)
		if err != nil {
			return nil, fmt.Errorf("capsule %s: %w", c.Dir, err)
		}
		name := warmShapeName(p.Manifest.Name, p.Manifest.Version)
		switch {
		case p.Decision.Achieved != manifest.Sealed:
			return nil, fmt.Errorf("%s (%s) runs %s: only sealed sessions start in a sandbox made ahead: %w", name, c.Dir, p.Decision.Achieved, errdefs.ErrInvalidArgument)
		case p.Manifest.Run.Wasm != "":
			return nil, fmt.Errorf("%s (%s) runs a WASM module, which sandboxes made ahead do not hold: %w", name, c.Dir, errdefs.ErrInvalidArgument)
		}
		policy := p.Policy
		shapes = append(shapes, warmpool.Shape{WarmShape: sealed.WarmShape{Name: name, Policy: &policy}, Size: c.Size})
	}
	return shapes, nil
}

// warmShapeName names the shape of a capsule's own sandboxes (--warm-pool-capsule).
func warmShapeName(name, version string) string { return fmt.Sprintf("capsule %s@%s", name, version) }

// sandboxIDs are the uid ranges sandboxes hold in the record (warmpool.IDs).
type sandboxIDs struct {
	reg    registry
	pool   store.IDPool
	ranges *ranges.Keeper
}

func (s sandboxIDs) Reserve(sandbox string) (containment.IDs, error) {
	var ids containment.IDs
	err := s.reg.update(func(tx *store.Tx) error {
		held, err := tx.ReserveIDs(sandbox, s.pool)
		ids = containment.IDs(held)
		return err
	})
	return ids, err
}

func (s sandboxIDs) Release(keep func(sandbox string) bool) error {
	if err := s.reg.update(func(tx *store.Tx) error { return tx.ReleaseIDs(keep) }); err != nil {
		return err
	}
	s.ranges.Later()
	return nil
}
