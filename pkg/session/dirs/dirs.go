// Package dirs says where a session's files live on the host, beneath the state directory,
// and who owns them: its records, its workdir (roost's own or an operator's, lent and
// handed back), its home and its children's workdirs. It makes, lends and sweeps those
// trees; it reads the record but writes it only through Save. roostd makes each tree a
// nosuid,nodev mount of its own on the host (Seal), so nothing a session leaves there runs
// setuid or opens a device for whoever on the host comes across it.
//
// Where a session's workdir is given to its uid, and handed back:
//
// A session's processes run as an unprivileged uid of their own (a sealed session's root is
// that uid on the host), so the workdir must be theirs: roost makes its own workdirs owned by
// the session; an operator's --workdir is re-owned when the session launches and handed back
// to its owner when the session is removed; a child's workdir is the child's, in its
// parent's group, so the parent can read what the child leaves (and nobody else).
package dirs

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"roost.dev/roost/pkg/config"
	"roost.dev/roost/pkg/session/store"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/workdir"
)

// Dirs are the session trees beneath one state directory.
type Dirs struct {
	State string
	// IDs is the block sessions' ranges come from: what a session owns and an operator's
	// files do not.
	IDs store.IDPool
	// Save records what lending a workdir learnt of its owner; Group is the gid a child's
	// workdir is given (its parent's).
	Save  func(*store.Record) error
	Group func(parentID string) (int, error)
	// Scoped is the scoped runtime, which keeps each scoped session's TMPDIR; nil without.
	Scoped interface{ TmpDir(string) string }
}

// Sub-directories of the state directory. ChildrenDir holds, per parent without a sealed
// root, the workdirs of its children: one directory per parent, which that parent's
// Landlock rules name at its launch.
const (
	WorkDir     = "work"
	RecordsDir  = "records"
	HomesDir    = "home"
	ChildrenDir = "children"
	// ViewsDir holds sealed sessions' views of the system trees, one per closure (see
	// package sysview); a view is links to the host's files, never the session's.
	ViewsDir = "views"
)

// Views is where sealed sessions' views of the system trees are built.
func (t Dirs) Views() string { return filepath.Join(t.State, ViewsDir) }

// Records is the session's records directory.
func (t Dirs) Records(id string) string { return filepath.Join(t.State, RecordsDir, id) }

// Workdir is the workdir roost makes for a session that names none.
func (t Dirs) Workdir(id string) string { return filepath.Join(t.State, WorkDir, id) }

// childDirMode: the child owns it; its parent's group may read it; files made in it take
// that group.
const childDirMode = 0o750 | fs.ModeSetgid

// PrepareWorkdir makes the session's workdir and gives it to the session's ids.
func (t Dirs) PrepareWorkdir(rec *store.Record) error {
	if rec.HostRoot || rec.IDs == nil {
		return os.MkdirAll(rec.Workdir, 0o700)
	}
	owner := workdir.Owner{UID: int(rec.IDs.First), GID: int(rec.IDs.First)}
	switch {
	case rec.OwnsWorkdir && rec.ParentID != "":
		// Made by roost at the spawn (a snapshot may have filled it); the child's, in its
		// parent's group.
		group, err := t.Group(rec.ParentID)
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
func (t Dirs) lendWorkdir(rec *store.Record, owner workdir.Owner) error {
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
		if err := t.Save(rec); err != nil {
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

// ReturnWorkdir hands an operator's workdir back to its owner: whatever the session's ids
// own there becomes the owner's again.
func (t Dirs) ReturnWorkdir(rec *store.Record) error {
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
func (t Dirs) heldBySession(uid int) bool {
	pool := t.IDs
	return uint64(uid) >= uint64(pool.First) && uint64(uid) < uint64(pool.First)+uint64(pool.Slots)*uint64(config.IDsPerSession)
}

// Home is the session's home: its own, apart from the workdir so that what tools cache
// there (a module cache, a build cache, shell history) stays out of the work. It counts
// with the workdir against resources.workdir_max_bytes and workdir_max_inodes (pkg/session/guard),
// and goes when the session is removed.
func (t Dirs) Home(id string) string { return filepath.Join(t.State, HomesDir, id) }

// PrepareHome makes the session's home, its uid's.
func (t Dirs) PrepareHome(rec *store.Record) error {
	owner := &workdir.Owner{}
	if rec.IDs != nil && !rec.HostRoot {
		owner = &workdir.Owner{UID: int(rec.IDs.First), GID: int(rec.IDs.First)}
	}
	return workdir.MkdirAll(t.State, filepath.Join(HomesDir, rec.ID), 0o700, owner)
}

// ChildrenDirs lists where a session's children work outside its workdir: for a parent
// without a sealed root that may spawn, its directory under children/; none otherwise (a
// sealed parent's children work beneath its workdir).
func (t Dirs) ChildrenDirs(rec *store.Record, class manifest.Class, p *manifest.Policy) []string {
	if len(p.Spawn.Allow) == 0 || class == manifest.Sealed {
		return nil
	}
	return []string{t.Children(rec.ID)}
}

// Children is where the children of a parent without a sealed root work. Its parent's
// workdir guard counts it, and removing the parent removes it.
func (t Dirs) Children(parentID string) string {
	return filepath.Join(t.State, ChildrenDir, parentID)
}

// PrepareChildrenDir makes the directory a parent's children work in when it has no sealed
// root: root's, readable by the parent's group only.
func (t Dirs) PrepareChildrenDir(rec *store.Record) error {
	group := 0
	if rec.IDs != nil {
		group = int(rec.IDs.First)
	}
	if err := workdir.MkdirAll(t.State, filepath.Join(ChildrenDir, rec.ID), 0o750, &workdir.Owner{UID: 0, GID: group}); err != nil {
		return fmt.Errorf("the directory of its children's workdirs: %w", err)
	}
	return nil
}

// Tmp is a scoped session's TMPDIR on the host; "" for other classes (a sealed
// session's /tmp is a tmpfs of bounded size; advisory and unconfined sessions share the
// host's).
func (t Dirs) Tmp(rec *store.Record) string {
	if rec.Achieved != manifest.Scoped.String() {
		return ""
	}
	if t.Scoped == nil {
		return ""
	}
	return t.Scoped.TmpDir(rec.ID)
}

// Sweep removes the records, workdirs and homes of sessions the registry does not know.
func (t Dirs) Sweep(known func(id string) bool, log *slog.Logger) error {
	for _, sub := range []string{RecordsDir, WorkDir, HomesDir} {
		entries, err := os.ReadDir(filepath.Join(t.State, sub))
		if err != nil {
			return err
		}
		for _, e := range entries {
			if !e.IsDir() || known(e.Name()) || !IsSessionID(e.Name()) {
				continue
			}
			path := filepath.Join(t.State, sub, e.Name())
			log.Info("removing leftover", "path", path)
			if err := os.RemoveAll(path); err != nil {
				log.Warn("removing leftover", "path", path, "err", err)
			}
		}
	}
	return nil
}

// Prepare makes the state directory and the parts sessions reach into; session.Open does
// it, and a daemon that builds runtimes under the directory first does it before them. Sessions run
// as unprivileged uids that must pass through to their own workdir, TMPDIR, task text and
// capsule, so those directories let others search them (0711) but never list them, and
// everything in them is owned by the one session it belongs to; the registry, the ledger,
// the key and the records are root's alone (0600/0700).
func Prepare(dir string) error {
	// A directory others may write in (/tmp, a shared scratch tree) is not roostd's to
	// take over: making it 0711 would lock every other user out of it.
	if info, err := os.Stat(dir); err == nil && info.IsDir() && (info.Mode().Perm()&0o002 != 0 || info.Mode()&os.ModeSticky != 0) {
		return fmt.Errorf("state directory %s is writable by others (mode %s): give roostd a directory of its own, e.g. %s/roost: %w", dir, info.Mode(), dir, errdefs.ErrInvalidArgument)
	}
	for _, d := range []string{dir, filepath.Join(dir, WorkDir), filepath.Join(dir, RecordsDir), filepath.Join(dir, ChildrenDir), filepath.Join(dir, HomesDir)} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return fmt.Errorf("state directory: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return fmt.Errorf("state directory: %w", err)
		}
	}
	// A session reaches its workdir by its absolute path (HOME, TMPDIR): every directory
	// above the state directory must let it pass.
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		info, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("state directory: %w", err)
		}
		if info.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("state directory %s: %s (mode %04o) does not let others pass through it, and sessions run as unprivileged uids that must reach their workdirs beneath it: chmod o+x %s, or choose another --state-dir: %w",
				dir, d, info.Mode().Perm(), d, errdefs.ErrFailedPrecondition)
		}
		if d == "/" {
			return nil
		}
	}
}

// IsSessionID says whether a name is a session id (ses_ and 32 hex digits).
func IsSessionID(s string) bool {
	if len(s) != len("ses_")+32 || s[:4] != "ses_" {
		return false
	}
	for _, c := range s[4:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
