// Package plan decides what a capsule becomes on this host before anything is recorded: it
// reads the capsule (a directory, copied into the content store, or a pushed name@version),
// lowers its manifest to a policy, decides its containment class against the host's
// catalogue, resolves what its shell.allow names, and explains all of it grant by grant. It
// writes no record and starts nothing; pkg/session stages what it plans.
package plan

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"roost.dev/roost/pkg/artifact"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/sysview"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/toolchain"
)

// Plan is everything decided about a capsule before anything is recorded: the same
// decisions serve a stage, a spawn's referee and explain.
type Plan struct {
	// Dir is the capsule the session will run (the content store's copy when there is
	// one); Raw its capsule.yaml.
	Dir      string
	Raw      []byte
	Manifest *manifest.Manifest
	Policy   manifest.Policy
	Decision containment.Decision
	Ref      store.CapsuleRef
	// Shell is what each shell.allow entry resolved to on this host.
	Shell []toolchain.Entry
}

// Options is what an operator asks of a capsule beyond the capsule itself.
type Options struct {
	// Capsule is an absolute path to a capsule directory or its capsule.yaml, or a pushed
	// capsule's name@version.
	Capsule string
	// Deadline lowers limits.deadline_seconds; 0 leaves it.
	Deadline time.Duration
	// MemoryBytes lowers resources.cgroup_memory_bytes; 0 leaves it.
	MemoryBytes int64
	// Containment raises the floor; ClassNone leaves it.
	Containment manifest.Class
}

// Artifacts is what planning needs of the content store (pkg/artifact).
type Artifacts interface {
	Resolve(ref string) (artifact.Artifact, error)
	Dir(a artifact.Artifact) string
	// Import copies a capsule directory into the store, named by its digest.
	Import(dir string) (artifact.Imported, error)
}

// Config is what a Planner knows of this host and its operator.
type Config struct {
	// Artifacts resolves name@version capsules and keeps copies of staged directories; nil
	// when the daemon keeps none.
	Artifacts Artifacts
	Catalog   containment.Catalog
	// DaemonFloor is roostd --containment; ClassNone when unset.
	DaemonFloor manifest.Class
	// AllowRoot names capsules whose sessions, when not sealed, run as host root; HostPaths
	// the host trees capsules may read (roostd's sessions.allow_root and host_paths).
	AllowRoot []string
	HostPaths []string
	// EnvPassthrough is the operator's list of host variables env.allow may draw from, and
	// HostEnv the environment they come from.
	EnvPassthrough []string
	HostEnv        []string
}

// Planner decides what a capsule becomes on this host: its policy, its containment, what its
// shell.allow names resolve to, and whether it may run as host root. It records nothing.
type Planner struct {
	cfg Config
	// tools resolves shell.allow entries, toolchain presets among them, on this host.
	tools *toolchain.Resolver
	// system keeps what working out closures read of the host's files; closures the
	// closures worked out lately.
	system   *sysview.Cache
	closures closures
}

// New plans with what cfg says of the host.
func New(cfg Config) *Planner {
	return &Planner{cfg: cfg, tools: toolchain.NewResolver(), system: sysview.NewCache()}
}

// Tools resolves shell.allow entries on this host (a launch of a session staged before they
// were recorded resolves them then).
func (pl *Planner) Tools() *toolchain.Resolver { return pl.tools }

// Plan reads the capsule and decides everything about a session of it. With toStore, a capsule
// given by its path is copied into the content store first (see importCapsule), and the
// session will run that copy.
func (pl *Planner) Plan(opts Options, toStore bool) (*Plan, error) {
	var dir, digest string
	var raw []byte
	var err error
	source := ""
	if _, _, isRef := artifact.ParseRef(opts.Capsule); isRef && !filepath.IsAbs(opts.Capsule) {
		dir, digest, raw, err = pl.readArtifact(opts.Capsule)
	} else {
		dir, raw, err = readCapsule(opts.Capsule)
		if err == nil && toStore && pl.cfg.Artifacts != nil {
			source = dir
			dir, digest, raw, err = pl.importCapsule(dir)
		}
	}
	if err != nil {
		return nil, err
	}
	if source == "" {
		source = dir
	}
	// Errors name the file the operator wrote, not the stored copy.
	man, err := manifest.Parse(raw, filepath.Join(source, manifest.FileName))
	if err != nil {
		return nil, err
	}
	policy := manifest.Lower(man)
	if opts.Deadline != 0 {
		if opts.Deadline < time.Second || opts.Deadline%time.Second != 0 {
			return nil, fmt.Errorf("deadline %s: give a whole number of seconds, at least 1s: %w", opts.Deadline, errdefs.ErrInvalidArgument)
		}
		// Only lowering is allowed; one above is refused, not silently dropped, so the
		// operator is not left believing the session has the time asked for.
		if err := deadlineAbove(policy, opts.Deadline); err != nil {
			return nil, err
		}
		policy.LowerDeadline(int64(opts.Deadline / time.Second))
	}
	if opts.MemoryBytes != 0 {
		if opts.MemoryBytes < 0 {
			return nil, fmt.Errorf("memory %d bytes: must be positive: %w", opts.MemoryBytes, errdefs.ErrInvalidArgument)
		}
		// As the deadline: refused above, so no session runs believed smaller than it is.
		if err := memoryAbove(policy, opts.MemoryBytes); err != nil {
			return nil, err
		}
		policy.LowerCgroupMemory(opts.MemoryBytes)
	}
	if digest == "" {
		// The tree's errors name it and say what is wrong (a link on the way, a device,
		// a tree changing under the walk), classified.
		if digest, err = artifact.DigestDir(dir); err != nil {
			return nil, err
		}
	}
	if err := pl.checkHostRead(&policy, filepath.Join(dir, manifest.FileName)); err != nil {
		return nil, err
	}
	// What the session may exec is decided here, on this host, and recorded: an entry that
	// names nothing here is refused now, not found missing at launch.
	shell, err := pl.tools.Resolve(policy.Shell.Allow, "", dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(source, manifest.FileName), shellAllowRefused(err, max(policy.Containment, pl.cfg.DaemonFloor, opts.Containment)))
	}
	decision := containment.Decide(&policy, containment.Sources(&policy, pl.cfg.DaemonFloor, opts.Containment), pl.cfg.Catalog)
	return &Plan{
		Dir:      dir,
		Raw:      raw,
		Manifest: man,
		Policy:   policy,
		Decision: decision,
		Ref:      store.CapsuleRef{Name: man.Name, Version: man.Version, SHA256: digest, Source: source, Dir: dir},
		Shell:    shell,
	}, nil
}

// importCapsule copies a capsule directory into the content store, by descriptors, and
// returns the copy: the session runs exactly the bytes its digest names, readable by its
// unprivileged uid wherever the operator's directory lives, and immune to changes made to
// the directory after staging.
func (pl *Planner) importCapsule(dir string) (blob, digest string, raw []byte, err error) {
	imp, err := pl.cfg.Artifacts.Import(dir)
	if err != nil {
		return "", "", nil, err
	}
	if imp.Manifest == nil {
		return "", "", nil, fmt.Errorf("capsule %s: no %s at its top (a symlink is not one): %w", dir, manifest.FileName, errdefs.ErrInvalidArgument)
	}
	return imp.Dir, imp.SHA256, imp.Manifest, nil
}

// readArtifact finds a pushed capsule; its tree is immutable and its digest was checked when
// it was pushed.
func (pl *Planner) readArtifact(ref string) (dir, digest string, raw []byte, err error) {
	if pl.cfg.Artifacts == nil {
		return "", "", nil, fmt.Errorf("capsule %s: this daemon keeps no artifact store: %w", ref, errdefs.ErrFailedPrecondition)
	}
	a, err := pl.cfg.Artifacts.Resolve(ref)
	if err != nil {
		return "", "", nil, err
	}
	dir = pl.cfg.Artifacts.Dir(a)
	raw, err = os.ReadFile(filepath.Join(dir, manifest.FileName))
	if err != nil {
		return "", "", nil, fmt.Errorf("capsule %s: its stored tree is damaged: %v: %w", ref, err, errdefs.ErrDataLoss)
	}
	return dir, a.SHA256, raw, nil
}

// checkHostRead refuses a filesystem.host_read entry the operator does not offer (roostd's
// sessions.host_paths) or this host lacks.
func (pl *Planner) checkHostRead(p *manifest.Policy, file string) error {
	for i, h := range p.Filesystem.HostRead {
		if !slices.ContainsFunc(pl.cfg.HostPaths, func(allowed string) bool { return toolchain.Beneath(h, allowed) }) {
			offered := "none"
			if len(pl.cfg.HostPaths) > 0 {
				offered = strings.Join(pl.cfg.HostPaths, ", ")
			}
			return fmt.Errorf("%s: capabilities.filesystem.host_read[%d]: %s is not among the host trees roostd offers sessions (sessions.host_paths: %s): %w", file, i, h, offered, errdefs.ErrPermissionDenied)
		}
		if _, err := os.Stat(h); err != nil {
			return fmt.Errorf("%s: capabilities.filesystem.host_read[%d]: %s: %v: %w", file, i, h, err, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// HostRoot says whether the operator lets a session of the plan run as host root: only a
// capsule roostd's sessions.allow_root names, and never in a sealed root (whose root is its
// user namespace's).
func (pl *Planner) HostRoot(p *Plan) bool {
	return p.Decision.Achieved != manifest.Sealed && slices.Contains(pl.cfg.AllowRoot, p.Manifest.Name)
}

// readCapsule finds the capsule directory and reads its manifest.
func readCapsule(path string) (dir string, raw []byte, err error) {
	if path == "" {
		return "", nil, fmt.Errorf("no capsule given: %w", errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(path) {
		return "", nil, fmt.Errorf("capsule path %q is not absolute: %w", path, errdefs.ErrInvalidArgument)
	}
	dir = filepath.Clean(path)
	info, err := os.Stat(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil, fmt.Errorf("capsule %s: no such directory: %w", dir, errdefs.ErrNotFound)
		}
		return "", nil, fmt.Errorf("capsule %s: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	if !info.IsDir() {
		if filepath.Base(dir) != manifest.FileName {
			return "", nil, fmt.Errorf("capsule %s: not a directory (give the directory that holds %s): %w", dir, manifest.FileName, errdefs.ErrInvalidArgument)
		}
		dir = filepath.Dir(dir)
	}
	f, err := os.Open(filepath.Join(dir, manifest.FileName))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil, fmt.Errorf("capsule %s: no %s in it: %w", dir, manifest.FileName, errdefs.ErrInvalidArgument)
		}
		return "", nil, fmt.Errorf("capsule %s: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	raw, err = io.ReadAll(io.LimitReader(f, manifest.MaxSize+1))
	if err != nil {
		return "", nil, fmt.Errorf("capsule %s: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	return dir, raw, nil
}
