package delegate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/spawn"
	"roost.dev/roost/pkg/workdir"
)

// maxTask bounds the task text a parent hands a child.
const maxTask = 256 << 10

// Live says whether a session runs: only then is its credential honoured.
func (b *Backend) Live(id string) bool {
	rec, err := b.s.Record(id)
	return err == nil && rec.State.Live()
}

// Self is what a session sees of itself.
func (b *Backend) Self(id string) (spawn.Self, error) {
	rec, err := b.liveRecord(id)
	if err != nil {
		return spawn.Self{}, err
	}
	kids, err := b.s.Children(id)
	if err != nil {
		return spawn.Self{}, err
	}
	return spawn.Self{
		SessionID:      rec.ID,
		Capsule:        rec.Capsule.Name + "@" + rec.Capsule.Version,
		ParentID:       rec.ParentID,
		Containment:    rec.Achieved,
		DepthRemaining: rec.DepthRemaining,
		LiveChildren:   countLive(kids),
		DeadlineAt:     rec.DeadlineAt,
	}, nil
}

func countLive(recs []*store.Record) int {
	n := 0
	for _, r := range recs {
		if r.State == store.Staged || r.State.Live() {
			n++
		}
	}
	return n
}

// Spawn referees a session's request for a child and, granted, stages and launches it:
// with the parent as its parent, in a workdir of its own beneath the parent's (or a copy of
// the parent's, for names in spawn.workdir_snapshot), with the task text given.
func (b *Backend) Spawn(ctx context.Context, parentID string, req spawn.Request) (res spawn.SpawnResult, err error) {
	began := time.Now()
	result := "granted"
	var took time.Duration
	defer func() {
		if took == 0 {
			took = time.Since(began)
		}
		if b.cfg.Observer != nil {
			b.cfg.Observer.SpawnDecided(result, took)
		}
	}()
	if _, err := b.liveRecord(parentID); err != nil {
		result = "failed"
		return res, err
	}
	if err := checkRequest(req); err != nil {
		result = "invalid"
		return res, err
	}
	// One spawn at a time per parent: two must not both pass the live-children count.
	unlock, err := b.s.LockSpawns(parentID)
	if err != nil {
		result = "failed"
		return res, err
	}
	defer unlock()

	parent, pp, err := b.s.Policy(parentID)
	if err != nil {
		result = "failed"
		return res, err
	}
	ref := req.Capsule + "@" + req.Version
	// spawn.allow is judged before the name is looked up, so nothing about the store can be
	// learnt through names the session may not spawn.
	if err := spawn.Allowed(pp, req.Capsule); err != nil {
		result = "refused_" + spawn.ReasonSpawnAllow
		b.s.TraceDelegation(parent, ref, "", err)
		return res, err
	}
	child, err := b.s.PlanChild(ref)
	if err != nil {
		result = "failed"
		return res, err
	}
	kids, err := b.s.Children(parentID)
	if err != nil {
		result = "failed"
		return res, err
	}
	achieved, _ := manifest.ParseClass(parent.Achieved)
	verdict := spawn.Referee(
		spawn.Parent{ID: parentID, Policy: pp, Achieved: achieved, DepthRemaining: parent.DepthRemaining, LiveChildren: countLive(kids), TotalChildren: len(kids), HostRoot: parent.HostRoot, Shell: parent.Shell},
		spawn.Child{Name: req.Capsule, Ref: ref, Policy: child.Policy, Floor: child.Floor, HostRoot: child.HostRoot, Shell: child.Shell},
		b.cfg.MaxConcurrent)
	if verdict != nil {
		if r, ok := verdict.(*spawn.Refusal); ok {
			result = "refused_" + r.Reason
			if r.Key == spawn.KeyMaxTotalChildren {
				b.s.LimitHit(parentID, store.LimitChildrenTotal, r.Msg)
			}
		}
		b.s.TraceDelegation(parent, ref, "", verdict)
		return res, verdict
	}
	if !child.Met {
		result = "refused_containment"
		err := errdefs.ErrFailedPrecondition.WithMessage(child.Shortfall)
		b.s.TraceDelegation(parent, ref, "", err)
		return res, err
	}

	// A snapshot's copy is refused before it is begun when it cannot fit, and held within
	// the room measured while it is made.
	var snapshot *workdir.Limits
	refused := func(err error) error {
		result = "refused_" + spawn.ReasonEnvelope
		if r, ok := err.(*spawn.Refusal); ok {
			limit := store.LimitWorkdirBytes
			if r.Key == "capabilities.resources.workdir_max_inodes" {
				limit = store.LimitWorkdirInodes
			}
			b.s.LimitHit(parentID, limit, r.Msg)
		}
		b.s.TraceDelegation(parent, ref, "", err)
		return err
	}
	if slices.Contains(pp.Spawn.WorkdirSnapshot, req.Capsule) {
		room, err := b.snapshotFits(parent, pp)
		if err != nil {
			return res, refused(err)
		}
		snapshot = &room
	}
	dir, err := b.childWorkdir(parent, req.Capsule, snapshot)
	if r := (*spawn.Refusal)(nil); errors.As(err, &r) {
		return res, refused(r)
	}
	if err != nil {
		result = "failed"
		return res, err
	}
	var task []byte
	if req.Task != "" {
		task = []byte(req.Task)
	}
	staged, err := b.s.StageChild(child, ChildStage{Workdir: dir.host, ParentID: parentID, Task: task, DepthRemaining: parent.DepthRemaining - 1})
	if err != nil {
		result = "failed"
		if errdefs.IsResourceExhausted(err) {
			// No id range for it: the tree's, the spawns' or the block's are all held.
			result = "refused_id_ranges"
			b.s.TraceDelegation(parent, ref, "", err)
		}
		return res, err
	}
	b.s.TraceDelegation(parent, ref, staged.ID, nil)
	launched, err := b.s.Launch(context.WithoutCancel(ctx), staged.ID)
	if err != nil {
		// The parent ended before the child could launch: nothing of the child remains.
		result = "failed"
		if rerr := b.s.Remove(staged.ID); rerr != nil {
			b.cfg.Logger.Warn("removing a child that never launched", "session", staged.ID, "err", rerr)
		}
		return res, err
	}
	took = time.Since(began)
	if launched.State == store.Exited && launched.ExitStatus == store.StatusStartFailed {
		result = "failed"
	}
	res.ChildInfo = childInfo(parent, launched)
	if req.Wait {
		c, err := b.WaitChild(ctx, parentID, launched.ID)
		if err != nil {
			return res, err
		}
		res.Completion = &c
		if final, err := b.s.Record(launched.ID); err == nil {
			res.ChildInfo = childInfo(parent, final)
		}
	}
	return res, nil
}

func checkRequest(req spawn.Request) error {
	if req.Capsule == "" || req.Version == "" {
		return fmt.Errorf("a spawn names a pushed capsule: {\"capsule\": NAME, \"version\": VERSION}: %w", errdefs.ErrInvalidArgument)
	}
	if len(req.Task) > maxTask {
		return fmt.Errorf("task: %d bytes, more than %d: %w", len(req.Task), maxTask, errdefs.ErrInvalidArgument)
	}
	return nil
}

// childDir is where a child works: its path on the host, and as its parent sees it.
type childDir struct {
	host string
	rel  string
}

// childWorkdir makes a child's workdir. A sealed parent's children work beneath its own
// workdir, at .roost/children/<name>-<16 hex>, which the parent sees read-only (so it can
// swap nothing there for a link). A parent without a sealed root could, so its children
// work in roost's own state directory, under children/<parent id>/, and the parent finds a
// link to each at that place.
// With snapshot (a name in spawn.workdir_snapshot) the child starts with a copy of the
// parent's workdir, taken by descriptors, links copied as links, holes left holes, within
// the room snapshotFits measured; a copy that does not fit after all (the parent filled its
// workdir meanwhile) is refused as snapshotFits refuses, and nothing of the child is left.
func (b *Backend) childWorkdir(parent *store.Record, name string, snapshot *workdir.Limits) (childDir, error) {
	suffix := make([]byte, 8)
	if _, err := rand.Read(suffix); err != nil {
		return childDir{}, err
	}
	leaf := name + "-" + hex.EncodeToString(suffix)
	rel := filepath.Join(containment.ChildrenRoot, "children", leaf)
	d := childDir{rel: rel}
	if parent.Achieved == manifest.Sealed.String() {
		// Root's, readable by all: the parent sees them read-only through its /work/.roost,
		// and its children's own directories decide what it may read in them.
		if err := workdir.MkdirAll(parent.Workdir, rel, 0o755, nil); err != nil {
			return d, fmt.Errorf("the child's workdir: %w", err)
		}
		d.host = filepath.Join(parent.Workdir, rel)
	} else {
		if err := workdir.MkdirAll(parent.Workdir, filepath.Dir(rel), 0o755, nil); err != nil {
			return d, fmt.Errorf("the child's workdir: %w", err)
		}
		root, under, err := b.s.ChildrenDir(parent)
		if err != nil {
			return d, err
		}
		d.host = filepath.Join(root, under, leaf)
		if err := workdir.MkdirAll(root, filepath.Join(under, leaf), 0o700, nil); err != nil {
			return d, err
		}
		if err := workdir.Symlink(parent.Workdir, rel, d.host); err != nil {
			os.Remove(d.host)
			return d, fmt.Errorf("the child's workdir: %w", err)
		}
	}
	if snapshot == nil {
		return d, nil
	}
	err := workdir.Copy(parent.Workdir, d.host, *snapshot, containment.ChildrenRoot)
	if err == nil {
		return d, nil
	}
	if rerr := b.removeChildWorkdir(parent, d); rerr != nil {
		b.cfg.Logger.Warn("removing a child's workdir whose snapshot failed", "parent", parent.ID, "dir", d.host, "err", rerr)
	}
	if le := (*workdir.LimitError)(nil); errors.As(err, &le) {
		key, limit := "capabilities.resources.workdir_max_bytes", "resources.workdir_max_bytes"
		if le.Inodes {
			key, limit = "capabilities.resources.workdir_max_inodes", "resources.workdir_max_inodes"
		}
		return d, &spawn.Refusal{Reason: spawn.ReasonEnvelope, Key: key,
			Msg: fmt.Sprintf("the copy of the workdir for spawn.workdir_snapshot outgrew the room left under %s while it was made (the workdir grew meanwhile), and was removed: %v", limit, err)}
	}
	return d, fmt.Errorf("copying the parent's workdir for the child: %w", err)
}

// removeChildWorkdir undoes childWorkdir: the child's directory and, for a parent without
// a sealed root, the link to it in the parent's workdir, removed beneath its directory.
func (b *Backend) removeChildWorkdir(parent *store.Record, d childDir) error {
	err := workdir.RemoveAll(d.host)
	if parent.Achieved == manifest.Sealed.String() {
		return err
	}
	dir, oerr := workdir.OpenDir(parent.Workdir, filepath.Dir(d.rel), true)
	if oerr != nil {
		return errors.Join(err, oerr)
	}
	defer dir.Close()
	if uerr := unix.Unlinkat(int(dir.Fd()), filepath.Base(d.rel), 0); uerr != nil && !errors.Is(uerr, unix.ENOENT) {
		return errors.Join(err, fmt.Errorf("%s: %w", d.rel, uerr))
	}
	return err
}

// snapshotFits refuses a snapshot spawn whose copy would take the parent past its
// resources.workdir_max_bytes or workdir_max_inodes, and returns the room the copy may take.
// A child's workdir is charged to its parent, and the copy is roostd's own doing, made at
// once: the guard would only see it once it had landed, so it is judged before it is made.
// Bytes are allocated bytes, as the guard counts them: a sparse file costs what it holds,
// and the copy, which leaves holes holes, takes that much.
func (b *Backend) snapshotFits(parent *store.Record, pp *manifest.Policy) (workdir.Limits, error) {
	lim := workdir.Limits{Bytes: pp.Resources.WorkdirMaxBytes.Value, Inodes: pp.Resources.WorkdirMaxInodes.Value}
	roots, what := b.s.WorkdirRoots(parent)
	// Every measure stops past lim: the parts are within the whole, and a whole past it is
	// refused as it is.
	held, err := workdir.Measure(roots, lim)
	if err != nil {
		return workdir.Limits{}, fmt.Errorf("measuring the parent's workdir for a snapshot: %w", err)
	}
	var whole, kids workdir.Usage
	if !held.Past(lim) {
		// The copy is the workdir without its .roost (the children's workdirs, or links to
		// them), every name of a file with several links a file of its own.
		if whole, err = workdir.Measure([]string{parent.Workdir}, lim); err != nil {
			return workdir.Limits{}, fmt.Errorf("measuring the parent's workdir for a snapshot: %w", err)
		}
		kids, _ = workdir.Measure([]string{filepath.Join(parent.Workdir, containment.ChildrenRoot)}, lim)
	}
	return snapshotRoom(held, whole, kids, lim, what)
}

// snapshotRoom decides a snapshot from what the parent's trees hold (held), its workdir
// (whole) and the children's part of it (kids), against lim; it returns what is left of lim
// for the copy.
func snapshotRoom(held, whole, kids workdir.Usage, lim workdir.Limits, what string) (workdir.Limits, error) {
	if held.Past(lim) {
		// The guard ends the parent at its next look; no copy meanwhile.
		key, msg := "capabilities.resources.workdir_max_bytes", fmt.Sprintf("%s hold more than %d bytes already, past resources.workdir_max_bytes (%d): no copy of the workdir fits", what, held.Bytes, lim.Bytes)
		if held.Bytes <= lim.Bytes {
			key, msg = "capabilities.resources.workdir_max_inodes", fmt.Sprintf("%s hold more than %d files and directories already, past resources.workdir_max_inodes (%d): no copy of the workdir fits", what, held.Inodes, lim.Inodes)
		}
		return workdir.Limits{}, &spawn.Refusal{Reason: spawn.ReasonEnvelope, Key: key, Msg: msg}
	}
	copyBytes := whole.Bytes + whole.LinkBytes - kids.Bytes - kids.LinkBytes
	copyInodes := whole.Inodes + whole.LinkNames - kids.Inodes - kids.LinkNames
	if after := held.Bytes + copyBytes; lim.Bytes > 0 && after > lim.Bytes {
		return workdir.Limits{}, &spawn.Refusal{Reason: spawn.ReasonEnvelope, Key: "capabilities.resources.workdir_max_bytes",
			Msg: fmt.Sprintf("a copy of the workdir for spawn.workdir_snapshot (%d bytes allocated) would take %s from %d to %d bytes, past resources.workdir_max_bytes (%d); the children's workdirs count against their parent's",
				copyBytes, what, held.Bytes, after, lim.Bytes)}
	}
	if after := held.Inodes + copyInodes; lim.Inodes > 0 && after > lim.Inodes {
		return workdir.Limits{}, &spawn.Refusal{Reason: spawn.ReasonEnvelope, Key: "capabilities.resources.workdir_max_inodes",
			Msg: fmt.Sprintf("a copy of the workdir for spawn.workdir_snapshot (%d files and directories) would take %s from %d to %d, past resources.workdir_max_inodes (%d); the children's workdirs count against their parent's",
				copyInodes, what, held.Inodes, after, lim.Inodes)}
	}
	// Past the checks, what is left is at least the copy. A room of 0 would be no bound to
	// Copy: where nothing is left (a workdir that allocates nothing, on tmpfs), 1 is.
	var room workdir.Limits
	if lim.Bytes > 0 {
		room.Bytes = max(lim.Bytes-held.Bytes, 1)
	}
	if lim.Inodes > 0 {
		room.Inodes = max(lim.Inodes-held.Inodes, 1)
	}
	return room, nil
}

// childInfo is a child as its parent sees it.
func childInfo(parent, c *store.Record) spawn.ChildInfo {
	rel, err := filepath.Rel(parent.Workdir, c.Workdir)
	if err != nil || parent.Achieved != manifest.Sealed.String() {
		rel = filepath.Join(containment.ChildrenRoot, "children", strings.TrimPrefix(filepath.Base(c.Workdir), "child-"))
	}
	return spawn.ChildInfo{
		SessionID:  c.ID,
		Capsule:    c.Capsule.Name + "@" + c.Capsule.Version,
		State:      string(c.State),
		ExitStatus: string(c.ExitStatus),
		ExitCode:   c.ExitCode,
		Detail:     c.Detail,
		Workdir:    rel,
	}
}

// ownChild returns the child childID of parentID; any other id, existing or not, is the
// same not-found, so a session learns nothing of sessions that are not its children.
func (b *Backend) ownChild(parentID, childID string) (*store.Record, *store.Record, error) {
	parent, err := b.liveRecord(parentID)
	if err != nil {
		return nil, nil, err
	}
	c, _ := b.s.Record(childID)
	if c == nil || c.ParentID != parentID {
		return nil, nil, fmt.Errorf("no child %q: %w", childID, errdefs.ErrNotFound)
	}
	return parent, c, nil
}

// Children lists the session's own children.
func (b *Backend) Children(parentID string) ([]spawn.ChildInfo, error) {
	parent, err := b.liveRecord(parentID)
	if err != nil {
		return nil, err
	}
	kids, err := b.s.Children(parentID)
	if err != nil {
		return nil, err
	}
	out := make([]spawn.ChildInfo, 0, len(kids))
	for _, c := range kids {
		out = append(out, childInfo(parent, c))
	}
	return out, nil
}

// Child returns one of the session's own children.
func (b *Backend) Child(parentID, childID string) (spawn.ChildInfo, error) {
	parent, c, err := b.ownChild(parentID, childID)
	if err != nil {
		return spawn.ChildInfo{}, err
	}
	return childInfo(parent, c), nil
}

// WaitChild blocks until the child and its own children have ended and returns its completion.
func (b *Backend) WaitChild(ctx context.Context, parentID, childID string) (spawn.Completion, error) {
	if _, _, err := b.ownChild(parentID, childID); err != nil {
		return spawn.Completion{}, err
	}
	c, err := b.s.Wait(ctx, childID)
	if err != nil {
		return spawn.Completion{}, err
	}
	return Completion(c), nil
}

// StopChild stops one of the session's children and returns its completion.
func (b *Backend) StopChild(ctx context.Context, parentID, childID string) (spawn.Completion, error) {
	if _, _, err := b.ownChild(parentID, childID); err != nil {
		return spawn.Completion{}, err
	}
	c, err := b.s.Stop(ctx, childID, b.cfg.StopGrace, "")
	if err != nil {
		return spawn.Completion{}, err
	}
	return Completion(c), nil
}

// Completion is how a child ended, as its parent reads it.
func Completion(rec *store.Record) spawn.Completion {
	c := spawn.Completion{
		SessionID: rec.ID,
		Capsule:   rec.Capsule.Name + "@" + rec.Capsule.Version,
		Status:    string(rec.ExitStatus),
		ExitCode:  rec.ExitCode,
		Detail:    rec.Detail,
		EndedAt:   rec.EndedAt,
	}
	if !rec.StartedAt.IsZero() && !rec.EndedAt.IsZero() {
		c.DurationMS = rec.EndedAt.Sub(rec.StartedAt).Milliseconds()
	}
	return c
}
