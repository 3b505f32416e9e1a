package workdir_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/workdir"
)

// expectUsage is what lstat says of a tree whose paths are all short enough for it.
func expectUsage(t testing.TB, roots ...string) workdir.Usage {
	t.Helper()
	var u workdir.Usage
	seen := map[[2]uint64]bool{}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			var st syscall.Stat_t
			if err := syscall.Lstat(path, &st); err != nil {
				return err
			}
			if !d.IsDir() && st.Nlink > 1 {
				if seen[[2]uint64{st.Dev, st.Ino}] {
					return nil
				}
				seen[[2]uint64{st.Dev, st.Ino}] = true
			}
			u.Inodes++
			u.Bytes += st.Blocks * 512
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return u
}

// fileTree makes n files spread over directories of 1000, every 97th of them holding data.
func fileTree(t testing.TB, root string, n int) {
	t.Helper()
	data := []byte(strings.Repeat("x", 5000))
	for i := 0; i < n; i++ {
		dir := filepath.Join(root, fmt.Sprintf("d%03d", i/1000))
		if i%1000 == 0 {
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		var content []byte
		if i%97 == 0 {
			content = data
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%06d", i)), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestUsageCounts100kFilesExactly(t *testing.T) {
	root := t.TempDir()
	fileTree(t, root, 100_000)
	got, err := workdir.Measure([]string{root}, workdir.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want := expectUsage(t, root)
	if got != want {
		t.Fatalf("measured %+v, lstat says %+v", got, want)
	}
	if want.Inodes != 1+100+100_000 {
		t.Fatalf("the tree holds %d inodes", want.Inodes)
	}
}

// deepTree makes depth directories, each named name-<level>, one inside the next, by
// descriptors (the path soon passes PATH_MAX), with a small file at every level and data
// bytes in a file at the bottom. It returns the number of entries it made.
func deepTree(t testing.TB, root string, depth int, name string, data int) int64 {
	t.Helper()
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	made := int64(0)
	for i := 0; i < depth; i++ {
		n := fmt.Sprintf("%s-%d", name, i)
		if len(n) > 255 {
			n = n[len(n)-255:]
		}
		if err := unix.Mkdirat(fd, n, 0o755); err != nil {
			t.Fatal(err)
		}
		// A file beside the directory, so the walk has more to read at a level it comes
		// back to.
		f, err := unix.Openat(fd, "side", unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		unix.Write(f, []byte("side"))
		unix.Close(f)
		next, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		fd = next
		made += 2
	}
	f, err := unix.Openat(fd, "bottom", unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for left := data; left > 0; left -= len(buf) {
		if _, err := unix.Write(f, buf[:min(left, len(buf))]); err != nil {
			t.Fatal(err)
		}
	}
	unix.Fsync(f)
	unix.Close(f)
	unix.Close(fd)
	return made + 1
}

// removeDeep removes a tree made by deepTree without holding a descriptor per level (as
// os.RemoveAll would): it lifts each level's directory up to the root, then removes the
// emptied level.
func removeDeep(t testing.TB, root string) {
	t.Helper()
	rfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rfd)
	for step := 0; ; step++ {
		d, err := os.Open("/proc/self/fd/" + fmt.Sprint(rfd))
		if err != nil {
			t.Fatal(err)
		}
		names, _ := d.Readdirnames(-1)
		d.Close()
		var dir string
		for _, n := range names {
			var st unix.Stat_t
			unix.Fstatat(rfd, n, &st, unix.AT_SYMLINK_NOFOLLOW)
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				dir = n
			} else if err := unix.Unlinkat(rfd, n, 0); err != nil {
				t.Fatal(err)
			}
		}
		if dir == "" {
			return
		}
		fd, err := unix.Openat(rfd, dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		d = os.NewFile(uintptr(fd), dir)
		inner, _ := d.Readdirnames(-1)
		for _, n := range inner {
			var st unix.Stat_t
			unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW)
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				if err := unix.Renameat(fd, n, rfd, fmt.Sprintf("lifted-%d", step)); err != nil {
					t.Fatal(err)
				}
			} else if err := unix.Unlinkat(fd, n, 0); err != nil {
				t.Fatal(err)
			}
		}
		d.Close()
		if err := unix.Unlinkat(rfd, dir, unix.AT_REMOVEDIR); err != nil {
			t.Fatal(err)
		}
	}
}

// A path longer than PATH_MAX hides nothing: 300 levels of 250-character names (75 KB of
// path) with 8 MiB at the bottom are counted, every level and every byte, and the walk
// climbs back out of levels it had to close (300 is more than it holds open).
func TestUsageDeeperThanPathMax(t *testing.T) {
	root := t.TempDir()
	t.Cleanup(func() { removeDeep(t, root) })
	made := deepTree(t, root, 300, strings.Repeat("n", 245), 8<<20)
	got, err := workdir.Measure([]string{root}, workdir.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Inodes != 1+made || got.Bytes < 8<<20 {
		t.Fatalf("measured %+v; the tree holds %d inodes and more than %d bytes", got, 1+made, 8<<20)
	}
	// And past a limit of 4 MiB it says so.
	if got, _ := workdir.Measure([]string{root}, workdir.Limits{Bytes: 4 << 20}); !got.Past(workdir.Limits{Bytes: 4 << 20}) {
		t.Fatalf("a deep tree of 8 MiB is not past 4 MiB: %+v", got)
	}
}

// A tree far deeper than the walk may hold descriptors for is counted to its bottom: with
// RLIMIT_NOFILE at 256, 10,000 levels (ROOST_TEST_DEPTH for more: 100,000 measures in
// about 5 s here).
func TestUsageDeeperThanDescriptors(t *testing.T) {
	depth := 10_000
	if v, err := strconv.Atoi(os.Getenv("ROOST_TEST_DEPTH")); err == nil {
		depth = v
	}
	root := t.TempDir()
	t.Cleanup(func() { removeDeep(t, root) })
	start := time.Now()
	made := deepTree(t, root, depth, "d", 1<<20)
	t.Logf("made %d levels in %s", depth, time.Since(start))
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = 256
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	got, err := workdir.Measure([]string{root}, workdir.Limits{})
	took := time.Since(start)
	unix.Setrlimit(unix.RLIMIT_NOFILE, &old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("measured %+v in %s", got, took)
	if got.Inodes != 1+made || got.Bytes < 1<<20 {
		t.Fatalf("measured %+v; the tree holds %d inodes", got, 1+made)
	}
}

// A directory deeper than the walk holds open that moves while it is counted cannot be
// climbed back out of: the walk says so (ErrMoved) rather than skip what it had not yet
// read.
func TestUsageMovedDeepDirectory(t *testing.T) {
	root := t.TempDir()
	t.Cleanup(func() { removeDeep(t, root) })
	name := strings.Repeat("m", 200)
	deepTree(t, root, 300, name, 0)
	moved := false
	workdir.SetBeforeReopen(func(depth int) {
		if moved {
			return
		}
		moved = true
		// Move the directory below the one about to be reopened up to the root, by
		// descriptors (its path is far past PATH_MAX).
		rfd, _ := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		defer unix.Close(rfd)
		fd, _ := unix.Dup(rfd)
		for i := 0; i < depth; i++ {
			next, err := unix.Openat(fd, fmt.Sprintf("%s-%d", name, i), unix.O_RDONLY|unix.O_DIRECTORY, 0)
			unix.Close(fd)
			if err != nil {
				t.Errorf("level %d: %v", i, err)
				return
			}
			fd = next
		}
		defer unix.Close(fd)
		if err := unix.Renameat(fd, fmt.Sprintf("%s-%d", name, depth), rfd, "moved"); err != nil {
			t.Errorf("moving: %v", err)
		}
	})
	defer workdir.SetBeforeReopen(nil)
	_, err := workdir.Measure([]string{root}, workdir.Limits{})
	if !moved || !errors.Is(err, workdir.ErrMoved) {
		t.Fatalf("moved %v, err %v", moved, err)
	}
	// Measured again, it is whole.
	workdir.SetBeforeReopen(nil)
	if got, err := workdir.Measure([]string{root}, workdir.Limits{}); err != nil || got.Inodes != 1+601 {
		t.Fatalf("measured again: %+v %v", got, err)
	}
}

// A file with several names is one file.
func TestUsageHardLinksOnce(t *testing.T) {
	root := t.TempDir()
	os.Mkdir(filepath.Join(root, "a"), 0o755)
	os.Mkdir(filepath.Join(root, "b"), 0o755)
	big := filepath.Join(root, "a", "big")
	if err := os.WriteFile(big, make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	// Zeros written are allocated; make sure of it for the comparison below.
	f, _ := os.OpenFile(big, os.O_RDWR, 0)
	f.Sync()
	f.Close()
	for i := 0; i < 50; i++ {
		if err := os.Link(big, filepath.Join(root, "b", fmt.Sprintf("link%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	got, err := workdir.Measure([]string{root}, workdir.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	syscall.Lstat(big, &st)
	if got.Inodes != 4 || got.Bytes > st.Blocks*512+3*64<<10 || got.Bytes < st.Blocks*512 {
		t.Fatalf("measured %+v: the file (%d bytes allocated) counted more than once?", got, st.Blocks*512)
	}
	// What a copy would make of them is said apart.
	if got.LinkNames != 50 || got.LinkBytes != 50*st.Blocks*512 {
		t.Fatalf("measured %+v: 50 further names of %d bytes", got, st.Blocks*512)
	}
	// A link in another root is the same file too.
	other := t.TempDir()
	os.Link(big, filepath.Join(other, "again"))
	both, _ := workdir.Measure([]string{root, other}, workdir.Limits{})
	if both.Inodes != got.Inodes+1 || both.LinkNames != 51 || both.Bytes > got.Bytes+64<<10 {
		t.Fatalf("across roots: %+v, one root %+v", both, got)
	}
}

// Links are counted as links, never followed: not a loop, not a link to a large tree, not
// a root that is itself a link.
func TestUsageSymlinksNeverFollowed(t *testing.T) {
	root := t.TempDir()
	for name, target := range map[string]string{"self": ".", "loop": "loop", "up": "..", "usr": "/usr", "a": "b", "b": "a"} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	os.Mkdir(filepath.Join(root, "dir"), 0o755)
	os.Symlink("..", filepath.Join(root, "dir", "parent"))
	done := make(chan struct{})
	var got workdir.Usage
	var err error
	go func() { got, err = workdir.Measure([]string{root}, workdir.Limits{}); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the walk followed a loop")
	}
	if err != nil {
		t.Fatal(err)
	}
	if want := expectUsage(t, root); got != want || got.Inodes != 9 {
		t.Fatalf("measured %+v, lstat says %+v", got, want)
	}
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(root, link)
	if got, err := workdir.Measure([]string{link}, workdir.Limits{}); got.Inodes != 0 || err == nil {
		t.Fatalf("a root that is a link: %+v %v", got, err)
	}
}

// Past a limit the walk stops: it does not read the rest of the tree.
func TestUsageStopsPastLimit(t *testing.T) {
	root := t.TempDir()
	fileTree(t, root, 20_000)
	lim := workdir.Limits{Inodes: 500}
	got, err := workdir.Measure([]string{root}, lim)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Past(lim) || got.Inodes != 501 {
		t.Fatalf("measured %+v past %+v", got, lim)
	}
	lim = workdir.Limits{Bytes: 100 << 10}
	got, _ = workdir.Measure([]string{root}, lim)
	if !got.Past(lim) || got.Bytes > 200<<10 || got.Inodes > 2000 {
		t.Fatalf("measured %+v past %+v", got, lim)
	}
	// Under both, the whole tree.
	lim = workdir.Limits{Bytes: 1 << 40, Inodes: 1 << 30}
	if got, _ = workdir.Measure([]string{root}, lim); got != expectUsage(t, root) || got.Past(lim) {
		t.Fatalf("measured %+v", got)
	}
}

// A root inside another root counts once; a root that does not exist counts nothing.
func TestUsageNestedRootsOnce(t *testing.T) {
	root := t.TempDir()
	inner := filepath.Join(root, ".roost", "children", "kid-1")
	os.MkdirAll(inner, 0o755)
	fileTree(t, inner, 1500)
	want := expectUsage(t, root)
	for _, roots := range [][]string{{root, inner}, {inner, root}, {root, root, inner, filepath.Join(root, "missing")}} {
		got, err := workdir.Measure(roots, workdir.Limits{})
		if err != nil || got != want {
			t.Fatalf("%v: measured %+v (%v), want %+v", roots, got, err, want)
		}
	}
}

// A mount inside a tree (only roost or the operator can put one there) counts as an entry
// and is not entered.
func TestUsageMountNotEntered(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	root := t.TempDir()
	mnt := filepath.Join(root, "mnt")
	os.Mkdir(mnt, 0o755)
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=16m"); err != nil {
		t.Skipf("mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	os.WriteFile(filepath.Join(mnt, "inside"), make([]byte, 1<<20), 0o644)
	got, err := workdir.Measure([]string{root}, workdir.Limits{})
	if err != nil || got.Inodes != 2 {
		t.Fatalf("measured %+v (%v): the mount was entered", got, err)
	}
}

func BenchmarkUsage100k(b *testing.B) {
	root := b.TempDir()
	fileTree(b, root, 100_000)
	want := expectUsage(b, root)
	b.ResetTimer()
	for b.Loop() {
		got, err := workdir.Measure([]string{root}, workdir.Limits{})
		if err != nil || got != want {
			b.Fatalf("%+v %v", got, err)
		}
	}
}
