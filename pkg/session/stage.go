package session

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/session/dirs"
	"roost.dev/roost/pkg/session/plan"
	"roost.dev/roost/pkg/session/ranges"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/session/warmpool"

	"github.com/containerd/errdefs"
	"github.com/google/uuid"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/encoding/protojson"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
)

// plan is what of the options planning reads.
func (o StageOptions) plan() plan.Options {
	return plan.Options{Capsule: o.Capsule, Deadline: o.Deadline, MemoryBytes: o.MemoryBytes, Containment: o.Containment}
}

// StageOptions is what an operator asks for beyond the capsule itself.
type StageOptions struct {
	// Capsule is an absolute path to a capsule directory or its capsule.yaml.
	Capsule string
	// Workdir, when set, is an absolute directory used instead of <state-dir>/work/<id>.
	Workdir string
	// Deadline lowers limits.deadline_seconds; 0 leaves it.
	Deadline time.Duration
	// MemoryBytes lowers resources.cgroup_memory_bytes; 0 leaves it.
	MemoryBytes int64
	// Containment raises the floor; ClassNone leaves it.
	Containment manifest.Class
	// Name names the session (run|stage --name); empty for none. A child a session spawns
	// has none: the delegation API gives it no way to ask for one.
	Name string
	// Labels label the session (run|stage --label); nil for none. A child a session spawns
	// has none: its parent's describe the parent, and the delegation API gives it no way
	// to ask for its own.
	Labels map[string]string
	// Placement is how the fleet chose this node, when it placed the session; nil otherwise.
	Placement *store.Placement

	// Set for a child a session spawns: its parent, the task text it is given, and the
	// delegation depth it inherits.
	ParentID       string
	Task           []byte
	DepthRemaining int
	// ownsWorkdir: Workdir is one roost made for the session, removed with it.
	ownsWorkdir bool
}

// OCIDescriber is a runtime that can show the OCI runtime spec a session would run with.
type OCIDescriber interface {
	Describe(sessionID, workdir, capsuleDir string, ids containment.IDs, p *manifest.Policy) (*specs.Spec, error)
}

// describedSession stands in for a session id in a description of one.
const describedSession = "SESSION"

// Explain decides what Stage would, without recording anything. With oci it also returns
// the OCI runtime spec a sealed session of the capsule would run with, as JSON.
func (m *Manager) Explain(opts StageOptions, oci bool) (*roostv1.Explanation, []byte, error) {
	p, err := m.planner.Plan(opts.plan(), false)
	if err != nil {
		return nil, nil, err
	}
	var config []byte
	if oci {
		d, ok := m.cfg.Runtimes[manifest.Sealed].(OCIDescriber)
		if !ok {
			return nil, nil, fmt.Errorf("this daemon has no sealed runtime to describe: %w", errdefs.ErrFailedPrecondition)
		}
		workdir := opts.Workdir
		if workdir == "" {
			workdir = filepath.Join(m.cfg.StateDir, dirs.WorkDir, describedSession)
		}
		// The ids a session would be given are decided at stage: the description shows
		// the pool's first range for a session's.
		ids := containment.IDs{First: m.cfg.IDs.First + idsPerSession, Size: idsPerSession}
		spec, err := d.Describe(describedSession, workdir, p.Dir, ids, &p.Policy)
		if err != nil {
			return nil, nil, err
		}
		if config, err = json.MarshalIndent(spec, "", "  "); err != nil {
			return nil, nil, err
		}
	}
	return explain(m.planner, m.pool, p), config, nil
}

// Needs is what a session staged with opts needs of its node, as this node reads its capsule:
// the class it declares at least, and the warm sandbox shapes, by name, that could start it
// (its capsule's own, and the default one, for a sealed session of a command). The fleet's
// placement reads it on the entry node, which may run the session elsewhere.
func (m *Manager) Needs(opts StageOptions) (manifest.Class, []string, error) {
	p, err := m.planner.Plan(opts.plan(), false)
	if err != nil {
		return manifest.ClassNone, nil, err
	}
	var shapes []string
	if p.Manifest.Run.Wasm == "" && (p.Decision.Floor == manifest.Sealed || p.Decision.Achieved == manifest.Sealed) {
		shapes = append(shapes, warmShapeName(p.Manifest.Name, p.Manifest.Version), sealed.DefaultWarmShapeName)
	}
	return p.Decision.Floor, shapes, nil
}

// Stage reads and validates the capsule, decides its containment, and records a session in
// state staged. A capsule that is invalid, or whose floor this host cannot meet, is refused
// and leaves no trace in the registry.
func (m *Manager) Stage(opts StageOptions) (*store.Record, error) {
	// A bad or taken name is refused before the capsule is read and copied: the record's
	// transaction claims the name for good (CreateWithTask), this only spares the work.
	if opts.Name != "" {
		if err := store.ValidName(opts.Name); err != nil {
			return nil, err
		}
		if err := m.reg.View(func(tx *store.Tx) error { return tx.NameFree(opts.Name, "") }); err != nil {
			return nil, err
		}
	}
	// As the name: the record's transaction checks the labels for good, this spares the work.
	if err := store.CheckLabels(opts.Labels); err != nil {
		return nil, err
	}
	// Before the capsule is copied into the store, which is on the same filesystem.
	if err := checkDiskSpace(m.cfg.StateDir, m.cfg.Observer); err != nil {
		return nil, err
	}
	// The capsule's copy in the store is named by nothing until the session is recorded:
	// no collection may run in between.
	m.blobMu.RLock()
	defer m.blobMu.RUnlock()
	p, err := m.planner.Plan(opts.plan(), true)
	if err != nil {
		return nil, err
	}
	return m.stage(p, opts)
}

// stage records a session from its plan (a spawn has made the plan already, to referee it).
func (m *Manager) stage(p *plan.Plan, opts StageOptions) (*store.Record, error) {
	// A nearly full state directory takes no new session (a spawn's included); what runs
	// keeps the room.
	if err := checkDiskSpace(m.cfg.StateDir, m.cfg.Observer); err != nil {
		return nil, err
	}
	if !p.Decision.Met {
		return nil, errdefs.ErrFailedPrecondition.WithMessage(p.Decision.Shortfall)
	}
	if err := m.accounts.CheckUpstream(&p.Policy, filepath.Join(p.Dir, manifest.FileName)); err != nil {
		return nil, err
	}
	// The grants, once: the stage hooks judge them and the session's trace opens with them
	// (with the ids it is given below).
	e := explain(m.planner, m.pool, p)
	if err := stageHooks(m.ctx, m.cfg.Hooks, p, e, opts.ParentID); err != nil {
		return nil, err
	}
	var wasm *store.WasmRun
	if p.Manifest.Run.Wasm != "" {
		mod, err := m.cfg.Wasm.Prepare(p.Ref.Root(), p.Manifest.Run.Wasm, filepath.Join(p.Dir, manifest.FileName))
		if err != nil {
			return nil, err
		}
		run := store.WasmRun(*mod)
		wasm = &run
	}
	id, err := newID()
	if err != nil {
		return nil, err
	}
	workdir, owns := opts.Workdir, opts.ownsWorkdir
	if workdir == "" {
		workdir, owns = filepath.Join(m.cfg.StateDir, dirs.WorkDir, id), true
	} else if err := checkWorkdir(workdir); err != nil {
		return nil, err
	}
	rec := &store.Record{
		ID:           id,
		Name:         opts.Name,
		Labels:       opts.Labels,
		Capsule:      p.Ref,
		Declared:     p.Decision.Floor.String(),
		Achieved:     p.Decision.Achieved.String(),
		ParentID:     opts.ParentID,
		HasTask:      opts.Task != nil,
		Workdir:      workdir,
		OwnsWorkdir:  owns,
		RecordsDir:   m.trees.Records(id),
		Command:      plan.Command(p.Ref.Root(), p.Manifest.Run),
		Deadline:     time.Duration(p.Policy.Limits.DeadlineSeconds.Value) * time.Second,
		WorkdirLimit: p.Policy.Resources.WorkdirMaxBytes.Value,
		MemoryLimit:  p.Policy.Resources.CgroupMemoryBytes.Value,
		Shell:        p.Shell,
		Wasm:         wasm,
		CreatedAt:    time.Now().UTC(),
		Placement:    opts.Placement,
	}
	// A top-level session may start roostd --max-depth levels below it; each level one
	// less, and never more than any ancestor's spawn.max_depth.
	rec.DepthRemaining = min(m.cfg.MaxDepth, int(p.Policy.Spawn.MaxDepth.Value))
	if opts.ParentID != "" {
		rec.DepthRemaining = min(opts.DepthRemaining, int(p.Policy.Spawn.MaxDepth.Value))
	}
	rec.HostRoot = m.planner.HostRoot(p)
	if err := m.reg.update(func(tx *store.Tx) error {
		if !rec.HostRoot {
			if rec.ParentID != "" {
				if err := (ranges.Bounds{PerTree: m.cfg.RangesPerTree, Spawns: m.cfg.RangesForSpawns}).RefuseSpawn(tx, rec.ParentID); err != nil {
					return err
				}
			}
			if err := tx.AllocateIDs(rec, m.cfg.IDs); err != nil {
				return err
			}
		}
		if id := IdentityProto(rec); id != nil {
			e.Identity = id
		}
		explanation, err := explanationJSON.Marshal(e)
		if err != nil {
			return err
		}
		return tx.CreateWithTask(rec, p.Raw, explanation, opts.Task)
	}); err != nil {
		if refused := (*ranges.Refusal)(nil); errors.As(err, &refused) {
			m.journal.LimitHit(rec.ParentID, store.LimitIDRanges, refused.Error())
		}
		return nil, err
	}
	m.cfg.Logger.Info("session staged", "session", rec.ID, "name", rec.Name, "capsule", rec.Capsule.Name+"@"+rec.Capsule.Version, "class", rec.Achieved,
		"declared", rec.Declared, "parent", rec.ParentID, "workdir", rec.Workdir)
	return rec, nil
}

func checkWorkdir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("workdir %q is not absolute: %w", dir, errdefs.ErrInvalidArgument)
	}
	info, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("workdir %s: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	case !info.IsDir():
		return fmt.Errorf("workdir %s is not a directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	return nil
}

// newID returns a session id: "ses_" and a UUIDv7 in hex, so ids sort by creation time.
func newID() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return "ses_" + strings.ReplaceAll(u.String(), "-", ""), nil
}

var explanationJSON = protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true}

var _ OCIDescriber = (*sealed.Runtime)(nil)

// explain is the plan grant by grant, with how a session of it would start here.
func explain(planner *plan.Planner, pool *warmpool.Pool, p *plan.Plan) *roostv1.Explanation {
	return planner.Explain(p, func(c manifest.Class) *roostv1.StartPath {
		return pool.StartPath(&p.Policy, p.Manifest.Run.Wasm != "", c)
	})
}
