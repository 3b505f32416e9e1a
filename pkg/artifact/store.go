package artifact

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/manifest"
)

// Store keeps pushed capsules as name@version, content-addressed by their tree's digest:
// each is an immutable copy under blobs/sha256/<hex>, and the refs naming them live in a
// bbolt file of the store's own. A name@version, once pushed, names one digest until it is
// removed (Remove); a push never changes what it names.
//
//	<dir>/refs.db               bucket "refs": "name@version" → Artifact as JSON (0600)
//	<dir>/blobs/sha256/<hex>/   a tree, as imported: root's, modes normalised (see DigestDir)
//
// Sessions running as other users read their capsule from its blob: <dir>, blobs and
// blobs/sha256 are 0711, so a blob is reached by whoever knows its digest, and the store
// cannot be listed.
type Store struct {
	db    *bolt.DB
	blobs string
	lim   limits
	// mu is shared by imports and pushes and taken alone by Collect, which must not remove
	// the temporary tree an import is filling, nor a blob a push stored and has not named yet.
	mu sync.RWMutex
}

// Artifact is one pushed capsule.
type Artifact struct {
	Name     string    `json:"name"`
	Version  string    `json:"version"`
	SHA256   string    `json:"sha256"`
	PushedAt time.Time `json:"pushed_at"`
	Files    int       `json:"files"`
	Bytes    int64     `json:"bytes"`
}

// Ref is the artifact's name@version.
func (a Artifact) Ref() string { return a.Name + "@" + a.Version }

var bucketRefs = []byte("refs")

const (
	storeDirMode = 0o711
	refsMode     = 0o600
)

// Temporary trees in blobs/sha256: the prefixes no blob name (hex) can have.
var tempPrefixes = []string{".import-", ".push-", ".collect-"}

// Open opens (creating when absent) the store under dir, and gives its directories the modes
// the store needs whatever an older roostd left.
func Open(dir string) (*Store, error) {
	s := &Store{blobs: filepath.Join(dir, "blobs", "sha256"), lim: defaultLimits}
	if err := os.MkdirAll(s.blobs, storeDirMode); err != nil {
		return nil, err
	}
	for _, d := range []string{dir, filepath.Dir(s.blobs), s.blobs} {
		if err := os.Chmod(d, storeDirMode); err != nil {
			return nil, err
		}
	}
	refs := filepath.Join(dir, "refs.db")
	db, err := bolt.Open(refs, refsMode, &bolt.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("the artifact store %s is held by another process: another roostd is using this state directory", dir)
		}
		return nil, err
	}
	if err := os.Chmod(refs, refsMode); err != nil {
		db.Close()
		return nil, err
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketRefs)
		return err
	}); err != nil {
		db.Close()
		return nil, err
	}
	s.db = db
	return s, nil
}

// Close closes the store's refs file.
func (s *Store) Close() error { return s.db.Close() }

var refRE = regexp.MustCompile(`^([a-z0-9][a-z0-9-]*)@([0-9A-Za-z.+-]+)$`)

// ParseRef reads "name@version"; ok is false for anything else (a path, say).
func ParseRef(ref string) (name, version string, ok bool) {
	m := refRE.FindStringSubmatch(ref)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// Push stores the capsule in dir under its manifest's name@version. Pushing the same bytes
// again is a no-op (created is false); different bytes under a pushed name@version are
// refused: a version names one capsule for ever. The manifest read is the one hashed and
// stored; a tree that changes while it is pushed is refused (ErrAborted).
func (s *Store) Push(dir string) (a Artifact, created bool, err error) {
	label := "capsule " + dir
	s.mu.RLock()
	defer s.mu.RUnlock()
	root, err := openTree(dir, label)
	if err != nil {
		return a, false, err
	}
	defer root.Close()
	t, err := hashTree(root, label, s.lim)
	if err != nil {
		return a, false, err
	}
	if t.manifest == nil {
		return a, false, fmt.Errorf("%s: no %s at its top (a symlink is not one): %w", label, manifest.FileName, errdefs.ErrInvalidArgument)
	}
	m, err := manifest.Parse(t.manifest, filepath.Join(dir, manifest.FileName))
	if err != nil {
		return a, false, err
	}
	if prev, err := s.Resolve(m.Ref()); err == nil {
		if prev.SHA256 == t.digest {
			return prev, false, nil
		}
		return a, false, fmt.Errorf("%s is already pushed as %s; this directory is %s: give it a new version: %w",
			m.Ref(), prev.SHA256, t.digest, errdefs.ErrAlreadyExists)
	}
	if err := s.storeAs(root, label, t.digest); err != nil {
		return a, false, err
	}
	a = Artifact{Name: m.Name, Version: m.Version, SHA256: t.digest, PushedAt: time.Now().UTC(), Files: t.files, Bytes: t.bytes}
	data, _ := json.Marshal(a)
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRefs)
		// Another push of the same name@version may have won the race.
		if v := b.Get([]byte(a.Ref())); v != nil {
			var won Artifact
			if json.Unmarshal(v, &won) == nil && won.SHA256 != t.digest {
				return fmt.Errorf("%s was pushed as %s meanwhile: %w", a.Ref(), won.SHA256, errdefs.ErrAlreadyExists)
			}
			return nil
		}
		return b.Put([]byte(a.Ref()), data)
	})
	if err != nil {
		return Artifact{}, false, err
	}
	return a, true, nil
}

// storeAs makes sure the blob digest, which the manifest and refs were checked against, is
// stored: copied from root unless it is there already. The copy must hash to digest: a push
// decides on the bytes of its first read.
func (s *Store) storeAs(root *os.File, label, digest string) error {
	if s.has(digest) {
		return nil
	}
	t, tmp, err := s.copyIn(root, label, ".push-")
	if tmp != "" {
		defer os.RemoveAll(tmp)
	}
	if err != nil {
		return err
	}
	if t.digest != digest {
		return fmt.Errorf("%s: changed while it was read (%s, then %s); push it again: %w", label, digest, t.digest, errdefs.ErrAborted)
	}
	_, err = s.settle(tmp, digest)
	return err
}

// Imported is a tree an Import stored.
type Imported struct {
	SHA256 string // "sha256:<hex>", the digest of the bytes stored
	Dir    string // the blob: blobs/sha256/<hex>
	Files  int    // regular files
	Bytes  int64  // their bytes
	// Created is whether this import stored the blob; false when it was there already.
	Created bool
	// Manifest is the top-level capsule.yaml as read and stored (at most one byte over
	// manifest.MaxSize), nil when the tree has none, or a symlink there: the caller reads
	// the capsule's manifest from here, not by a path into the blob, which could follow a
	// link the tree's owner stored.
	Manifest []byte
}

// Import stores the tree in dir as a blob named by its digest, and returns it. The tree is
// read by descriptors and copied from the very reads hashed, so the digest names the bytes
// stored, whatever a program owning dir does meanwhile. A tree whose blob is stored already
// is only hashed, not copied. Import names the blob nowhere: until the caller's keep claims
// it, Collect would remove it (see Collect).
func (s *Store) Import(dir string) (Imported, error) {
	label := "capsule " + dir
	s.mu.RLock()
	defer s.mu.RUnlock()
	root, err := openTree(dir, label)
	if err != nil {
		return Imported{}, err
	}
	defer root.Close()
	t, err := hashTree(root, label, s.lim)
	if err != nil {
		return Imported{}, err
	}
	if s.has(t.digest) {
		return s.imported(t, false), nil
	}
	// The tree may change between the two reads: the blob is named by the copy's own hash.
	t, tmp, err := s.copyIn(root, label, ".import-")
	if tmp != "" {
		defer os.RemoveAll(tmp)
	}
	if err != nil {
		return Imported{}, err
	}
	created, err := s.settle(tmp, t.digest)
	if err != nil {
		return Imported{}, err
	}
	return s.imported(t, created), nil
}

func (s *Store) imported(t tree, created bool) Imported {
	return Imported{SHA256: t.digest, Dir: s.blobDir(t.digest), Files: t.files, Bytes: t.bytes, Created: created, Manifest: t.manifest}
}

// copyIn copies the tree under root into tmp/tree, tmp being a fresh directory in blobs
// (returned even on error, for the caller to remove), hashing the bytes it writes.
func (s *Store) copyIn(root *os.File, label, prefix string) (t tree, tmp string, err error) {
	tmp, err = os.MkdirTemp(s.blobs, prefix)
	if err != nil {
		return t, "", err
	}
	parent, err := os.Open(tmp)
	if err != nil {
		return t, tmp, err
	}
	defer parent.Close()
	dst, err := mkdirAt(parent, "tree")
	if err != nil {
		return t, tmp, err
	}
	defer dst.Close()
	t, err = walkTree(root, dst, label, s.lim)
	return t, tmp, err
}

// settle moves the copy in tmp to the blob of digest; when that blob exists already, the
// copy is left for the caller to remove (blobs are immutable: same name, same bytes).
func (s *Store) settle(tmp, digest string) (created bool, err error) {
	from, to := filepath.Join(tmp, "tree"), s.blobDir(digest)
	err = unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) {
		// A filesystem without RENAME_NOREPLACE. rename(2) replaces no directory that
		// holds anything, and an empty one it replaces is the same empty tree.
		err = os.Rename(from, to)
	}
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EEXIST), errors.Is(err, unix.ENOTEMPTY):
		return false, nil
	}
	return false, fmt.Errorf("storing blob %s: %w", digest, err)
}

func (s *Store) has(digest string) bool {
	info, err := os.Lstat(s.blobDir(digest))
	return err == nil && info.IsDir()
}

// Collect removes every blob that no ref names and keep (given "sha256:<hex>"; nil keeps
// nothing) does not claim, and every temporary tree a failed import or push left. It
// returns how many blobs it removed.
//
// Collect runs alone against this Store's Import and Push, but a blob an Import returned
// is named by nothing until the caller's keep claims it: the caller (the session manager)
// must serialise Collect against its own imports.
func (s *Store) Collect(keep func(sha256 string) bool) (removed int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	refs, err := s.List()
	if err != nil {
		return 0, err
	}
	named := make(map[string]bool, len(refs))
	for _, a := range refs {
		named[a.SHA256] = true
	}
	entries, err := os.ReadDir(s.blobs)
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if slices.ContainsFunc(tempPrefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			errs = append(errs, os.RemoveAll(filepath.Join(s.blobs, name)))
			continue
		}
		digest := "sha256:" + name
		if !blobName.MatchString(name) || named[digest] || keep != nil && keep(digest) {
			continue
		}
		if err := s.remove(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

var blobName = regexp.MustCompile(`^[0-9a-f]{64}$`)

// remove takes a blob out of the store at once (a rename), then deletes it: no import ever
// finds a blob half removed.
func (s *Store) remove(name string) error {
	tmp, err := os.MkdirTemp(s.blobs, ".collect-")
	if err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(s.blobs, name), filepath.Join(tmp, name)); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.RemoveAll(tmp)
}

// Resolve looks a name@version up.
func (s *Store) Resolve(ref string) (Artifact, error) {
	var a Artifact
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketRefs).Get([]byte(ref))
		if v == nil {
			return fmt.Errorf("no capsule %s has been pushed (roostctl push DIR): %w", ref, errdefs.ErrNotFound)
		}
		return json.Unmarshal(v, &a)
	})
	return a, err
}

// Remove forgets a pushed name@version and returns what it named. Only the ref goes: its
// tree is a blob like any session's copy, which sessions staged from the ref run from
// (Session.capsule.dir), so removing it here would pull it from under them. Collect, which
// the session manager runs with the digests its sessions record, deletes the blob once no
// session records it and no other ref names it. A later push may name other bytes
// name@version: the sessions that ran the old ones recorded their digest.
func (s *Store) Remove(ref string) (Artifact, error) {
	if _, _, ok := ParseRef(ref); !ok {
		return Artifact{}, fmt.Errorf("%q is not a pushed capsule's name@version (e.g. worker@0.1.0): %w", ref, errdefs.ErrInvalidArgument)
	}
	var a Artifact
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRefs)
		v := b.Get([]byte(ref))
		if v == nil {
			return fmt.Errorf("no capsule %s has been pushed (roostctl artifacts lists those that have): %w", ref, errdefs.ErrNotFound)
		}
		// A damaged entry is still removable: the ref is what the operator wants gone.
		if err := json.Unmarshal(v, &a); err != nil {
			a = Artifact{}
		}
		return b.Delete([]byte(ref))
	})
	if err != nil {
		return Artifact{}, err
	}
	if a.Name == "" {
		a.Name, a.Version, _ = ParseRef(ref)
	}
	return a, nil
}

// Dir is where an artifact's tree is.
func (s *Store) Dir(a Artifact) string { return s.blobDir(a.SHA256) }

// List returns every artifact, by name@version.
func (s *Store) List() ([]Artifact, error) {
	var out []Artifact
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRefs).ForEach(func(_, v []byte) error {
			var a Artifact
			if err := json.Unmarshal(v, &a); err != nil {
				return err
			}
			out = append(out, a)
			return nil
		})
	})
	return out, err
}

func (s *Store) blobDir(digest string) string {
	return filepath.Join(s.blobs, strings.TrimPrefix(digest, "sha256:"))
}
