package workdir_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/workdir"
)

// RemoveAll removes a tree without following what is in it: a link to a directory outside
// goes as a link, a hard link to a file outside leaves the file, a file in a directory
// made unreadable goes too.
func TestRemoveAllFollowsNothing(t *testing.T) {
	outside := t.TempDir()
	keep := filepath.Join(outside, "keep")
	os.WriteFile(keep, []byte("keep"), 0o644)
	root := filepath.Join(t.TempDir(), "tree")
	os.Mkdir(root, 0o755)
	fileTree(t, root, 2500)
	os.MkdirAll(filepath.Join(root, "a", "b", "c"), 0o755)
	os.Symlink(outside, filepath.Join(root, "a", "out"))
	os.Symlink(outside, filepath.Join(root, "a", "b", "c", "out"))
	os.Link(keep, filepath.Join(root, "a", "b", "hard"))
	os.Mkdir(filepath.Join(root, "locked"), 0o755)
	os.WriteFile(filepath.Join(root, "locked", "f"), nil, 0o644)
	os.Chmod(filepath.Join(root, "locked"), 0)
	if err := workdir.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the tree survived: %v", err)
	}
	if data, err := os.ReadFile(keep); err != nil || string(data) != "keep" {
		t.Fatalf("a file outside the tree: %q %v", data, err)
	}
	if err := workdir.RemoveAll(root); err != nil {
		t.Fatalf("a path that is gone: %v", err)
	}
	// A link as the path is removed as a link.
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(outside, link)
	if err := workdir.RemoveAll(link); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("through a link: %v", err)
	}
}

// A tree deeper than the descriptors the process may hold (os.RemoveAll holds one per
// level, and fails on it) is removed, and past PATH_MAX.
func TestRemoveAllDeep(t *testing.T) {
	root := filepath.Join(t.TempDir(), "deep")
	os.Mkdir(root, 0o755)
	made := deepTree(t, root, 2000, strings.Repeat("r", 200), 1<<20)
	var old unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &old)
	low := old
	low.Cur = 64
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	err := workdir.RemoveAll(root)
	unix.Setrlimit(unix.RLIMIT_NOFILE, &old)
	if err != nil {
		t.Fatalf("removing %d entries: %v", made, err)
	}
	if _, err := os.Lstat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the tree survived: %v", err)
	}
}

// A mount inside the tree is not entered: what is on it survives, and RemoveAll says why it
// could not finish.
func TestRemoveAllLeavesMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	root := filepath.Join(t.TempDir(), "tree")
	mnt := filepath.Join(root, "sub", "mnt")
	os.MkdirAll(mnt, 0o755)
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	os.WriteFile(filepath.Join(mnt, "precious"), []byte("x"), 0o644)
	if err := workdir.RemoveAll(root); err == nil {
		t.Fatal("removed a tree with a mount in it")
	}
	if _, err := os.Stat(filepath.Join(mnt, "precious")); err != nil {
		// The mount moved with its directory, but is still whole.
		found := false
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Name() == "precious" {
				found = true
			}
			return nil
		})
		if !found {
			t.Fatalf("a file on the mount is gone: %v", err)
		}
	}
}
