package session

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"roost.dev/roost/pkg/artifact"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/toolchain"
)

// plan is everything decided about a capsule before anything is recorded: the same
// decisions serve Stage and Explain.
type plan struct {
	dir      string
	raw      []byte
	manifest *manifest.Manifest
	policy   manifest.Policy
	decision containment.Decision
	ref      store.CapsuleRef
	// shell is what each shell.allow entry resolved to on this host.
	shell []toolchain.Entry
}

// planner decides what a capsule becomes on this host: its policy, its containment, what its
// shell.allow names resolve to, and whether it may run as host root. It records nothing.
type planner struct {
	artifacts   Artifacts
	catalog     containment.Catalog
	daemonFloor manifest.Class
	allowRoot   []string
	hostPaths   []string
	// tools resolves shell.allow entries, toolchain presets among them, on this host.
	tools *toolchain.Resolver
}

// plan reads the capsule and decides everything about a session of it. With toStore, a capsule
// given by its path is copied into the content store first (see importCapsule), and the
// session will run that copy.
func (pl planner) plan(opts StageOptions, toStore bool) (*plan, error) {
	var dir, digest string
	var raw []byte
	var err error
	source := ""
	if _, _, isRef := artifact.ParseRef(opts.Capsule); isRef && !filepath.IsAbs(opts.Capsule) {
		dir, digest, raw, err = pl.readArtifact(opts.Capsule)
	} else {
		dir, raw, err = readCapsule(opts.Capsule)
		if err == nil && toStore && pl.artifacts != nil {
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
		return nil, fmt.Errorf("%s: %w", filepath.Join(source, manifest.FileName), shellAllowRefused(err, max(policy.Containment, pl.daemonFloor, opts.Containment)))
	}
	decision := containment.Decide(&policy, containment.Sources(&policy, pl.daemonFloor, opts.Containment), pl.catalog)
	return &plan{
		dir:      dir,
		raw:      raw,
		manifest: man,
		policy:   policy,
		decision: decision,
		ref:      store.CapsuleRef{Name: man.Name, Version: man.Version, SHA256: digest, Source: source, Dir: dir},
		shell:    shell,
	}, nil
}

// importCapsule copies a capsule directory into the content store, by descriptors, and
// returns the copy: the session runs exactly the bytes its digest names, readable by its
// unprivileged uid wherever the operator's directory lives, and immune to changes made to
// the directory after staging.
func (pl planner) importCapsule(dir string) (blob, digest string, raw []byte, err error) {
	imp, err := pl.artifacts.Import(dir)
	if err != nil {
		return "", "", nil, err
	}
	f, err := os.Open(filepath.Join(imp.Dir, manifest.FileName))
	if err != nil {
		return "", "", nil, fmt.Errorf("capsule %s: no %s in it: %w", dir, manifest.FileName, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	if raw, err = io.ReadAll(io.LimitReader(f, manifest.MaxSize+1)); err != nil {
		return "", "", nil, err
	}
	return imp.Dir, imp.SHA256, raw, nil
}

// readArtifact finds a pushed capsule; its tree is immutable and its digest was checked when
// it was pushed.
func (pl planner) readArtifact(ref string) (dir, digest string, raw []byte, err error) {
	if pl.artifacts == nil {
		return "", "", nil, fmt.Errorf("capsule %s: this daemon keeps no artifact store: %w", ref, errdefs.ErrFailedPrecondition)
	}
	a, err := pl.artifacts.Resolve(ref)
	if err != nil {
		return "", "", nil, err
	}
	dir = pl.artifacts.Dir(a)
	raw, err = os.ReadFile(filepath.Join(dir, manifest.FileName))
	if err != nil {
		return "", "", nil, fmt.Errorf("capsule %s: its stored tree is damaged: %v: %w", ref, err, errdefs.ErrDataLoss)
	}
	return dir, a.SHA256, raw, nil
}

// checkHostRead refuses a filesystem.host_read entry the operator does not offer (roostd's
// sessions.host_paths) or this host lacks.
func (pl planner) checkHostRead(p *manifest.Policy, file string) error {
	for i, h := range p.Filesystem.HostRead {
		if !slices.ContainsFunc(pl.hostPaths, func(allowed string) bool { return toolchain.Beneath(h, allowed) }) {
			offered := "none"
			if len(pl.hostPaths) > 0 {
				offered = strings.Join(pl.hostPaths, ", ")
			}
			return fmt.Errorf("%s: capabilities.filesystem.host_read[%d]: %s is not among the host trees roostd offers sessions (sessions.host_paths: %s): %w", file, i, h, offered, errdefs.ErrPermissionDenied)
		}
		if _, err := os.Stat(h); err != nil {
			return fmt.Errorf("%s: capabilities.filesystem.host_read[%d]: %s: %v: %w", file, i, h, err, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// hostRoot says whether the operator lets a session of the plan run as host root: only a
// capsule roostd's sessions.allow_root names, and never in a sealed root (whose root is its
// user namespace's).
func (pl planner) hostRoot(p *plan) bool {
	return p.decision.Achieved != manifest.Sealed && slices.Contains(pl.allowRoot, p.manifest.Name)
}
