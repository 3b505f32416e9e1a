package workdir_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/workdir"
)

// TestMain fixes the umask: the modes of what the package creates pass through it, and the
// tests state modes exactly.
func TestMain(m *testing.M) {
	unix.Umask(0o022)
	os.Exit(m.Run())
}

func mkdir(t *testing.T, path string, perm os.FileMode) {
	t.Helper()
	if err := os.Mkdir(path, perm); err != nil {
		t.Fatal(err)
	}
	// Mkdir's mode passes through the umask; the test means exactly perm.
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, data string, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// entries lists a directory's names, so a test can say nothing appeared in it.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func wantErrMentioning(t *testing.T, err error, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one mentioning %q", what)
	}
	if !strings.Contains(err.Error(), what) {
		t.Fatalf("error %q does not mention %q", err, what)
	}
}

// fixture is a root the capsule controls and, beside it, a directory it must never reach.
func fixture(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	mkdir(t, root, 0o755)
	mkdir(t, outside, 0o755)
	return root, outside
}

func TestMkdirAllCreatesNested(t *testing.T) {
	root, _ := fixture(t)
	if err := workdir.MkdirAll(root, "a/b/c", 0o700, nil); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"a", "a/b", "a/b/c"} {
		fi, err := os.Lstat(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: mode %v, want drwx------", rel, fi.Mode())
		}
	}
	// Existing directories are used as they are, not re-made or re-moded.
	if err := os.Chmod(filepath.Join(root, "a"), 0o750); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "a/b/keep"), "x", 0o600)
	if err := workdir.MkdirAll(root, "a/b/c/d", 0o700, nil); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(root, "a")); fi.Mode().Perm() != 0o750 {
		t.Fatalf("an existing directory's mode changed to %v", fi.Mode())
	}
	if readFile(t, filepath.Join(root, "a/b/keep")) != "x" {
		t.Fatal("an existing directory's content changed")
	}
	if fi, err := os.Stat(filepath.Join(root, "a/b/c/d")); err != nil || !fi.IsDir() {
		t.Fatalf("a/b/c/d: %v", err)
	}
}

func TestMkdirAllRefusesSymlinks(t *testing.T) {
	cases := []struct {
		name, link, rel string
		// target is the link's target, relative to the outside directory; "" means inside root.
		target string
	}{
		{"first component", "a", "a/b/c", "."},
		{"middle component", "a/l", "a/l/c", "."},
		{"final component", "l", "l", "."},
		{"dangling link", "l", "l/x", "missing"},
		{"link to inside the root", "l", "l/x", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root, outside := fixture(t)
			if dir := filepath.Dir(tc.link); dir != "." {
				if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			target := filepath.Join(outside, tc.target)
			if tc.target == "" {
				mkdir(t, filepath.Join(root, "real"), 0o755)
				target = "real"
			}
			symlink(t, target, filepath.Join(root, tc.link))

			wantErrMentioning(t, workdir.MkdirAll(root, tc.rel, 0o700, nil), "symlink")
			if names := entries(t, outside); len(names) != 0 {
				t.Fatalf("created outside the root through the link: %v", names)
			}
			if tc.target == "" {
				if names := entries(t, filepath.Join(root, "real")); len(names) != 0 {
					t.Fatalf("created through an inside link: %v", names)
				}
			}
			if fi, err := os.Lstat(filepath.Join(root, tc.link)); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
				t.Fatalf("the link was replaced: %v, %v", fi, err)
			}
		})
	}
}

func TestMkdirAllStaysBeneath(t *testing.T) {
	for _, rel := range []string{"../escape", "a/../../escape", "a/../../../escape"} {
		t.Run(rel, func(t *testing.T) {
			root, _ := fixture(t)
			if err := workdir.MkdirAll(root, rel, 0o700, nil); err == nil {
				t.Fatal("accepted")
			}
			if names := entries(t, filepath.Dir(root)); !slices.Equal(names, []string{"outside", "root"}) {
				t.Fatalf("the root's parent now holds %v", names)
			}
		})
	}
	t.Run("absolute", func(t *testing.T) {
		root, outside := fixture(t)
		if err := workdir.MkdirAll(root, filepath.Join(outside, "x"), 0o700, nil); err == nil {
			t.Fatal("an absolute path was accepted")
		}
		if names := entries(t, outside); len(names) != 0 {
			t.Fatalf("created at the absolute path: %v", names)
		}
	})
	t.Run("root is a link", func(t *testing.T) {
		root, outside := fixture(t)
		link := filepath.Join(filepath.Dir(root), "rootlink")
		symlink(t, outside, link)
		if err := workdir.MkdirAll(link, "x", 0o700, nil); err == nil {
			t.Fatal("a linked root was followed")
		}
		if names := entries(t, outside); len(names) != 0 {
			t.Fatalf("created through the linked root: %v", names)
		}
	})
}

func TestOpenDir(t *testing.T) {
	root, outside := fixture(t)
	if err := os.MkdirAll(filepath.Join(root, "a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "a/b/f"), "x", 0o600)
	writeFile(t, filepath.Join(root, "file"), "x", 0o600)
	writeFile(t, filepath.Join(outside, "secret"), "s", 0o600)
	symlink(t, outside, filepath.Join(root, "out"))
	symlink(t, "a", filepath.Join(root, "in"))
	symlink(t, "b", filepath.Join(root, "a/lb"))

	t.Run("opens", func(t *testing.T) {
		for _, rel := range []string{"a/b", "a/b/", "./a/b", "a/../a/b", "."} {
			d, err := workdir.OpenDir(root, rel, false)
			if err != nil {
				t.Fatalf("%s: %v", rel, err)
			}
			names, err := d.Readdirnames(-1)
			d.Close()
			if err != nil {
				t.Fatalf("%s: %v", rel, err)
			}
			if rel != "." && !slices.Equal(names, []string{"f"}) {
				t.Fatalf("%s lists %v", rel, names)
			}
		}
	})
	t.Run("O_PATH", func(t *testing.T) {
		d, err := workdir.OpenDir(root, "a/b", true)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		var st unix.Stat_t
		if err := unix.Fstat(int(d.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			t.Fatalf("fstat: %v, mode %o", err, st.Mode)
		}
		flags, err := unix.FcntlInt(d.Fd(), unix.F_GETFL, 0)
		if err != nil || flags&unix.O_PATH == 0 {
			t.Fatalf("not an O_PATH descriptor: flags %#o, %v", flags, err)
		}
	})
	for _, tc := range []struct{ rel, why string }{
		{"..", "leaves the directory"},
		{"a/../..", "leaves the directory"},
		{"../outside", "leaves the directory"},
		{outside, "leaves the directory"},
		{"out", "symlink"},
		{"out/", "symlink"},
		{"in", "symlink"},
		{"in/b", "symlink"},
		{"a/lb", "symlink"},
		{"file", "not a directory"},
	} {
		t.Run("refuses "+tc.rel, func(t *testing.T) {
			d, err := workdir.OpenDir(root, tc.rel, false)
			if err == nil {
				d.Close()
			}
			wantErrMentioning(t, err, tc.why)
		})
	}
}

func TestWriteFile(t *testing.T) {
	root, _ := fixture(t)
	if err := os.Mkdir(filepath.Join(root, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := workdir.WriteFile(root, "sub/out.json", []byte("one"), 0o640); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "sub/out.json")
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o640 || readFile(t, path) != "one" {
		t.Fatalf("mode %v, content %q", fi.Mode(), readFile(t, path))
	}
	var before unix.Stat_t
	if err := unix.Stat(path, &before); err != nil {
		t.Fatal(err)
	}
	// Holding the old file open shows the replacement is a new inode: a reader never sees
	// a half-written file.
	old, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := workdir.WriteFile(root, "sub/out.json", []byte("two, longer"), 0o640); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, path); got != "two, longer" {
		t.Fatalf("content %q after rewrite", got)
	}
	var after unix.Stat_t
	if err := unix.Stat(path, &after); err != nil {
		t.Fatal(err)
	}
	if after.Ino == before.Ino {
		t.Fatal("rewritten in place, not renamed over")
	}
	data := make([]byte, 16)
	n, _ := old.ReadAt(data, 0)
	if string(data[:n]) != "one" {
		t.Fatalf("the old inode was modified: %q", data[:n])
	}
	if names := entries(t, filepath.Join(root, "sub")); !slices.Equal(names, []string{"out.json"}) {
		t.Fatalf("left behind: %v", names)
	}
}

// TestWriteFileReadersSeeWholeVersions: a reader racing the writer finds the file present
// and holding one whole version, never a gap or a torn mix.
func TestWriteFileReadersSeeWholeVersions(t *testing.T) {
	root, _ := fixture(t)
	versions := [][]byte{bytes.Repeat([]byte("a"), 64<<10), bytes.Repeat([]byte("b"), 64<<10)}
	if err := workdir.WriteFile(root, "state", versions[0], 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "state")
	stop := make(chan struct{})
	bad := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			data, err := os.ReadFile(path)
			if err != nil || (!bytes.Equal(data, versions[0]) && !bytes.Equal(data, versions[1])) {
				select {
				case bad <- fmt.Sprintf("read %d bytes, err %v", len(data), err):
				default:
				}
				return
			}
		}
	}()
	for i := range 300 {
		if err := workdir.WriteFile(root, "state", versions[i%2], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	select {
	case msg := <-bad:
		t.Fatalf("a reader saw a partial file: %s", msg)
	default:
	}
}

func TestWriteFileNeverThroughLinks(t *testing.T) {
	type plant func(t *testing.T, root, victim string)
	cases := []struct {
		name  string
		plant plant
	}{
		{"symlink at the name", func(t *testing.T, root, victim string) {
			symlink(t, victim, filepath.Join(root, "out"))
		}},
		{"hard link at the name", func(t *testing.T, root, victim string) {
			if err := os.Link(victim, filepath.Join(root, "out")); err != nil {
				t.Fatal(err)
			}
		}},
		{"symlink at the temporary name", func(t *testing.T, root, victim string) {
			symlink(t, victim, filepath.Join(root, ".out.tmp"))
		}},
		{"hard link at the temporary name", func(t *testing.T, root, victim string) {
			if err := os.Link(victim, filepath.Join(root, ".out.tmp")); err != nil {
				t.Fatal(err)
			}
		}},
		{"dangling symlink at the temporary name", func(t *testing.T, root, victim string) {
			symlink(t, victim+".new", filepath.Join(root, ".out.tmp"))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root, outside := fixture(t)
			victim := filepath.Join(outside, "victim")
			writeFile(t, victim, "precious", 0o644)
			tc.plant(t, root, victim)

			if err := workdir.WriteFile(root, "out", []byte("written"), 0o600); err != nil {
				t.Fatal(err)
			}
			if got := readFile(t, victim); got != "precious" {
				t.Fatalf("the file outside was overwritten: %q", got)
			}
			if fi, _ := os.Lstat(victim); fi.Mode().Perm() != 0o644 {
				t.Fatalf("the file outside changed mode: %v", fi.Mode())
			}
			if names := entries(t, outside); !slices.Equal(names, []string{"victim"}) {
				t.Fatalf("created outside: %v", names)
			}
			fi, err := os.Lstat(filepath.Join(root, "out"))
			if err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("out is not a regular file: %v, %v", fi, err)
			}
			if got := readFile(t, filepath.Join(root, "out")); got != "written" {
				t.Fatalf("out holds %q", got)
			}
			if names := entries(t, root); !slices.Equal(names, []string{"out"}) {
				t.Fatalf("the root holds %v", names)
			}
		})
	}
}

func TestWriteFileRefusesPaths(t *testing.T) {
	for _, tc := range []struct{ rel, why string }{
		{"link/out", "symlink"},
		{"../out", "leaves the directory"},
		{"sub/../../out", "leaves the directory"},
	} {
		t.Run(tc.rel, func(t *testing.T) {
			root, outside := fixture(t)
			if err := os.Mkdir(filepath.Join(root, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			symlink(t, outside, filepath.Join(root, "link"))
			wantErrMentioning(t, workdir.WriteFile(root, tc.rel, []byte("x"), 0o600), tc.why)
			if names := entries(t, outside); len(names) != 0 {
				t.Fatalf("written outside: %v", names)
			}
			if names := entries(t, filepath.Dir(root)); !slices.Equal(names, []string{"outside", "root"}) {
				t.Fatalf("written beside the root: %v", names)
			}
		})
	}
}

func TestSymlink(t *testing.T) {
	root, outside := fixture(t)
	if err := os.Mkdir(filepath.Join(root, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The target is stored as given, never resolved: roost links to its own state directory.
	for rel, target := range map[string]string{"sub/l": outside, "dangling": "no/such/thing"} {
		if err := workdir.Symlink(root, rel, target); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		got, err := os.Readlink(filepath.Join(root, rel))
		if err != nil || got != target {
			t.Fatalf("%s → %q, %v; want %q", rel, got, err, target)
		}
	}

	writeFile(t, filepath.Join(root, "file"), "keep", 0o600)
	if err := os.Mkdir(filepath.Join(root, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"file", "dir", "sub/l", "dangling"} {
		err := workdir.Symlink(root, rel, "/elsewhere")
		if !errors.Is(err, syscall.EEXIST) {
			t.Fatalf("replacing %s: %v; want EEXIST", rel, err)
		}
	}
	if readFile(t, filepath.Join(root, "file")) != "keep" {
		t.Fatal("an existing file was replaced")
	}
	if fi, err := os.Lstat(filepath.Join(root, "dir")); err != nil || !fi.IsDir() {
		t.Fatal("an existing directory was replaced")
	}
	if got, _ := os.Readlink(filepath.Join(root, "sub/l")); got != outside {
		t.Fatalf("an existing link now points at %q", got)
	}
	if names := entries(t, filepath.Join(root, "dir")); len(names) != 0 {
		t.Fatalf("a link was made inside the existing directory: %v", names)
	}

	symlink(t, outside, filepath.Join(root, "out"))
	wantErrMentioning(t, workdir.Symlink(root, "out/l", "/x"), "symlink")
	wantErrMentioning(t, workdir.Symlink(root, "../l", "/x"), "leaves the directory")
	if names := entries(t, outside); len(names) != 0 {
		t.Fatalf("a link was made outside: %v", names)
	}
	if names := entries(t, filepath.Dir(root)); !slices.Equal(names, []string{"outside", "root"}) {
		t.Fatalf("a link was made beside the root: %v", names)
	}
}

func TestCopy(t *testing.T) {
	base := t.TempDir()
	src, dst, outside := filepath.Join(base, "src"), filepath.Join(base, "dst"), filepath.Join(base, "outside")
	mkdir(t, src, 0o755)
	mkdir(t, dst, 0o700)
	mkdir(t, outside, 0o755)
	writeFile(t, filepath.Join(outside, "secret"), "outside", 0o644)

	writeFile(t, filepath.Join(src, "plain"), "plain text", 0o644)
	writeFile(t, filepath.Join(src, "private"), "mine", 0o600)
	writeFile(t, filepath.Join(src, "tool"), "#!/bin/sh\n", 0o751)
	writeFile(t, filepath.Join(src, "empty"), "", 0o640)
	mkdir(t, filepath.Join(src, "sub"), 0o750)
	writeFile(t, filepath.Join(src, "sub/nested"), "deep", 0o604)
	mkdir(t, filepath.Join(src, "sub/deeper"), 0o755)
	writeFile(t, filepath.Join(src, "sub/deeper/leaf"), "leaf", 0o644)
	// Only top-level names are skipped; the same name lower down is ordinary content.
	mkdir(t, filepath.Join(src, ".roost"), 0o755)
	writeFile(t, filepath.Join(src, ".roost/state"), "skip me", 0o644)
	mkdir(t, filepath.Join(src, "sub/.roost"), 0o755)
	writeFile(t, filepath.Join(src, "sub/.roost/kept"), "kept", 0o644)
	writeFile(t, filepath.Join(src, "also-skipped"), "x", 0o644)
	symlink(t, "plain", filepath.Join(src, "rel-link"))
	symlink(t, filepath.Join(outside, "secret"), filepath.Join(src, "abs-link"))
	symlink(t, outside, filepath.Join(src, "dir-link"))
	symlink(t, "no/such", filepath.Join(src, "dangling"))
	if err := unix.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}

	if err := workdir.Copy(src, dst, workdir.Limits{}, ".roost", "also-skipped"); err != nil {
		t.Fatal(err)
	}

	for rel, want := range map[string]struct {
		data string
		perm os.FileMode
	}{
		"plain":           {"plain text", 0o644},
		"private":         {"mine", 0o600},
		"tool":            {"#!/bin/sh\n", 0o751},
		"empty":           {"", 0o640},
		"sub/nested":      {"deep", 0o604},
		"sub/deeper/leaf": {"leaf", 0o644},
		"sub/.roost/kept": {"kept", 0o644},
	} {
		p := filepath.Join(dst, rel)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm() != want.perm {
			t.Fatalf("%s: mode %v, want %v", rel, fi.Mode(), want.perm)
		}
		if got := readFile(t, p); got != want.data {
			t.Fatalf("%s: %q, want %q", rel, got, want.data)
		}
	}
	if fi, err := os.Lstat(filepath.Join(dst, "sub")); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o750 {
		t.Fatalf("sub: %v, %v; want drwxr-x---", fi, err)
	}
	for rel, target := range map[string]string{
		"rel-link": "plain",
		"abs-link": filepath.Join(outside, "secret"),
		"dir-link": outside,
		"dangling": "no/such",
	} {
		p := filepath.Join(dst, rel)
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			t.Fatalf("%s is not a link: %v, %v", rel, fi, err)
		}
		if got, _ := os.Readlink(p); got != target {
			t.Fatalf("%s → %q, want %q", rel, got, target)
		}
	}
	for _, rel := range []string{".roost", "also-skipped", "fifo"} {
		if _, err := os.Lstat(filepath.Join(dst, rel)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s was copied: %v", rel, err)
		}
	}
	if names := entries(t, outside); !slices.Equal(names, []string{"secret"}) {
		t.Fatalf("the directory behind a link changed: %v", names)
	}
	want := []string{"abs-link", "dangling", "dir-link", "empty", "plain", "private", "rel-link", "sub", "tool"}
	if names := entries(t, dst); !slices.Equal(names, want) {
		t.Fatalf("dst holds %v, want %v", names, want)
	}
}

func TestCopyRefuses(t *testing.T) {
	base := t.TempDir()
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
	mkdir(t, src, 0o755)
	mkdir(t, dst, 0o755)
	writeFile(t, filepath.Join(src, "f"), "x", 0o644)
	symlink(t, src, filepath.Join(base, "src-link"))
	symlink(t, dst, filepath.Join(base, "dst-link"))

	if err := workdir.Copy(filepath.Join(base, "src-link"), dst, workdir.Limits{}); err == nil {
		t.Fatal("copied from a linked source")
	}
	if err := workdir.Copy(src, filepath.Join(base, "dst-link"), workdir.Limits{}); err == nil {
		t.Fatal("copied into a linked destination")
	}
	if err := workdir.Copy(src, filepath.Join(base, "missing"), workdir.Limits{}); err == nil {
		t.Fatal("copied into a destination that does not exist")
	}
	if names := entries(t, dst); len(names) != 0 {
		t.Fatalf("the destination changed: %v", names)
	}
	// An entry already at the destination is an error, never overwritten.
	writeFile(t, filepath.Join(dst, "f"), "theirs", 0o644)
	if err := workdir.Copy(src, dst, workdir.Limits{}); err == nil {
		t.Fatal("copied over an existing file")
	}
	if readFile(t, filepath.Join(dst, "f")) != "theirs" {
		t.Fatal("an existing file was overwritten")
	}
}

// A copy made by root never carries a setuid, setgid or sticky bit the capsule set, and a
// FIFO (which would block the open) or a device is left out.
func TestCopyDropsSpecialBitsAndFiles(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(src, "suid"), "x", 0o755)
	if err := os.Chmod(filepath.Join(src, "suid"), 0o4755|fs.ModeSetuid|fs.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(src, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := workdir.Copy(src, dst, workdir.Limits{}); err != nil {
		t.Fatal(err)
	}
	info, err := os.Lstat(filepath.Join(dst, "suid"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 || info.Mode().Perm() != 0o755 {
		t.Errorf("the copy's mode is %v", info.Mode())
	}
	if _, err := os.Lstat(filepath.Join(dst, "fifo")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the FIFO was copied: %v", err)
	}
}
