package artifact

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// A hostile program owning the pushed directory swaps a subdirectory (or a file) with a
// symlink to a directory (or file) of roostd's, as fast as it can, while roostd reads the
// tree. Whatever roostd stores must come from the tree: never the outside's bytes, and its
// digest must be the one of the bytes stored.

type hostile struct {
	tree   string
	a, b   string // the two entries exchanged, relative to tree
	marker string // the outside file's content
	// layout makes a copy of the tree in dir, in which the name a holds what a held at
	// first when aFirst (else the symlink b held), and likewise b when bFirst.
	layout func(dir, version string, aFirst, bFirst bool)
	refs   []string // the trees layout made for legit
}

func secret(t *testing.T) string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "OUTSIDE-SECRET-" + hex.EncodeToString(b[:])
}

// legit is every digest a walk of the tree may honestly give: each of the two names, read
// at its own moment, is either of the two things exchanged.
func (h *hostile) legit(t *testing.T, version string) []string {
	if h.refs == nil {
		for _, c := range [][2]bool{{true, false}, {false, true}, {true, true}, {false, false}} {
			ref := filepath.Join(t.TempDir(), "ref")
			h.layout(ref, version, c[0], c[1])
			h.refs = append(h.refs, ref)
		}
	}
	var out []string
	for _, ref := range h.refs {
		write(t, filepath.Join(ref, "capsule.yaml"), hostileManifest(version))
		d, err := DigestDir(ref)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// dirSwap: tree/sub is a directory holding data; tree/link points at outside/, which holds
// a file of the same name, so a walk following the link sees a tree of the same shape.
func dirSwap(t *testing.T) *hostile {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	h := &hostile{tree: filepath.Join(base, "tree"), a: "sub", b: "link", marker: secret(t)}
	write(t, filepath.Join(outside, "data"), h.marker)
	h.layout = func(dir, version string, subIsDir, linkIsDir bool) {
		write(t, filepath.Join(dir, "capsule.yaml"), hostileManifest(version))
		for name, isDir := range map[string]bool{"sub": subIsDir, "link": linkIsDir} {
			if isDir {
				write(t, filepath.Join(dir, name, "data"), "inside\n")
			} else if err := os.Symlink(outside, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.layout(h.tree, "0.1.0", true, false)
	return h
}

// fileSwap: tree/file is a regular file; tree/flink points at the outside file.
func fileSwap(t *testing.T) *hostile {
	base := t.TempDir()
	outside := filepath.Join(base, "outside", "data")
	h := &hostile{tree: filepath.Join(base, "tree"), a: "file", b: "flink", marker: secret(t)}
	write(t, outside, h.marker)
	h.layout = func(dir, version string, fileIsFile, linkIsFile bool) {
		write(t, filepath.Join(dir, "capsule.yaml"), hostileManifest(version))
		for name, isFile := range map[string]bool{"file": fileIsFile, "flink": linkIsFile} {
			if isFile {
				write(t, filepath.Join(dir, name), "inside\n")
			} else if err := os.Symlink(outside, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.layout(h.tree, "0.1.0", true, false)
	return h
}

// swap exchanges h.a and h.b until stop is closed; it returns how many exchanges it made.
func (h *hostile) swap(t *testing.T, stop <-chan struct{}) (done func() int64) {
	var n atomic.Int64
	var wg sync.WaitGroup
	a, b := filepath.Join(h.tree, h.a), filepath.Join(h.tree, h.b)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("renameat2: %v", err)
				return
			}
			n.Add(1)
		}
	}()
	return func() int64 { wg.Wait(); return n.Load() }
}

// stored says what is wrong with a stored tree, if anything: the outside's bytes in it,
// or a digest that is not the one of the bytes stored, or of any state of the tree.
func (h *hostile) stored(dir, digest string, legit []string) error {
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(data, []byte(h.marker)) {
			return fmt.Errorf("%s holds the outside file's secret", path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if got, err := DigestDir(dir); err != nil || got != digest {
		return fmt.Errorf("the stored tree hashes to %s (%v), stored as %s", got, err, digest)
	}
	if !slices.Contains(legit, digest) {
		return fmt.Errorf("digest %s is none of the tree's %v", digest, legit)
	}
	return nil
}

// tally counts, per kind of call, how many succeeded, failed, and went wrong: succeeded
// with a wrong result, or failed otherwise than as a tree that changed under the walk.
type tally struct {
	ok, failed, wrong int
	firstWrong        error
	firstFailure      error
	// fine says which failures are right; nil: those of a tree that changed (aborted).
	fine func(error) bool
}

func (c *tally) add(err error, check func() error) {
	if err != nil {
		c.failed++
		if c.firstFailure == nil {
			c.firstFailure = err
		}
		if fine := c.fine; fine == nil && !errdefs.IsAborted(err) || fine != nil && !fine(err) {
			c.wrong++
			if c.firstWrong == nil {
				c.firstWrong = fmt.Errorf("failed, but not as it should: %w", err)
			}
		}
		return
	}
	c.ok++
	if err := check(); err != nil {
		c.wrong++
		if c.firstWrong == nil {
			c.firstWrong = err
		}
	}
}

func (h *hostile) race(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Many pushes in little time; what they store, not that it survives a crash, is tested.
	s.db.NoSync = true
	stop := make(chan struct{})
	swaps := h.swap(t, stop)
	stopped := false
	halt := func() int64 {
		if !stopped {
			close(stop)
			stopped = true
		}
		return swaps()
	}
	defer halt()

	var imports, pushes, digests tally
	legit := h.legit(t, "0.1.0")
	start := time.Now()
	for i := 0; i < 500 && time.Since(start) < 2*time.Second; i++ {
		im, err := s.Import(h.tree)
		imports.add(err, func() error { return h.stored(im.Dir, im.SHA256, legit) })

		// A new version each time, so that every push stores.
		version := fmt.Sprintf("0.1.%d", i)
		write(t, filepath.Join(h.tree, "capsule.yaml"), hostileManifest(version))
		a, _, err := s.Push(h.tree)
		write(t, filepath.Join(h.tree, "capsule.yaml"), hostileManifest("0.1.0"))
		pushes.add(err, func() error {
			if a.Version != version {
				return fmt.Errorf("push %d stored version %s", i, a.Version)
			}
			return h.stored(s.Dir(a), a.SHA256, h.legit(t, version))
		})

		d, err := DigestDir(h.tree)
		digests.add(err, func() error {
			if !slices.Contains(legit, d) {
				return fmt.Errorf("DigestDir gave %s, none of the tree's %v", d, legit)
			}
			return nil
		})
	}
	n := halt()
	for _, c := range []struct {
		what string
		*tally
	}{{"Import", &imports}, {"Push", &pushes}, {"DigestDir", &digests}} {
		t.Logf("%s: %d succeeded, %d failed (the first: %v), %d wrong", c.what, c.ok, c.failed, c.firstFailure, c.wrong)
		if c.wrong > 0 {
			t.Errorf("%s: %d of %d calls went wrong; the first: %v", c.what, c.wrong, c.ok+c.failed, c.firstWrong)
		}
		if c.ok == 0 {
			// A walk that always fails proves nothing about what it would have stored.
			t.Errorf("%s never succeeded", c.what)
		}
	}
	t.Logf("%d exchanges", n)
	if n == 0 {
		t.Fatal("the tree was never swapped")
	}
}

func TestHostileDirectorySwap(t *testing.T) { dirSwap(t).race(t) }

func TestHostileFileSwap(t *testing.T) { fileSwap(t).race(t) }

func hostileManifest(version string) string {
	return "name: hostile\nversion: " + version + "\nrun:\n  command: [bin/run]\n"
}
