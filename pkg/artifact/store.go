package artifact

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"roost.dev/roost/pkg/manifest"
)

// Store keeps pushed capsules as name@version, content-addressed by their tree's digest:
// each is an immutable copy under blobs/sha256/<hex>, and the refs naming them live in a
// bbolt file of the store's own. A name@version, once pushed, names one digest for ever.
//
//	<dir>/refs.db               bucket "refs": "name@version" → Artifact as JSON
//	<dir>/blobs/sha256/<hex>/   the capsule's tree, as pushed
type Store struct {
	db    *bolt.DB
	blobs string
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

// Open opens (creating when absent) the store under dir.
func Open(dir string) (*Store, error) {
	s := &Store{blobs: filepath.Join(dir, "blobs", "sha256")}
	if err := os.MkdirAll(s.blobs, 0o700); err != nil {
		return nil, err
	}
	db, err := bolt.Open(filepath.Join(dir, "refs.db"), 0o600, &bolt.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("the artifact store %s is held by another process: another roostd is using this state directory", dir)
		}
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
// refused: a version names one capsule for ever.
func (s *Store) Push(dir string) (a Artifact, created bool, err error) {
	raw, err := os.ReadFile(filepath.Join(dir, manifest.FileName))
	if err != nil {
		return a, false, fmt.Errorf("capsule %s: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	m, err := manifest.Parse(raw, filepath.Join(dir, manifest.FileName))
	if err != nil {
		return a, false, err
	}
	digest, err := DigestDir(dir)
	if err != nil {
		return a, false, fmt.Errorf("capsule %s: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	if prev, err := s.Resolve(m.Ref()); err == nil {
		if prev.SHA256 == digest {
			return prev, false, nil
		}
		return a, false, fmt.Errorf("%s is already pushed as %s; this directory is %s: give it a new version: %w",
			m.Ref(), prev.SHA256, digest, errdefs.ErrAlreadyExists)
	}
	files, size, err := s.storeBlob(dir, digest)
	if err != nil {
		return a, false, err
	}
	a = Artifact{Name: m.Name, Version: m.Version, SHA256: digest, PushedAt: time.Now().UTC(), Files: files, Bytes: size}
	data, _ := json.Marshal(a)
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRefs)
		// Another push of the same name@version may have won the race.
		if v := b.Get([]byte(a.Ref())); v != nil {
			var won Artifact
			if json.Unmarshal(v, &won) == nil && won.SHA256 != digest {
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

// storeBlob copies dir into the blob of digest, unless it is there already, and checks the
// copy hashes to digest (the source may have changed while it was read).
func (s *Store) storeBlob(dir, digest string) (files int, size int64, err error) {
	blob := s.blobDir(digest)
	tmp, err := os.MkdirTemp(s.blobs, ".push-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(tmp)
	copyDir := filepath.Join(tmp, "tree")
	if files, size, err = CopyTree(dir, copyDir); err != nil {
		return 0, 0, fmt.Errorf("copying %s: %w", dir, err)
	}
	got, err := DigestDir(copyDir)
	if err != nil {
		return 0, 0, err
	}
	if got != digest {
		return 0, 0, fmt.Errorf("%s changed while it was pushed; push it again: %w", dir, errdefs.ErrAborted)
	}
	if _, err := os.Stat(blob); err == nil {
		return files, size, nil
	}
	if err := os.Rename(copyDir, blob); err != nil && !errors.Is(err, fs.ErrExist) {
		return 0, 0, err
	}
	return files, size, nil
}

// CopyTree copies src to dst (which must not exist) keeping modes, copying symlinks as
// links and never following one; anything but files, directories and links is refused.
func CopyTree(src, dst string) (files int, size int64, err error) {
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch mode := info.Mode(); {
		case mode.IsDir():
			if err := os.Mkdir(target, mode.Perm()); err != nil {
				return err
			}
			// The mode is what DigestDir hashes; the umask must not change it.
			return os.Chmod(target, mode.Perm())
		case mode&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case mode.IsRegular():
			n, err := copyFile(path, target, mode.Perm())
			files++
			size += n
			return err
		default:
			return fmt.Errorf("%s: only files, directories and symlinks are copied, not %s", path, mode.Type())
		}
	})
	return files, size, err
}

func copyFile(src, dst string, perm fs.FileMode) (int64, error) {
	in, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, perm)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(dst, perm)
	}
	return n, err
}
