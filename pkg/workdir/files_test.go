package workdir_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/workdir"
)

func TestCleanRel(t *testing.T) {
	for in, want := range map[string]string{"": ".", ".": ".", "a/b/": "a/b", "a/../b": "b", "./a//b": "a/b"} {
		if got, err := workdir.CleanRel(in); err != nil || got != want {
			t.Errorf("CleanRel(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"/etc/passwd", "..", "../x", "a/../../x", "a\x00b"} {
		if _, err := workdir.CleanRel(in); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "path") {
			t.Errorf("CleanRel(%q): %v, want InvalidArgument naming the path", in, err)
		}
	}
}

// hostile is a workdir with a secret outside it and, inside, a link to it, a link to a
// directory outside, a FIFO and a regular file (the positive control).
func hostile(t *testing.T) (root, secretDir string) {
	t.Helper()
	base := t.TempDir()
	secretDir = filepath.Join(base, "outside")
	mkdir(t, secretDir, 0o755)
	writeFile(t, filepath.Join(secretDir, "shadow"), "SECRET", 0o600)
	root = filepath.Join(base, "work")
	mkdir(t, root, 0o755)
	symlink(t, filepath.Join(secretDir, "shadow"), filepath.Join(root, "shadow"))
	symlink(t, secretDir, filepath.Join(root, "out"))
	if err := unix.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "ok"), "fine", 0o644)
	return root, secretDir
}

func TestOpenRegularRefusesLinksAndSpecials(t *testing.T) {
	root, _ := hostile(t)
	f, _, err := workdir.OpenRegular(root, "ok")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(f)
	f.Close()
	if string(data) != "fine" {
		t.Fatalf("ok reads %q", data)
	}
	for rel, what := range map[string]string{"shadow": "symlink", "out/shadow": "symlink", "fifo": "FIFO", "missing": "no such file"} {
		done := make(chan error, 1)
		go func() {
			f, _, err := workdir.OpenRegular(root, rel)
			if f != nil {
				f.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), what) || !strings.Contains(err.Error(), rel) {
				t.Errorf("OpenRegular(%s): %v, want an error naming it and %q", rel, err, what)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("OpenRegular(%s) blocked", rel)
		}
	}
}

func TestCreateFileCreateOnlyAndLinks(t *testing.T) {
	root, secretDir := hostile(t)
	write := func(rel string, createOnly bool, data string) error {
		nf, err := workdir.CreateFile(root, rel, 0o640, createOnly, nil, nil)
		if err != nil {
			return err
		}
		if _, err := nf.Write([]byte(data)); err != nil {
			nf.Abort()
			return err
		}
		_, err = nf.Commit()
		return err
	}
	if err := write("new", true, "one"); err != nil {
		t.Fatal(err)
	}
	if err := write("new", true, "two"); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("create-only over an existing file: %v", err)
	}
	if err := write("new", false, "three"); err != nil || readFile(t, filepath.Join(root, "new")) != "three" {
		t.Fatalf("replacing: %v", err)
	}
	for _, rel := range []string{"shadow", "out/x"} {
		if err := write(rel, false, "EVIL"); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "symlink") {
			t.Errorf("write %s: %v, want refused for the symlink", rel, err)
		}
	}
	if got := readFile(t, filepath.Join(secretDir, "shadow")); got != "SECRET" {
		t.Fatalf("the secret became %q", got)
	}
	if slices.ContainsFunc(entries(t, root), func(n string) bool { return strings.HasPrefix(n, ".roost-") }) {
		t.Fatalf("temporary files left: %v", entries(t, root))
	}
	if names := entries(t, secretDir); !slices.Equal(names, []string{"shadow"}) {
		t.Fatalf("outside now holds %v", names)
	}
}

func TestCreateFileBudget(t *testing.T) {
	root := t.TempDir()
	b := &workdir.Budget{Limit: workdir.Limits{Bytes: 1 << 20, Inodes: 10}}
	nf, err := workdir.CreateFile(root, "big", 0o644, false, nil, b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nf.Write(make([]byte, 512<<10)); err != nil {
		t.Fatal(err)
	}
	_, err = nf.Write(make([]byte, 600<<10))
	var be *workdir.BudgetError
	if !errors.As(err, &be) || !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "resources.workdir_max_bytes") {
		t.Fatalf("write past the budget: %v", err)
	}
	nf.Abort()
	if names := entries(t, root); len(names) != 0 {
		t.Fatalf("left %v", names)
	}
}

func TestReadDirPages(t *testing.T) {
	root := t.TempDir()
	const n = 2500
	for i := range n {
		if err := os.WriteFile(filepath.Join(root, "f"+itoa(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	var cookie int64
	pages := 0
	for {
		page, next, err := workdir.ReadDir(root, ".", cookie, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > workdir.MaxPage {
			t.Fatalf("a page of %d", len(page))
		}
		pages++
		for _, e := range page {
			if seen[e.Name] {
				t.Fatalf("%s twice", e.Name)
			}
			seen[e.Name] = true
		}
		if next == 0 {
			break
		}
		cookie = next
	}
	if len(seen) != n || pages != 3 {
		t.Fatalf("%d entries in %d pages, want %d in 3", len(seen), pages, n)
	}
}

func itoa(i int) string { return fmt.Sprintf("%04d", i) }

// tarNames reads an archive's entries by name, failing when one carries the secret.
func tarNames(t *testing.T, data []byte) map[string]*tar.Header {
	t.Helper()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		if bytes.Contains(body, []byte("SECRET")) {
			t.Fatalf("%s carries the secret", h.Name)
		}
		out[h.Name] = h
	}
}

func TestWriteTarKeepsLinksSkipsSpecials(t *testing.T) {
	root, _ := hostile(t)
	mkdir(t, filepath.Join(root, "sub"), 0o755)
	writeFile(t, filepath.Join(root, "sub", "a"), "aaa", 0o644)
	var buf bytes.Buffer
	if err := workdir.WriteTar(&buf, root, ".", workdir.Limits{}); err != nil {
		t.Fatal(err)
	}
	got := tarNames(t, buf.Bytes())
	if h := got["shadow"]; h == nil || h.Typeflag != tar.TypeSymlink {
		t.Fatalf("shadow archived as %+v", h)
	}
	if got["fifo"] != nil || got["ok"] == nil || got["sub/"] == nil || got["sub/a"] == nil || got["out/shadow"] != nil {
		t.Fatalf("archive holds %v", got)
	}
	if err := workdir.WriteTar(&buf, root, "out/shadow", workdir.Limits{}); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("archiving through a link: %v", err)
	}
	if err := workdir.WriteTar(io.Discard, root, ".", workdir.Limits{Bytes: 5}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("past its bytes: %v", err)
	}
	if err := workdir.WriteTar(io.Discard, root, ".", workdir.Limits{Inodes: 3}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("past its entries: %v", err)
	}
}

// A directory swapped again and again for a link to outside while it is archived: the
// archive never carries what lies outside (a walk that followed the link would, within a
// few hundred archives).
func TestWriteTarSwappedDirectory(t *testing.T) {
	root, secretDir := hostile(t)
	os.Remove(filepath.Join(root, "out"))
	dir := filepath.Join(root, "d")
	mkdir(t, dir, 0o755)
	for i := range 50 {
		writeFile(t, filepath.Join(dir, "f"+itoa(i)), "inside", 0o644)
	}
	writeFile(t, filepath.Join(secretDir, "f0001"), "SECRET", 0o644)
	var stop atomic.Bool
	var wg sync.WaitGroup
	// Before the directories are removed, however the test ends.
	t.Cleanup(func() {
		stop.Store(true)
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Swapped in one step (RENAME_EXCHANGE): d is a directory, then a link, then a
		// directory again, at every rename.
		link := filepath.Join(root, "link")
		_ = os.Symlink(secretDir, link)
		for !stop.Load() {
			_ = unix.Renameat2(unix.AT_FDCWD, dir, unix.AT_FDCWD, link, unix.RENAME_EXCHANGE)
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		var buf bytes.Buffer
		err := workdir.WriteTar(&buf, root, ".", workdir.Limits{})
		if err != nil {
			continue
		}
		tarNames(t, buf.Bytes())
	}
}

func tarOf(t *testing.T, entries ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(h.Linkname))
		}
		body := h.Linkname
		if h.Typeflag == tar.TypeReg {
			h.Linkname = ""
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, body)
		}
	}
	tw.Close()
	return buf.Bytes()
}

func TestReadTarRules(t *testing.T) {
	root, secretDir := hostile(t)
	arch := tarOf(t,
		&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o4755, Linkname: "hello"},
		&tar.Header{Name: "d/l", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
		&tar.Header{Name: "d/h", Typeflag: tar.TypeLink, Linkname: "d/f"},
		&tar.Header{Name: "d/c", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3},
		&tar.Header{Name: "deep/er/g", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"},
	)
	u, err := workdir.ReadTar(bytes.NewReader(arch), root, "up", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if u.Files != 2 || u.Symlinks != 1 || u.SkippedCount != 2 || u.Directories != 1 {
		t.Fatalf("unpacked %+v", u)
	}
	if got := readFile(t, filepath.Join(root, "up/d/f")); got != "hello" {
		t.Fatalf("d/f holds %q", got)
	}
	if fi, _ := os.Stat(filepath.Join(root, "up/d/f")); fi.Mode()&os.ModeSetuid != 0 {
		t.Fatal("setuid survived")
	}
	if l, _ := os.Readlink(filepath.Join(root, "up/d/l")); l != "/etc/passwd" {
		t.Fatalf("link points at %q", l)
	}
	for _, name := range []string{"../escape", "/abs", "a/../../escape"} {
		_, err := workdir.ReadTar(bytes.NewReader(tarOf(t, &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "EVIL"})), root, ".", nil, nil)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), name) {
			t.Errorf("entry %q: %v", name, err)
		}
	}
	// Through the link planted to outside.
	_, err = workdir.ReadTar(bytes.NewReader(tarOf(t, &tar.Header{Name: "out/x", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "EVIL"})), root, ".", nil, nil)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("through a link: %v", err)
	}
	if names := entries(t, secretDir); !slices.Equal(names, []string{"shadow"}) {
		t.Fatalf("outside now holds %v", names)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(root), "escape")); err == nil {
		t.Fatal("escaped")
	}
}

func TestRemoveRecursiveNeverFollows(t *testing.T) {
	root, secretDir := hostile(t)
	mkdir(t, filepath.Join(root, "tree"), 0o755)
	symlink(t, secretDir, filepath.Join(root, "tree", "link"))
	writeFile(t, filepath.Join(root, "tree", "f"), "x", 0o644)
	if err := workdir.Remove(root, "tree", false); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("non-recursive remove of a full directory: %v", err)
	}
	if err := workdir.Remove(root, "tree", true); err != nil {
		t.Fatal(err)
	}
	if err := workdir.Remove(root, "out", true); err != nil {
		t.Fatal(err)
	}
	if err := workdir.Remove(root, ".", true); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("removing the workdir: %v", err)
	}
	if got := readFile(t, filepath.Join(secretDir, "shadow")); got != "SECRET" {
		t.Fatalf("secret %q", got)
	}
	if slices.Contains(entries(t, root), "tree") || slices.Contains(entries(t, root), "out") {
		t.Fatalf("left %v", entries(t, root))
	}
}

func TestReadTarBudget(t *testing.T) {
	root := t.TempDir()
	var hs []*tar.Header
	for i := range 20 {
		hs = append(hs, &tar.Header{Name: "f" + itoa(i), Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"})
	}
	b := &workdir.Budget{Limit: workdir.Limits{Inodes: 10}}
	u, err := workdir.ReadTar(bytes.NewReader(tarOf(t, hs...)), root, ".", nil, b)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "resources.workdir_max_inodes (10)") {
		t.Fatalf("20 files into a budget of 10 inodes: %v", err)
	}
	if n := len(entries(t, root)); n != 10 || u.Files != 10 {
		t.Fatalf("%d entries made, %d counted; want the 10 the budget allows", n, u.Files)
	}
}

// A tree deeper than the walk holds directories open is refused, not walked with a
// descriptor per level.
func TestWriteTarDepth(t *testing.T) {
	root := t.TempDir()
	p := root
	for range workdir.OpenLevels + 2 {
		p = filepath.Join(p, "d")
		mkdir(t, p, 0o755)
	}
	if err := workdir.WriteTar(io.Discard, root, ".", workdir.Limits{}); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "levels deep") {
		t.Fatalf("a tree %d levels deep: %v", workdir.OpenLevels+2, err)
	}
	if err := workdir.WriteTar(io.Discard, root, "d/d", workdir.Limits{}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("from two levels down: %v", err)
	}
	// The positive control: as deep as it goes.
	if err := workdir.WriteTar(io.Discard, root, strings.Repeat("d/", 5)+"d", workdir.Limits{}); err != nil {
		t.Fatal(err)
	}
}
