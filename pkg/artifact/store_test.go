package artifact

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func capsuleDir(t *testing.T, version, script string) string {
	t.Helper()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "capsule.yaml"), "name: worker\nversion: "+version+"\nrun:\n  command: [bin/run.sh]\n")
	write(t, filepath.Join(dir, "bin", "run.sh"), script)
	os.Chmod(filepath.Join(dir, "bin", "run.sh"), 0o755)
	os.Symlink("run.sh", filepath.Join(dir, "bin", "alias"))
	return dir
}

func TestPushResolveList(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := capsuleDir(t, "0.1.0", "#!/bin/sh\necho one\n")
	a, created, err := s.Push(src)
	if err != nil || !created || a.Ref() != "worker@0.1.0" || !strings.HasPrefix(a.SHA256, "sha256:") {
		t.Fatalf("push: %+v %v %v", a, created, err)
	}
	want, _ := DigestDir(src)
	if a.SHA256 != want {
		t.Fatalf("digest %s, want %s", a.SHA256, want)
	}
	// The stored tree is the pushed one, links as links.
	if got, _ := DigestDir(s.Dir(a)); got != want {
		t.Fatalf("stored tree digests to %s", got)
	}
	if link, err := os.Readlink(filepath.Join(s.Dir(a), "bin", "alias")); err != nil || link != "run.sh" {
		t.Fatalf("symlink copied as %q %v", link, err)
	}

	// The same bytes again: nothing new. Different bytes under the same version: refused.
	if again, created, err := s.Push(src); err != nil || created || again.SHA256 != a.SHA256 {
		t.Fatalf("re-push: %+v %v %v", again, created, err)
	}
	other := capsuleDir(t, "0.1.0", "#!/bin/sh\necho two\n")
	if _, _, err := s.Push(other); !errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), "new version") {
		t.Fatalf("different bytes under worker@0.1.0: %v", err)
	}
	if _, _, err := s.Push(capsuleDir(t, "0.2.0", "#!/bin/sh\necho two\n")); err != nil {
		t.Fatal(err)
	}
	list, _ := s.List()
	if len(list) != 2 || list[0].Ref() != "worker@0.1.0" || list[1].Ref() != "worker@0.2.0" {
		t.Fatalf("list %+v", list)
	}
	if _, err := s.Resolve("worker@9.9.9"); !errdefs.IsNotFound(err) {
		t.Fatalf("resolve of an unknown ref: %v", err)
	}
	bad := t.TempDir()
	write(t, filepath.Join(bad, "capsule.yaml"), "name: Bad\n")
	if _, _, err := s.Push(bad); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("push of an invalid capsule: %v", err)
	}
}

func TestParseRef(t *testing.T) {
	for in, ok := range map[string]bool{"worker@0.1.0": true, "a-b@1.0.0-rc.1+x": true, "./worker@0.1.0": false, "/abs@1.0.0": false, "worker": false, "Worker@1.0.0": false} {
		if _, _, got := ParseRef(in); got != ok {
			t.Errorf("ParseRef(%q) = %v", in, got)
		}
	}
}

func openStore(t *testing.T) (*Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "artifacts")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir
}

// leftovers lists what is in blobs/sha256 besides blobs.
func leftovers(t *testing.T, s *Store) []string {
	t.Helper()
	entries, err := os.ReadDir(s.blobs)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !blobName.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

func blobs(t *testing.T, s *Store) []string {
	t.Helper()
	entries, err := os.ReadDir(s.blobs)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if blobName.MatchString(e.Name()) {
			out = append(out, "sha256:"+e.Name())
		}
	}
	return out
}

func TestOpenGivesTheStoreItsModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "artifacts")
	// What an older roostd left: private directories, a refs file others could read.
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	os.Chmod(filepath.Join(dir, "refs.db"), 0o644)
	if s, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for path, want := range map[string]os.FileMode{
		"":             0o711 | os.ModeDir,
		"blobs":        0o711 | os.ModeDir,
		"blobs/sha256": 0o711 | os.ModeDir,
		"refs.db":      0o600,
	} {
		info, err := os.Lstat(filepath.Join(dir, path))
		if err != nil || info.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", path, info.Mode(), err, want)
		}
	}
}

// The store keeps no private, setuid or sticky mode: unprivileged sessions read their
// capsule from it, and nothing in it runs with privileges it brought along.
func TestImportNormalisesModes(t *testing.T) {
	s, _ := openStore(t)
	src := t.TempDir() // 0700
	write(t, filepath.Join(src, "capsule.yaml"), "name: x\n")
	write(t, filepath.Join(src, "private", "key"), "k")
	write(t, filepath.Join(src, "bin", "tool"), "#!/bin/sh\n")
	write(t, filepath.Join(src, "bin", "suid"), "#!/bin/sh\n")
	write(t, filepath.Join(src, "shared", "f"), "f")
	os.Symlink("../bin/tool", filepath.Join(src, "private", "tool"))
	for path, mode := range map[string]os.FileMode{
		"private":      0o700,
		"private/key":  0o600,
		"bin":          0o750 | os.ModeSetgid,
		"bin/tool":     0o744,
		"bin/suid":     0o755 | os.ModeSetuid,
		"shared":       0o777 | os.ModeSticky,
		"capsule.yaml": 0o400,
	} {
		if err := os.Chmod(filepath.Join(src, path), mode); err != nil {
			t.Fatal(err)
		}
		if info, err := os.Lstat(filepath.Join(src, path)); err != nil || info.Mode()&^os.ModeDir != mode {
			t.Fatalf("source %s: %v (%v), want %v", path, info.Mode(), err, mode)
		}
	}
	im, err := s.Import(src)
	if err != nil {
		t.Fatal(err)
	}
	if !im.Created || im.Files != 5 || im.Bytes != int64(len("name: x\n")+1+2*len("#!/bin/sh\n")+1) {
		t.Fatalf("import: %+v", im)
	}
	want := map[string]os.FileMode{
		".":            0o755 | os.ModeDir,
		"private":      0o755 | os.ModeDir,
		"private/key":  0o644,
		"private/tool": 0o777 | os.ModeSymlink,
		"bin":          0o755 | os.ModeDir,
		"bin/tool":     0o755,
		"bin/suid":     0o755,
		"shared":       0o755 | os.ModeDir,
		"shared/f":     0o644,
		"capsule.yaml": 0o644,
	}
	for path, mode := range want {
		info, err := os.Lstat(filepath.Join(im.Dir, path))
		if err != nil || info.Mode() != mode {
			t.Errorf("stored %s: %v (%v), want %v", path, info.Mode(), err, mode)
			continue
		}
		if st := info.Sys().(*syscall.Stat_t); int(st.Uid) != os.Geteuid() {
			t.Errorf("stored %s is owned by %d", path, st.Uid)
		}
	}
	if link, err := os.Readlink(filepath.Join(im.Dir, "private", "tool")); err != nil || link != "../bin/tool" {
		t.Errorf("link stored as %q (%v)", link, err)
	}
	// The digest names what is stored, and what the source digests to.
	if d, err := DigestDir(src); err != nil || d != im.SHA256 {
		t.Errorf("source digests to %s (%v), import says %s", d, err, im.SHA256)
	}
	if d, err := DigestDir(im.Dir); err != nil || d != im.SHA256 {
		t.Errorf("blob digests to %s (%v), import says %s", d, err, im.SHA256)
	}
	if im.Dir != filepath.Join(s.blobs, strings.TrimPrefix(im.SHA256, "sha256:")) {
		t.Errorf("blob at %s", im.Dir)
	}
	if l := leftovers(t, s); len(l) != 0 {
		t.Errorf("left behind: %v", l)
	}
}

// A tree whose blob is stored already is hashed, not copied: nothing is created in the
// store, the blob is not touched.
func TestImportOfAStoredTreeDoesNotCopy(t *testing.T) {
	s, _ := openStore(t)
	a := capsuleDir(t, "0.1.0", "#!/bin/sh\n")
	first, err := s.Import(a)
	if err != nil || !first.Created {
		t.Fatalf("import: %+v %v", first, err)
	}
	before, err := os.Stat(s.blobs)
	if err != nil {
		t.Fatal(err)
	}
	blob, _ := os.Stat(first.Dir)
	// Past the filesystem's timestamp granularity: a temporary copy would move the mtime.
	time.Sleep(20 * time.Millisecond)
	second, err := s.Import(capsuleDir(t, "0.1.0", "#!/bin/sh\n"))
	if err != nil || second.Created || second.SHA256 != first.SHA256 || second.Dir != first.Dir || second.Files != first.Files || second.Bytes != first.Bytes {
		t.Fatalf("second import: %+v %v, first %+v", second, err, first)
	}
	after, _ := os.Stat(s.blobs)
	if !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("blobs/sha256 changed (%s, then %s): the tree was copied", before.ModTime(), after.ModTime())
	}
	blobAfter, _ := os.Stat(second.Dir)
	if !os.SameFile(blob, blobAfter) || !blobAfter.ModTime().Equal(blob.ModTime()) {
		t.Error("the blob was replaced")
	}
}

func TestImportRefusesSpecialFiles(t *testing.T) {
	s, _ := openStore(t)
	fifo := t.TempDir()
	write(t, filepath.Join(fifo, "sub", "f"), "f")
	if err := syscall.Mkfifo(filepath.Join(fifo, "sub", "pipe"), 0o600); err != nil {
		t.Skip("mkfifo:", err)
	}
	sock := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(sock, "sock"))
	if err != nil {
		t.Skip("unix socket:", err)
	}
	defer l.Close()
	for dir, want := range map[string]string{fifo: "sub/pipe: a capsule holds only files, directories and symlinks, not a fifo", sock: "sock: a capsule holds only files, directories and symlinks, not a socket"} {
		_, err := s.Import(dir)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "capsule "+dir+": "+want) {
			t.Errorf("import of %s: %v", dir, err)
		}
	}
	if l := leftovers(t, s); len(l) != 0 {
		t.Errorf("left behind: %v", l)
	}
	if b := blobs(t, s); len(b) != 0 {
		t.Errorf("stored: %v", b)
	}
}

func TestImportRefusesTreesOverTheBounds(t *testing.T) {
	s, _ := openStore(t)
	s.lim = limits{files: 4, bytes: 10, depth: 2}
	fits := t.TempDir()
	write(t, filepath.Join(fits, "a", "b", "f"), "0123456789") // 3 entries, 10 bytes, 2 deep
	if _, err := s.Import(fits); err != nil {
		t.Fatalf("a tree at the bounds: %v", err)
	}
	many := t.TempDir()
	for _, name := range []string{"1", "2", "3", "4", "5"} {
		write(t, filepath.Join(many, name), "")
	}
	big := t.TempDir()
	write(t, filepath.Join(big, "a"), "01234")
	write(t, filepath.Join(big, "b"), "012345")
	deep := t.TempDir()
	write(t, filepath.Join(deep, "a", "b", "c", "f"), "")
	for dir, want := range map[string]string{
		many: "more than 4 entries",
		big:  "larger than 10 bytes",
		deep: "a/b/c: nested more than 2 directories deep",
	} {
		if _, err := s.Import(dir); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "capsule "+dir+": ") || !strings.Contains(err.Error(), want) {
			t.Errorf("import of %s: %v, want %q", dir, err, want)
		}
		if _, _, err := s.Push(dir); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("push of %s: %v, want %q", dir, err, want)
		}
	}
	if l := leftovers(t, s); len(l) != 0 {
		t.Errorf("left behind: %v", l)
	}
	if b := blobs(t, s); len(b) != 1 {
		t.Errorf("stored: %v", b)
	}
}

// The manifest Push reads is a file of the tree, read with it; a link is not followed.
func TestPushRefusesALinkedManifest(t *testing.T) {
	s, _ := openStore(t)
	real := capsuleDir(t, "0.1.0", "#!/bin/sh\n")
	dir := t.TempDir()
	os.Symlink(filepath.Join(real, "capsule.yaml"), filepath.Join(dir, "capsule.yaml"))
	if _, _, err := s.Push(dir); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "capsule.yaml") {
		t.Fatalf("push of a linked manifest: %v", err)
	}
	if _, _, err := s.Push(filepath.Join(t.TempDir(), "absent")); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("push of no directory: %v", err)
	}
}

func TestCollect(t *testing.T) {
	s, _ := openStore(t)
	pushed, _, err := s.Push(capsuleDir(t, "0.1.0", "#!/bin/sh\necho pushed\n"))
	if err != nil {
		t.Fatal(err)
	}
	kept, err := s.Import(capsuleDir(t, "0.1.0", "#!/bin/sh\necho kept\n"))
	if err != nil {
		t.Fatal(err)
	}
	dropped, err := s.Import(capsuleDir(t, "0.1.0", "#!/bin/sh\necho dropped\n"))
	if err != nil {
		t.Fatal(err)
	}
	// What failed imports and pushes leave.
	for _, tmp := range []string{".import-1", ".push-2", ".collect-3"} {
		write(t, filepath.Join(s.blobs, tmp, "tree", "f"), "f")
	}
	var asked []string
	removed, err := s.Collect(func(digest string) bool {
		asked = append(asked, digest)
		return digest == kept.SHA256
	})
	if err != nil || removed != 1 {
		t.Fatalf("collect: %d %v", removed, err)
	}
	slices.Sort(asked)
	want := []string{kept.SHA256, dropped.SHA256}
	slices.Sort(want)
	if !slices.Equal(asked, want) {
		t.Errorf("keep asked about %v, want %v (the unreferenced blobs)", asked, want)
	}
	if _, err := os.Stat(dropped.Dir); !os.IsNotExist(err) {
		t.Errorf("the dropped blob is still there: %v", err)
	}
	for _, dir := range []string{s.Dir(pushed), kept.Dir} {
		if d, err := DigestDir(dir); err != nil || !strings.HasSuffix(dir, strings.TrimPrefix(d, "sha256:")) {
			t.Errorf("%s: %s %v", dir, d, err)
		}
	}
	if l := leftovers(t, s); len(l) != 0 {
		t.Errorf("left behind: %v", l)
	}
	// Without keep, only what refs name stays.
	if removed, err := s.Collect(nil); err != nil || removed != 1 {
		t.Fatalf("collect: %d %v", removed, err)
	}
	if b := blobs(t, s); !slices.Equal(b, []string{pushed.SHA256}) {
		t.Fatalf("blobs %v, want only %s", b, pushed.SHA256)
	}
	// A collected tree imports again.
	if again, err := s.Import(capsuleDir(t, "0.1.0", "#!/bin/sh\necho dropped\n")); err != nil || !again.Created || again.SHA256 != dropped.SHA256 {
		t.Fatalf("import after collect: %+v %v", again, err)
	}
}

// Remove forgets the ref alone: the blob stays for the sessions that run it until Collect
// finds nothing claiming it. The name is free again afterwards.
func TestRemoveArtifact(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	one, _, err := s.Push(capsuleDir(t, "0.1.0", "#!/bin/sh\necho one\n"))
	if err != nil {
		t.Fatal(err)
	}
	two, _, err := s.Push(capsuleDir(t, "0.2.0", "#!/bin/sh\necho two\n"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Remove("worker@0.1.0")
	if err != nil || got.SHA256 != one.SHA256 || got.Ref() != "worker@0.1.0" {
		t.Fatalf("remove: %+v %v", got, err)
	}
	if _, err := s.Resolve("worker@0.1.0"); !errdefs.IsNotFound(err) {
		t.Fatalf("resolve after remove: %v", err)
	}
	if list, _ := s.List(); len(list) != 1 || list[0].Ref() != "worker@0.2.0" {
		t.Fatalf("list after remove: %+v", list)
	}
	// A session staged from it still runs from the blob: a Collect that finds it claimed
	// keeps it, one that does not removes it.
	if _, err := os.Stat(s.Dir(one)); err != nil {
		t.Fatalf("the blob went with the ref: %v", err)
	}
	if n, err := s.Collect(func(d string) bool { return d == one.SHA256 }); err != nil || n != 0 {
		t.Fatalf("collect with the blob claimed: %d %v", n, err)
	}
	if _, err := os.Stat(s.Dir(one)); err != nil {
		t.Fatalf("a claimed blob was collected: %v", err)
	}
	if n, err := s.Collect(nil); err != nil || n != 1 {
		t.Fatalf("collect: %d %v", n, err)
	}
	if _, err := os.Stat(s.Dir(one)); !os.IsNotExist(err) {
		t.Fatalf("the unnamed, unclaimed blob stayed: %v", err)
	}
	if _, err := os.Stat(s.Dir(two)); err != nil {
		t.Fatalf("the other ref's blob went: %v", err)
	}

	if _, err := s.Remove("worker@0.1.0"); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "worker@0.1.0") {
		t.Fatalf("remove of a removed ref: %v", err)
	}
	for _, bad := range []string{"", "worker", "./worker@0.1.0", "Worker@1.0.0", "worker@"} {
		if _, err := s.Remove(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("remove %q: %v", bad, err)
		}
	}
	// The name is free: other bytes may be pushed under it.
	again, created, err := s.Push(capsuleDir(t, "0.1.0", "#!/bin/sh\necho three\n"))
	if err != nil || !created || again.SHA256 == one.SHA256 {
		t.Fatalf("push after remove: %+v %v %v", again, created, err)
	}
}
