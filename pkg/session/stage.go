package session

import (
	"encoding/json"
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
	"github.com/google/uuid"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/encoding/protojson"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/artifact"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/toolchain"
)

// StageOptions is what an operator asks for beyond the capsule itself.
type StageOptions struct {
	// Capsule is an absolute path to a capsule directory or its capsule.yaml.
	Capsule string
	// Workdir, when set, is an absolute directory used instead of <state-dir>/work/<id>.
	Workdir string
	// Deadline lowers limits.deadline_seconds; 0 leaves it.
	Deadline time.Duration
	// Containment raises the floor; ClassNone leaves it.
	Containment manifest.Class
	// Name names the session (run|stage --name); empty for none. A child a session spawns
	// has none: the delegation API gives it no way to ask for one.
	Name string

	// Set for a child a session spawns: its parent, the task text it is given, and the
	// delegation depth it inherits.
	ParentID       string
	Task           []byte
	DepthRemaining int
	// ownsWorkdir: Workdir is one roost made for the session, removed with it.
	ownsWorkdir bool
}

// plan is everything decided about a capsule before anything is recorded: the same
// decisions serve Stage and Explain.
type plan struct {
	dir      string
	raw      []byte
	manifest *manifest.Manifest
	policy   manifest.Policy
	decision containment.Decision
	ref      CapsuleRef
	// shell is what each shell.allow entry resolved to on this host.
	shell []toolchain.Entry
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
	p, err := m.plan(opts, false)
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
			workdir = filepath.Join(m.cfg.StateDir, workDir, describedSession)
		}
		// The ids a session would be given are decided at stage: the description shows
		// the pool's first range for a session's.
		ids := containment.IDs{First: m.cfg.IDs.First + idsPerSession, Size: idsPerSession}
		spec, err := d.Describe(describedSession, workdir, p.dir, ids, &p.policy)
		if err != nil {
			return nil, nil, err
		}
		if config, err = json.MarshalIndent(spec, "", "  "); err != nil {
			return nil, nil, err
		}
	}
	return m.explanation(p), config, nil
}

// Stage reads and validates the capsule, decides its containment, and records a session in
// state staged. A capsule that is invalid, or whose floor this host cannot meet, is refused
// and leaves no trace in the registry.
func (m *Manager) Stage(opts StageOptions) (*Record, error) {
	// A bad or taken name is refused before the capsule is read and copied: the record's
	// transaction claims the name for good (CreateWithTask), this only spares the work.
	if opts.Name != "" {
		if err := ValidName(opts.Name); err != nil {
			return nil, err
		}
		if err := m.reg.View(func(tx *Tx) error { return tx.nameFree(opts.Name, "") }); err != nil {
			return nil, err
		}
	}
	// Before the capsule is copied into the store, which is on the same filesystem.
	if err := m.checkDiskSpace(); err != nil {
		return nil, err
	}
	// The capsule's copy in the store is named by nothing until the session is recorded:
	// no collection may run in between.
	m.blobMu.RLock()
	defer m.blobMu.RUnlock()
	p, err := m.plan(opts, true)
	if err != nil {
		return nil, err
	}
	return m.stage(p, opts)
}

// stage records a session from its plan (a spawn has made the plan already, to referee it).
func (m *Manager) stage(p *plan, opts StageOptions) (*Record, error) {
	// A nearly full state directory takes no new session (a spawn's included); what runs
	// keeps the room.
	if err := m.checkDiskSpace(); err != nil {
		return nil, err
	}
	if !p.decision.Met {
		return nil, errdefs.ErrFailedPrecondition.WithMessage(p.decision.Shortfall)
	}
	if err := m.checkUpstream(&p.policy, filepath.Join(p.dir, manifest.FileName)); err != nil {
		return nil, err
	}
	if err := m.stageHooks(p, opts.ParentID); err != nil {
		return nil, err
	}
	var wasm *WasmRun
	if p.manifest.Run.Wasm != "" {
		var err error
		if wasm, err = m.cfg.Wasm.prepare(p.ref.Root(), p.manifest.Run.Wasm, filepath.Join(p.dir, manifest.FileName)); err != nil {
			return nil, err
		}
	}
	id, err := newID()
	if err != nil {
		return nil, err
	}
	workdir, owns := opts.Workdir, opts.ownsWorkdir
	if workdir == "" {
		workdir, owns = filepath.Join(m.cfg.StateDir, workDir, id), true
	} else if err := checkWorkdir(workdir); err != nil {
		return nil, err
	}
	rec := &Record{
		ID:           id,
		Name:         opts.Name,
		Capsule:      p.ref,
		Declared:     p.decision.Floor.String(),
		Achieved:     p.decision.Achieved.String(),
		ParentID:     opts.ParentID,
		HasTask:      opts.Task != nil,
		Workdir:      workdir,
		OwnsWorkdir:  owns,
		RecordsDir:   m.recordsDirFor(id),
		Command:      command(p.ref.Root(), p.manifest.Run),
		Deadline:     time.Duration(p.policy.Limits.DeadlineSeconds.Value) * time.Second,
		WorkdirLimit: p.policy.Resources.WorkdirMaxBytes.Value,
		Shell:        p.shell,
		Wasm:         wasm,
		CreatedAt:    time.Now().UTC(),
	}
	// A top-level session may start roostd --max-depth levels below it; each level one
	// less, and never more than any ancestor's spawn.max_depth.
	rec.DepthRemaining = min(m.cfg.MaxDepth, int(p.policy.Spawn.MaxDepth.Value))
	if opts.ParentID != "" {
		rec.DepthRemaining = min(opts.DepthRemaining, int(p.policy.Spawn.MaxDepth.Value))
	}
	rec.HostRoot = m.hostRoot(p)
	// The session's trace opens with this: the grants, and the ids it is given below.
	e := m.explanation(p)
	if err := m.update(func(tx *Tx) error {
		if !rec.HostRoot {
			if err := tx.AllocateIDs(rec, m.cfg.IDs); err != nil {
				return err
			}
		}
		if id := identityProto(rec); id != nil {
			e.Identity = id
		}
		explanation, err := explanationJSON.Marshal(e)
		if err != nil {
			return err
		}
		return tx.CreateWithTask(rec, p.raw, explanation, opts.Task)
	}); err != nil {
		return nil, err
	}
	m.cfg.Logger.Info("session staged", "session", rec.ID, "name", rec.Name, "capsule", rec.Capsule.Name+"@"+rec.Capsule.Version, "class", rec.Achieved,
		"declared", rec.Declared, "parent", rec.ParentID, "workdir", rec.Workdir)
	return rec, nil
}

// checkHostRead refuses a filesystem.host_read entry the operator does not offer (roostd's
// sessions.host_paths) or this host lacks.
func (m *Manager) checkHostRead(p *manifest.Policy, file string) error {
	for i, h := range p.Filesystem.HostRead {
		if !slices.ContainsFunc(m.cfg.HostPaths, func(allowed string) bool { return toolchain.Beneath(h, allowed) }) {
			offered := "none"
			if len(m.cfg.HostPaths) > 0 {
				offered = strings.Join(m.cfg.HostPaths, ", ")
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
func (m *Manager) hostRoot(p *plan) bool {
	return p.decision.Achieved != manifest.Sealed && slices.Contains(m.cfg.AllowRoot, p.manifest.Name)
}

// command is the program's command line: run.command (or run.wasm's module) then run.args.
// A program named by a relative path with a slash (bin/agent) lives in the capsule directory,
// as a module always does.
func command(capsuleDir string, run manifest.Run) []string {
	if run.Wasm != "" {
		return append([]string{filepath.Join(capsuleDir, run.Wasm)}, run.Args...)
	}
	argv := append(append([]string{}, run.Command...), run.Args...)
	if !filepath.IsAbs(argv[0]) && strings.Contains(argv[0], "/") {
		argv[0] = filepath.Join(capsuleDir, argv[0])
	}
	return argv
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

// plan reads the capsule and decides everything about a session of it. With store, a capsule
// given by its path is copied into the content store first (see importCapsule), and the
// session will run that copy.
func (m *Manager) plan(opts StageOptions, store bool) (*plan, error) {
	var dir, digest string
	var raw []byte
	var err error
	source := ""
	if _, _, isRef := artifact.ParseRef(opts.Capsule); isRef && !filepath.IsAbs(opts.Capsule) {
		dir, digest, raw, err = m.readArtifact(opts.Capsule)
	} else {
		dir, raw, err = readCapsule(opts.Capsule)
		if err == nil && store && m.cfg.Artifacts != nil {
			source = dir
			dir, digest, raw, err = m.importCapsule(dir)
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
	if err := m.checkHostRead(&policy, filepath.Join(dir, manifest.FileName)); err != nil {
		return nil, err
	}
	// What the session may exec is decided here, on this host, and recorded: an entry that
	// names nothing here is refused now, not found missing at launch.
	shell, err := m.tools.Resolve(policy.Shell.Allow, "", dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(source, manifest.FileName), shellAllowRefused(err, max(policy.Containment, m.cfg.DaemonFloor, opts.Containment)))
	}
	decision := containment.Decide(&policy, containment.Sources(&policy, m.cfg.DaemonFloor, opts.Containment), m.cfg.Catalog)
	return &plan{
		dir:      dir,
		raw:      raw,
		manifest: man,
		policy:   policy,
		decision: decision,
		ref:      CapsuleRef{Name: man.Name, Version: man.Version, SHA256: digest, Source: source, Dir: dir},
		shell:    shell,
	}, nil
}

// importCapsule copies a capsule directory into the content store, by descriptors, and
// returns the copy: the session runs exactly the bytes its digest names, readable by its
// unprivileged uid wherever the operator's directory lives, and immune to changes made to
// the directory after staging.
func (m *Manager) importCapsule(dir string) (blob, digest string, raw []byte, err error) {
	imp, err := m.cfg.Artifacts.Import(dir)
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
func (m *Manager) readArtifact(ref string) (dir, digest string, raw []byte, err error) {
	if m.cfg.Artifacts == nil {
		return "", "", nil, fmt.Errorf("capsule %s: this daemon keeps no artifact store: %w", ref, errdefs.ErrFailedPrecondition)
	}
	a, err := m.cfg.Artifacts.Resolve(ref)
	if err != nil {
		return "", "", nil, err
	}
	dir = m.cfg.Artifacts.Dir(a)
	raw, err = os.ReadFile(filepath.Join(dir, manifest.FileName))
	if err != nil {
		return "", "", nil, fmt.Errorf("capsule %s: its stored tree is damaged: %v: %w", ref, err, errdefs.ErrDataLoss)
	}
	return dir, a.SHA256, raw, nil
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
