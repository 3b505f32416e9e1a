package session

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"roost.dev/roost/pkg/session/store"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/workdir"
)

// Where a session's workdir is given to its uid, and handed back.
//
// A session's processes run as an unprivileged uid of their own (a sealed session's root is
// that uid on the host), so the workdir must be theirs: roost makes its own workdirs owned by
// the session; an operator's --workdir is re-owned when the session launches and handed back
// to its owner when the session is removed; a child's workdir is the child's, in its
// parent's group, so the parent can read what the child leaves (and nobody else).

// trees is where a session's files live on the host, beneath the state directory, and who
// owns them: its records, its workdir (roost's own or an operator's, lent), its home and
// its children's workdirs.
type trees struct {
	state string
	// ids is the block sessions' ranges come from: what a session owns and an operator's
	// files do not.
	ids store.IDPool
	// save records what lending a workdir learnt of its owner; group is the gid a child's
	// workdir is given (its parent's).
	save  func(*store.Record) error
	group func(parentID string) (int, error)
	// scoped is the scoped runtime, which keeps each scoped session's TMPDIR; nil without.
	scoped interface{ TmpDir(string) string }
}

// Sub-directories of the state directory.
const (
	workDir    = "work"
	recordsDir = "records"
	homesDir   = "home"
)

func (t trees) records(id string) string { return filepath.Join(t.state, recordsDir, id) }

// childrenDir holds, per parent without a sealed root, the workdirs of its children: one
// directory per parent, which that parent's Landlock rules name at its launch.
const childrenDir = "children"

// childDirMode: the child owns it; its parent's group may read it; files made in it take
// that group.
const childDirMode = 0o750 | fs.ModeSetgid

// prepareWorkdir makes the session's workdir and gives it to the session's ids.
func (t trees) prepareWorkdir(rec *store.Record) error {
	if rec.HostRoot || rec.IDs == nil {
		return os.MkdirAll(rec.Workdir, 0o700)
	}
	owner := workdir.Owner{UID: int(rec.IDs.First), GID: int(rec.IDs.First)}
	switch {
	case rec.OwnsWorkdir && rec.ParentID != "":
		// Made by roost at the spawn (a snapshot may have filled it); the child's, in its
		// parent's group.
		group, err := t.group(rec.ParentID)
		if err != nil {
			return err
		}
		owner.GID = group
		if err := workdir.Chown(rec.Workdir, owner, nil); err != nil {
			return err
		}
		return os.Chmod(rec.Workdir, childDirMode)
	case rec.OwnsWorkdir:
		if err := os.Mkdir(rec.Workdir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		return workdir.Chown(rec.Workdir, owner, nil)
	default:
		return t.lendWorkdir(rec, owner)
	}
}

// lendWorkdir gives an operator's workdir to the session, recording who owned it first so
// Remove can hand it back. Only what that owner (or an earlier session) owns is re-owned,
// and never a file with several links: such a file may be somebody else's too.
func (t trees) lendWorkdir(rec *store.Record, owner workdir.Owner) error {
	if err := os.MkdirAll(rec.Workdir, 0o700); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(rec.Workdir, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("workdir %s is not a directory", rec.Workdir)
	}
	if rec.WorkdirOwner == nil {
		prev := &store.Owner{UID: int(st.Uid), GID: int(st.Gid)}
		if t.heldBySession(prev.UID) {
			// Left by a session that was never removed: the operator's tree is root's.
			prev = &store.Owner{}
		}
		rec.WorkdirOwner = prev
		if err := t.save(rec); err != nil {
			return err
		}
	}
	prev := *rec.WorkdirOwner
	return workdir.Chown(rec.Workdir, owner, func(st *unix.Stat_t) bool {
		if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
			return false
		}
		return int(st.Uid) == prev.UID || t.heldBySession(int(st.Uid))
	})
}

// returnWorkdir hands an operator's workdir back to its owner: whatever the session's ids
// own there becomes the owner's again.
func (t trees) returnWorkdir(rec *store.Record) error {
	if rec.OwnsWorkdir || rec.WorkdirOwner == nil || rec.IDs == nil {
		return nil
	}
	if _, err := os.Lstat(rec.Workdir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	first, size := uint64(rec.IDs.First), uint64(rec.IDs.Size)
	in := func(id uint32) bool { return uint64(id) >= first && uint64(id) < first+size }
	return workdir.Chown(rec.Workdir, workdir.Owner{UID: rec.WorkdirOwner.UID, GID: rec.WorkdirOwner.GID}, func(st *unix.Stat_t) bool {
		return in(st.Uid) || in(st.Gid)
	})
}

// heldBySession says whether uid falls in the block roostd hands sessions.
func (t trees) heldBySession(uid int) bool {
	pool := t.ids
	return uint64(uid) >= uint64(pool.First) && uint64(uid) < uint64(pool.First)+uint64(pool.Slots)*uint64(idsPerSession)
}

// home is the session's home: its own, apart from the workdir so that what tools cache
// there (a module cache, a build cache, shell history) stays out of the work. It counts
// with the workdir against resources.workdir_max_bytes and workdir_max_inodes (guard.go),
// and goes when the session is removed.
func (t trees) home(id string) string { return filepath.Join(t.state, homesDir, id) }

// prepareHome makes the session's home, its uid's.
func (t trees) prepareHome(rec *store.Record) error {
	owner := &workdir.Owner{}
	if rec.IDs != nil && !rec.HostRoot {
		owner = &workdir.Owner{UID: int(rec.IDs.First), GID: int(rec.IDs.First)}
	}
	return workdir.MkdirAll(t.state, filepath.Join(homesDir, rec.ID), 0o700, owner)
}

// childrenDirs lists where a session's children work outside its workdir: for a parent
// without a sealed root that may spawn, its directory under children/; none otherwise (a
// sealed parent's children work beneath its workdir).
func (t trees) childrenDirs(rec *store.Record, class manifest.Class, p *manifest.Policy) []string {
	if len(p.Spawn.Allow) == 0 || class == manifest.Sealed {
		return nil
	}
	return []string{t.children(rec.ID)}
}

// children is where the children of a parent without a sealed root work. Its parent's
// workdir guard counts it, and removing the parent removes it.
func (t trees) children(parentID string) string {
	return filepath.Join(t.state, childrenDir, parentID)
}

// prepareChildrenDir makes the directory a parent's children work in when it has no sealed
// root: root's, readable by the parent's group only.
func (t trees) prepareChildrenDir(rec *store.Record) error {
	group := 0
	if rec.IDs != nil {
		group = int(rec.IDs.First)
	}
	if err := workdir.MkdirAll(t.state, filepath.Join(childrenDir, rec.ID), 0o750, &workdir.Owner{UID: 0, GID: group}); err != nil {
		return fmt.Errorf("the directory of its children's workdirs: %w", err)
	}
	return nil
}

// tmp is a scoped session's TMPDIR on the host; "" for other classes (a sealed
// session's /tmp is a tmpfs of bounded size; advisory and unconfined sessions share the
// host's).
func (t trees) tmp(rec *store.Record) string {
	if rec.Achieved != manifest.Scoped.String() {
		return ""
	}
	if t.scoped == nil {
		return ""
	}
	return t.scoped.TmpDir(rec.ID)
}

// sweep removes the records, workdirs and homes of sessions the registry does not know.
func (t trees) sweep(known func(id string) bool, log *slog.Logger) error {
	for _, sub := range []string{recordsDir, workDir, homesDir} {
		entries, err := os.ReadDir(filepath.Join(t.state, sub))
		if err != nil {
			return err
		}
		for _, e := range entries {
			if !e.IsDir() || known(e.Name()) || !isSessionID(e.Name()) {
				continue
			}
			path := filepath.Join(t.state, sub, e.Name())
			log.Info("removing leftover", "path", path)
			if err := os.RemoveAll(path); err != nil {
				log.Warn("removing leftover", "path", path, "err", err)
			}
		}
	}
	return nil
}
