package artifact

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// openTree walks a path as the kernel does where every link is trusted: whatever it opens
// is the directory the kernel's own resolution finds, "..", ".", relative and absolute
// links, loops and all; what does not exist for the one does not for the other.
func FuzzOpenTreeResolvesAsTheKernel(f *testing.F) {
	base := f.TempDir()
	for _, d := range []string{"a/b/c", "d"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"l1":     "a/b",
		"a/up":   "..",
		"a/b/l2": "../../d",
		"abs":    filepath.Join(base, "a"),
		"loop":   "loop",
		"file":   "",
		"dang":   "nowhere",
	} {
		path := filepath.Join(base, link)
		var err error
		if target == "" {
			err = os.WriteFile(path, nil, 0o644)
		} else {
			err = os.Symlink(target, path)
		}
		if err != nil {
			f.Fatal(err)
		}
	}
	for _, seed := range []string{"a", "l1/c", "a/up/l1/../d", "abs/b/l2", "loop/x", "file/x", "dang/x", "a/./b//c/", "a/b/c/../../../a", "l1/l2/../a/up/abs"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, rel string) {
		if len(rel) > 256 || strings.ContainsRune(rel, 0) || strings.HasPrefix(rel, "/") {
			return
		}
		path := base + "/" + rel
		var want unix.Stat_t
		kerr := unix.Stat(path, &want)
		got, err := openTree(path, path)
		if err != nil {
			// A link as the tree itself, however spelt ("link/", "link/."), which the
			// kernel follows, is refused on purpose.
			last := path
			for strings.HasSuffix(last, "/") || strings.HasSuffix(last, "/.") {
				last = strings.TrimSuffix(strings.TrimSuffix(last, "/"), "/.")
			}
			var st unix.Stat_t
			if unix.Lstat(last, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return
			}
			if kerr == nil && want.Mode&unix.S_IFMT == unix.S_IFDIR {
				t.Fatalf("%q: the kernel finds a directory, openTree: %v", rel, err)
			}
			if errors.Is(kerr, unix.ENOENT) && !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("%q: the kernel finds nothing, openTree says: %v", rel, err)
			}
			return
		}
		defer got.Close()
		var st unix.Stat_t
		if err := unix.Fstat(int(got.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		if kerr != nil || st.Dev != want.Dev || st.Ino != want.Ino {
			t.Fatalf("%q: openTree opened %d:%d, the kernel finds %d:%d (%v)", rel, st.Dev, st.Ino, want.Dev, want.Ino, kerr)
		}
	})
}
