package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/workdir"
)

// The files of a session's workdir, for an operator: pkg/workdir does the work beneath
// the workdir; this is which workdir, whose its new files are, what writes may take, and
// whether the session may still be written to.

// sessionFiles is one session's workdir as the file operations see it.
type sessionFiles struct {
	rec  *store.Record
	root string
}

// filesOf resolves ref to its session and checks its workdir is there.
func (m *Manager) filesOf(ref string) (*sessionFiles, error) {
	rec, err := m.Get(ref)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(rec.Workdir, &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) && rec.State == store.Staged {
			return nil, fmt.Errorf("session %s: its workdir is made when it starts: %w", rec.ID, errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("session %s: workdir %s: %w", rec.ID, rec.Workdir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, fmt.Errorf("session %s: workdir %s is not a directory: %w", rec.ID, rec.Workdir, errdefs.ErrFailedPrecondition)
	}
	return &sessionFiles{rec: rec, root: rec.Workdir}, nil
}

// rel checks a path the caller gave, naming the session in the error.
func (f *sessionFiles) rel(p string) (string, error) {
	rel, err := workdir.CleanRel(p)
	if err != nil {
		return "", fmt.Errorf("session %s: %w", f.rec.ID, err)
	}
	return rel, nil
}

// owner is who the session's files belong to on the host: the first id of its range (a
// sealed session's root, any other session's program); nil for a session that runs as
// host root.
func (f *sessionFiles) owner() *workdir.Owner {
	if f.rec.HostRoot || f.rec.IDs == nil {
		return nil
	}
	return &workdir.Owner{UID: int(f.rec.IDs.First), GID: int(f.rec.IDs.First)}
}

// limits are the session's resources.workdir_max_bytes and workdir_max_inodes, and whether
// it may spawn (its children's trees are then charged to it).
func (m *Manager) limits(rec *store.Record) (workdir.Limits, bool, error) {
	_, p, err := m.reg.manifest(rec)
	if err != nil {
		return workdir.Limits{}, false, err
	}
	lim := workdir.Limits{Bytes: rec.WorkdirLimit, Inodes: p.Resources.WorkdirMaxInodes.Value}
	if lim.Bytes <= 0 {
		lim.Bytes = p.Resources.WorkdirMaxBytes.Value
	}
	if lim.Inodes <= 0 {
		lim.Inodes = manifest.DefaultWorkdirMaxInodes
	}
	return lim, len(p.Spawn.Allow) > 0, nil
}

// writable checks the session may be written to and takes its write turn, measuring what
// its trees hold (as its workdir guard does) for the budget of the write. done gives the
// turn back.
func (m *Manager) writable(ctx context.Context, f *sessionFiles) (b *workdir.Budget, done func(), err error) {
	switch f.rec.State {
	case store.Stopping, store.Exited:
		return nil, nil, fmt.Errorf("session %s has ended (%s): its workdir is read-only: %w", f.rec.ID, f.rec.State, errdefs.ErrFailedPrecondition)
	}
	lim, canSpawn, err := m.limits(f.rec)
	if err != nil {
		return nil, nil, err
	}
	done, err = m.writers.take(ctx, f.rec.ID)
	if err != nil {
		return nil, nil, err
	}
	roots, _ := m.guard.Roots(f.rec, canSpawn)
	used, err := workdir.Measure(roots, lim)
	if err != nil && !used.Past(lim) {
		done()
		return nil, nil, fmt.Errorf("session %s: measuring what its trees hold: %w", f.rec.ID, err)
	}
	return &workdir.Budget{Limit: lim, Used: used}, done, nil
}

// OpenFile opens a regular file of the session's workdir for reading.
func (m *Manager) OpenFile(ref, path string) (*os.File, unix.Stat_t, error) {
	f, err := m.filesOf(ref)
	if err != nil {
		return nil, unix.Stat_t{}, err
	}
	rel, err := f.rel(path)
	if err != nil {
		return nil, unix.Stat_t{}, err
	}
	return workdir.OpenRegular(f.root, rel)
}

// StatFile describes an entry of the session's workdir, a symlink as itself.
func (m *Manager) StatFile(ref, path string) (workdir.Entry, error) {
	f, err := m.filesOf(ref)
	if err != nil {
		return workdir.Entry{}, err
	}
	rel, err := f.rel(path)
	if err != nil {
		return workdir.Entry{}, err
	}
	return workdir.Lstat(f.root, rel)
}

// ListDir lists a page of a directory of the session's workdir (see workdir.ReadDir).
func (m *Manager) ListDir(ref, path string, cookie int64, n int) ([]workdir.Entry, int64, error) {
	f, err := m.filesOf(ref)
	if err != nil {
		return nil, 0, err
	}
	rel, err := f.rel(path)
	if err != nil {
		return nil, 0, err
	}
	return workdir.ReadDir(f.root, rel, cookie, n)
}

// DownloadTree writes a tar archive of an entry of the session's workdir to w, bounded by
// its resources.workdir_max_bytes and workdir_max_inodes (see workdir.WriteTar).
func (m *Manager) DownloadTree(ref, path string, w io.Writer) error {
	f, err := m.filesOf(ref)
	if err != nil {
		return err
	}
	rel, err := f.rel(path)
	if err != nil {
		return err
	}
	lim, _, err := m.limits(f.rec)
	if err != nil {
		return err
	}
	return workdir.WriteTar(w, f.root, rel, lim)
}

// RemoveFile removes an entry of a live or staged session's workdir.
func (m *Manager) RemoveFile(ctx context.Context, ref, path string, recursive bool) error {
	f, err := m.filesOf(ref)
	if err != nil {
		return err
	}
	rel, err := f.rel(path)
	if err != nil {
		return err
	}
	_, done, err := m.writable(ctx, f)
	if err != nil {
		return err
	}
	defer done()
	return workdir.Remove(f.root, rel, recursive)
}

// MakeDir makes a directory in a live or staged session's workdir, the session's.
func (m *Manager) MakeDir(ctx context.Context, ref, path string, perm uint32, parents bool) error {
	f, err := m.filesOf(ref)
	if err != nil {
		return err
	}
	rel, err := f.rel(path)
	if err != nil {
		return err
	}
	b, done, err := m.writable(ctx, f)
	if err != nil {
		return err
	}
	defer done()
	return workdir.MakeDirs(f.root, rel, perm, parents, f.owner(), b)
}

// FileWrite is a file being written into a session's workdir; the session takes no other
// write until it is committed or aborted.
type FileWrite struct {
	*workdir.NewFile
	done func()
}

// Commit puts the file in place (see workdir.NewFile.Commit).
func (w *FileWrite) Commit() (unix.Stat_t, error) {
	defer w.done()
	return w.NewFile.Commit()
}

// Abort throws the file away.
func (w *FileWrite) Abort() {
	defer w.done()
	w.NewFile.Abort()
}

// CreateFile starts writing a regular file into a live or staged session's workdir, owned
// by the session and bounded by what its trees may still take.
func (m *Manager) CreateFile(ctx context.Context, ref, path string, perm uint32, createOnly bool) (*FileWrite, error) {
	f, err := m.filesOf(ref)
	if err != nil {
		return nil, err
	}
	rel, err := f.rel(path)
	if err != nil {
		return nil, err
	}
	b, done, err := m.writable(ctx, f)
	if err != nil {
		return nil, err
	}
	nf, err := workdir.CreateFile(f.root, rel, perm, createOnly, f.owner(), b)
	if err != nil {
		done()
		return nil, err
	}
	return &FileWrite{NewFile: nf, done: done}, nil
}

// UploadTree unpacks a tar archive into a directory of a live or staged session's workdir
// (see workdir.ReadTar), owned by the session and bounded by what its trees may still take.
func (m *Manager) UploadTree(ctx context.Context, ref, path string, r io.Reader) (workdir.Unpacked, error) {
	f, err := m.filesOf(ref)
	if err != nil {
		return workdir.Unpacked{}, err
	}
	rel, err := f.rel(path)
	if err != nil {
		return workdir.Unpacked{}, err
	}
	b, done, err := m.writable(ctx, f)
	if err != nil {
		return workdir.Unpacked{}, err
	}
	defer done()
	return workdir.ReadTar(r, f.root, rel, f.owner(), b)
}

// writerSet gives each session one write at a time: the budget of a write is measured
// when it starts, and two at once would each be allowed what only one may take.
type writerSet struct {
	mu   sync.Mutex
	turn map[string]chan struct{}
	// waiting counts, per session, the writes holding or waiting for its turn.
	waiting map[string]int
}

// take waits for the session's turn (or ctx) and returns what gives it back.
func (s *writerSet) take(ctx context.Context, id string) (func(), error) {
	s.mu.Lock()
	if s.turn == nil {
		s.turn, s.waiting = map[string]chan struct{}{}, map[string]int{}
	}
	ch, ok := s.turn[id]
	if !ok {
		ch = make(chan struct{}, 1)
		s.turn[id] = ch
	}
	s.waiting[id]++
	s.mu.Unlock()
	leave := func() {
		s.mu.Lock()
		if s.waiting[id]--; s.waiting[id] == 0 {
			delete(s.waiting, id)
			delete(s.turn, id)
		}
		s.mu.Unlock()
	}
	select {
	case ch <- struct{}{}:
		return func() {
			<-ch
			leave()
		}, nil
	case <-ctx.Done():
		leave()
		return nil, fmt.Errorf("session %s: waiting for the write before this one: %w", id, context.Cause(ctx))
	}
}
