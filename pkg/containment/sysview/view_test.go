package sysview

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
)

// helperEnv makes the test binary a process building a view of the fake root in
// helperEnv's value, "root:dir:log", appending a line to log for each build it makes.
const helperEnv = "SYSVIEW_VIEW_HELPER"

func TestMain(m *testing.M) {
	if v := os.Getenv(helperEnv); v != "" {
		os.Exit(viewHelper(v))
	}
	os.Exit(m.Run())
}

func viewHelper(arg string) int {
	parts := strings.SplitN(arg, ":", 3)
	c, err := Resolve(fakeWant(), fakeOptions(parts[0]))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	b := NewBuilder(parts[1])
	b.hook = func(stage, _ string) {
		if stage == "build" {
			// Long enough for every other process to be waiting on the lock.
			time.Sleep(300 * time.Millisecond)
			return
		}
		f, err := os.OpenFile(parts[2], os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err == nil {
			fmt.Fprintf(f, "built by %d\n", os.Getpid())
			f.Close()
		}
	}
	p, err := b.View(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(p)
	return 0
}

func sameInode(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Lstat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

func TestViewLayout(t *testing.T) {
	root := fakeRoot(t)
	c, err := Resolve(fakeWant(), fakeOptions(root))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "views")
	b := NewBuilder(dir)
	var builds atomic.Int32
	b.hook = func(stage, _ string) {
		if stage == "built" {
			builds.Add(1)
		}
	}
	// The umask must not reach the view: sessions read it as whoever they run as.
	old := syscall.Umask(0o077)
	view, err := b.View(c)
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	if view != filepath.Join(dir, c.Digest) {
		t.Errorf("view at %s, want %s", view, filepath.Join(dir, c.Digest))
	}
	for _, f := range c.Files {
		if !sameInode(t, filepath.Join(root, f), filepath.Join(view, f)) {
			t.Errorf("%s in the view is not the host's inode", f)
		}
	}
	for l, target := range map[string]string{
		"/usr/lib64/ld-fake.so.2":             "/lib/x86_64-linux-gnu/ld-fake.so.2",
		"/usr/bin/sh":                         "dash",
		"/usr/lib/x86_64-linux-gnu/libb.so.1": "libb.so.1.0",
	} {
		if got, err := os.Readlink(filepath.Join(view, l)); err != nil || got != target {
			t.Errorf("%s in the view: %q, %v; want a link to %q", l, got, err, target)
		}
	}
	for _, top := range []string{"bin", "lib", "lib64"} {
		if _, err := os.Lstat(filepath.Join(view, top)); !os.IsNotExist(err) {
			t.Errorf("/%s, a merged-/usr link the session's root has, is in the view (%v)", top, err)
		}
	}
	if len(c.Linked) == 0 {
		t.Errorf("no data tree is linked into the view: %q", c.Trees)
	}
	for _, tr := range c.Trees {
		ents, err := os.ReadDir(filepath.Join(view, tr))
		if slices.Contains(c.Linked, tr) {
			// A data tree: the view holds its files, the same inodes as the host's.
			host, _ := os.ReadDir(filepath.Join(c.Root, tr))
			if err != nil || len(ents) != len(host) {
				t.Errorf("linked tree %s in the view: %d entries, %v; the host has %d", tr, len(ents), err, len(host))
			}
			continue
		}
		if err != nil || len(ents) != 0 {
			t.Errorf("tree %s in the view: %d entries, %v; want an empty directory", tr, len(ents), err)
		}
	}
	err = filepath.WalkDir(view, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if info, _ := d.Info(); info.Mode().Perm() != 0o755 {
				t.Errorf("%s is %v, want 0755", p, info.Mode().Perm())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.View(c)
	if err != nil || again != view || builds.Load() != 1 {
		t.Errorf("again: %s, %v, after %d builds; want %s after one", again, err, builds.Load(), view)
	}
	// Nothing besides the view and its lock is left behind.
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"." + c.Digest + ".lock", ".lock", c.Digest}; !slices.Equal(names, want) {
		t.Errorf("the builder's directory holds %q, want %q", names, want)
	}
}

func TestViewBuiltOnceByGoroutines(t *testing.T) {
	root := fakeRoot(t)
	c, err := Resolve(fakeWant(), fakeOptions(root))
	if err != nil {
		t.Fatal(err)
	}
	b := NewBuilder(t.TempDir())
	var builds atomic.Int32
	b.hook = func(stage, _ string) {
		switch stage {
		case "build":
			time.Sleep(50 * time.Millisecond)
		case "built":
			builds.Add(1)
		}
	}
	var wg sync.WaitGroup
	paths := make([]string, 32)
	errs := make([]error, 32)
	for i := range paths {
		wg.Go(func() { paths[i], errs[i] = b.View(c) })
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil || paths[i] != paths[0] {
			t.Errorf("View %d: %s, %v; want %s", i, paths[i], errs[i], paths[0])
		}
	}
	if n := builds.Load(); n != 1 {
		t.Errorf("%d builds, want 1", n)
	}
}

func TestViewBuiltOnceByProcesses(t *testing.T) {
	root := fakeRoot(t)
	dir := filepath.Join(t.TempDir(), "views")
	log := filepath.Join(t.TempDir(), "log")
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for range 4 {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), helperEnv+"="+root+":"+dir+":"+log)
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	var paths []string
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %d: %v: %s", i, err, outs[i])
		}
		paths = append(paths, strings.TrimSpace(outs[i].String()))
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "\n"); n != 1 {
		t.Errorf("%d builds, want 1: %s", n, data)
	}
	for _, p := range paths {
		if p != paths[0] {
			t.Errorf("views at %q", paths)
			break
		}
	}
	if fi, err := os.Stat(paths[0]); err != nil || !fi.IsDir() {
		t.Errorf("no view at %s: %v", paths[0], err)
	}
}

func TestViewRefusesAClosureTheHostNoLongerMatches(t *testing.T) {
	root := fakeRoot(t)
	c, err := Resolve(fakeWant(), fakeOptions(root))
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu/libc.so.6")
	if err := os.WriteFile(lib+".new", fakeELF{}.bytes(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(lib+".new", lib); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	_, err = NewBuilder(dir).View(c)
	if !errors.Is(err, ErrReplaced) || !strings.Contains(err.Error(), "libc.so.6: replaced on the host") {
		t.Fatalf("got %v, want an error saying libc.so.6 was replaced", err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			t.Errorf("%s left behind", e.Name())
		}
	}
}

// mountTmpfs mounts a tmpfs on a new directory, unmounted when the test ends.
func mountTmpfs(t *testing.T) string {
	t.Helper()
	testenv.NeedRoot(t, "mounts a tmpfs")
	dir := t.TempDir()
	err := unix.Mount("sysview-test", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64m,mode=0755")
	testenv.Need(t, "mounting a tmpfs", err)
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Where the builder's directory is on another filesystem than the host's files, a view
// holds copies, with the files' modes and times.
func TestViewAcrossFilesystems(t *testing.T) {
	root := fakeRoot(t)
	if err := os.Chmod(filepath.Join(root, "usr/bin/dash"), 0o4711); err != nil {
		t.Fatal(err)
	}
	c, err := Resolve(fakeWant(), fakeOptions(root))
	if err != nil {
		t.Fatal(err)
	}
	view, err := NewBuilder(filepath.Join(mountTmpfs(t), "views")).View(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range c.Files {
		host, copied := filepath.Join(root, f), filepath.Join(view, f)
		if sameInode(t, host, copied) {
			t.Fatalf("%s is the host's inode across filesystems", f)
		}
		hi, err := os.Stat(host)
		if err != nil {
			t.Fatal(err)
		}
		vi, err := os.Stat(copied)
		if err != nil {
			t.Fatal(err)
		}
		if hi.Mode() != vi.Mode() || !hi.ModTime().Equal(vi.ModTime()) {
			t.Errorf("%s: %v %v in the view, %v %v on the host", f, vi.Mode(), vi.ModTime(), hi.Mode(), hi.ModTime())
		}
		hd, _ := os.ReadFile(host)
		vd, _ := os.ReadFile(copied)
		if !bytes.Equal(hd, vd) {
			t.Errorf("%s: the copy differs", f)
		}
	}
	if got, err := os.Readlink(filepath.Join(view, "usr/bin/sh")); err != nil || got != "dash" {
		t.Errorf("usr/bin/sh: %q, %v", got, err)
	}
}

func TestPrune(t *testing.T) {
	root := fakeRoot(t)
	keepC, err := Resolve(fakeWant(), fakeOptions(root))
	if err != nil {
		t.Fatal(err)
	}
	dropC, err := Resolve(Want{Files: []string{"/bin/script"}}, fakeOptions(root))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	b := NewBuilder(dir)
	keepView, err := b.View(keepC)
	if err != nil {
		t.Fatal(err)
	}
	dropView, err := b.View(dropC)
	if err != nil {
		t.Fatal(err)
	}
	// What a build that died leaves.
	stale := filepath.Join(dir, tmpPrefix+"dead")
	tree(t, stale, map[string]any{"usr/bin/x": []byte("x")})
	removed, err := b.Prune(func(d string) bool { return d == keepC.Digest })
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{dropC.Digest}; !slices.Equal(removed, want) {
		t.Errorf("removed %q, want %q", removed, want)
	}
	for p, want := range map[string]bool{
		keepView: true, dropView: false, stale: false,
		filepath.Join(dir, digestLock(dropC.Digest)): false,
		filepath.Join(dir, digestLock(keepC.Digest)): true,
		filepath.Join(root, "usr/bin/dash"):          true,
	} {
		if _, err := os.Lstat(p); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", p, err == nil, want)
		}
	}
	// A pruned view is built anew when asked for again.
	if again, err := b.View(dropC); err != nil || again != dropView {
		t.Errorf("rebuilt: %s, %v", again, err)
	}
}

// A view a tree is still mounted in is not removed, nor what is mounted there.
func TestPruneRefusesMountedViews(t *testing.T) {
	testenv.NeedRoot(t, "bind-mounts a tree into a view")
	root := fakeRoot(t)
	c, err := Resolve(fakeWant(), fakeOptions(root))
	if err != nil {
		t.Fatal(err)
	}
	b := NewBuilder(t.TempDir())
	view, err := b.View(c)
	if err != nil {
		t.Fatal(err)
	}
	precious := filepath.Join(root, "usr/share/zoneinfo/UTC")
	mnt := filepath.Join(view, "usr/share/zoneinfo")
	if err := unix.Mount(filepath.Join(root, "usr/share/zoneinfo"), mnt, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	removed, err := b.Prune(func(string) bool { return false })
	if err == nil || !strings.Contains(err.Error(), "mounted") || len(removed) != 0 {
		t.Errorf("Prune of a mounted view: removed %q, %v", removed, err)
	}
	if _, err := os.Stat(precious); err != nil {
		t.Fatalf("the mounted tree's file is gone: %v", err)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if removed, err := b.Prune(func(string) bool { return false }); err != nil || len(removed) != 1 {
		t.Errorf("Prune once unmounted: removed %q, %v", removed, err)
	}
	if _, err := os.Stat(precious); err != nil {
		t.Fatalf("the tree's file is gone: %v", err)
	}
}

func TestViewOfGitOnThisHost(t *testing.T) {
	hostFile(t, "/usr/bin/git")
	c, err := Resolve(Want{Files: []string{"/usr/bin/git"}, ExecTrees: []string{"/usr/lib/git-core"}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	view, err := NewBuilder(t.TempDir()).View(c)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(view, &st); err != nil {
		t.Fatal(err)
	}
	for _, f := range c.Files {
		var hs unix.Stat_t
		if err := unix.Stat(f, &hs); err != nil {
			t.Fatal(err)
		}
		if hs.Dev == st.Dev && !sameInode(t, f, filepath.Join(view, f)) {
			t.Errorf("%s in the view is not the host's inode", f)
		}
	}
	if target, err := os.Readlink("/usr/lib64/ld-linux-x86-64.so.2"); err == nil {
		if got, err := os.Readlink(filepath.Join(view, "usr/lib64/ld-linux-x86-64.so.2")); err != nil || got != target {
			t.Errorf("the loader's link in the view: %q, %v; want %q", got, err, target)
		}
	}
	if fi, err := os.Stat(filepath.Join(view, "usr/lib/git-core")); err != nil || !fi.IsDir() {
		t.Errorf("no mount point for git-core: %v", err)
	}
}
