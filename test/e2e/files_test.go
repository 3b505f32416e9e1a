package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// The files of a session's workdir through roostd (FilesService, roostctl cp and files),
// against a session that plants links to a secret outside, FIFOs, a 1 GiB sparse file and
// 100,000 files, and swaps a directory for a link while it is copied: nothing outside the
// workdir is read or written, roostd answers throughout, the bounds hold.

// filesScript plants what the test reaches for, says ready, then swaps swap/inner for a
// link to the secret directory and back until it is stopped.
const filesScript = `set -e
mkdir -p d/sub big swap/inner many
echo fine > d/ok
echo sub > d/sub/f
ln -s "$SECRET/secret" d/shadow
ln -s "$SECRET" d/outdir
mkfifo d/fifo
truncate -s 1G big/sparse
echo inside > swap/inner/f
cd many; i=0; while [ $i -lt 100000 ]; do : > f$i; i=$((i+1)); done; cd ..
: > ready
while :; do mv swap/inner swap/x; ln -s "$SECRET" swap/inner; rm swap/inner; mv swap/x swap/inner; done`

func filesCapsule(t *testing.T, class, secretDir string) string {
	return capsule(t, "files", filesScript, fmt.Sprintf(`env:
  SECRET: %s
capabilities:
  containment: %s
  shell:
    allow: [mkdir, ln, mkfifo, truncate, mv, rm]
  resources:
    workdir_max_bytes: 67108864
  limits:
    deadline_seconds: 600
`, secretDir, class))
}

// noSecret fails when any file under dir holds the secret.
func noSecret(t *testing.T, dir, secret string) {
	t.Helper()
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if data, _ := os.ReadFile(p); bytes.Contains(data, []byte(secret)) {
				t.Errorf("%s holds the secret", p)
			}
		}
		return nil
	})
}

func TestFilesHostileSession(t *testing.T) {
	outer := newDaemon(t)
	for _, class := range []string{"scoped", "sealed"} {
		t.Run(class, func(t *testing.T) {
			d := outer.in(t)
			secretDir := t.TempDir()
			secret := "SECRET-" + class + "-" + fmt.Sprint(time.Now().UnixNano())
			if err := os.WriteFile(filepath.Join(secretDir, "secret"), []byte(secret), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(secretDir, "f"), []byte(secret), 0o644); err != nil {
				t.Fatal(err)
			}
			id := strings.TrimSpace(d.ok("run", "-d", filesCapsule(t, class, secretDir)))
			for deadline := time.Now().Add(2 * time.Minute); d.ctl("files", "stat", id, "ready").code != 0; time.Sleep(200 * time.Millisecond) {
				if time.Now().After(deadline) || d.inspect(id).State == "exited" {
					t.Fatalf("the session never got ready: %+v\n%s", d.inspect(id), d.ctl("logs", id).stderr)
				}
			}
			work := d.inspect(id).Workdir
			// A device node, which a session cannot make: made here, as root.
			if err := unix.Mknod(filepath.Join(work, "d", "dev"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatal(err)
			}

			// The positive control, then each planted thing refused.
			if out := d.ok("files", "cat", id, "d/ok"); out != "fine\n" {
				t.Fatalf("cat d/ok: %q", out)
			}
			for path, want := range map[string]string{
				"d/shadow":        "symlink",
				"d/outdir/secret": "symlink",
				"../x":            "climbs out of the workdir",
				"/etc/passwd":     "absolute",
				"d/fifo":          "a FIFO",
				"d/dev":           "a character device",
			} {
				start := time.Now()
				res := d.ctl("files", "cat", id, path)
				if res.code == 0 || !strings.Contains(res.stderr, want) || strings.Contains(res.stdout, secret) {
					t.Errorf("files cat %s: exit %d, %q %q; want refused, saying %q", path, res.code, res.stdout, res.stderr, want)
				}
				if took := time.Since(start); took > 10*time.Second {
					t.Errorf("files cat %s took %s", path, took)
				}
			}

			// A copy out: links as links, no FIFO, no device, nothing of the secret.
			local := filepath.Join(t.TempDir(), "d")
			d.ok("cp", id+":d", local)
			if got, _ := os.ReadFile(filepath.Join(local, "sub", "f")); string(got) != "sub\n" {
				t.Fatalf("copied d/sub/f: %q", got)
			}
			if l, err := os.Readlink(filepath.Join(local, "shadow")); err != nil || l != filepath.Join(secretDir, "secret") {
				t.Fatalf("copied d/shadow: %q %v", l, err)
			}
			for _, name := range []string{"fifo", "dev"} {
				if _, err := os.Lstat(filepath.Join(local, name)); err == nil {
					t.Errorf("%s was copied", name)
				}
			}
			noSecret(t, local, secret)

			// A copy in is the session's; through a link, or past the budget, it is refused.
			var made unix.Stat_t
			if err := unix.Lstat(filepath.Join(work, "d", "ok"), &made); err != nil {
				t.Fatal(err)
			}
			src := filepath.Join(t.TempDir(), "in.txt")
			os.WriteFile(src, []byte("from the operator"), 0o640)
			d.ok("cp", src, id+":d/in.txt")
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(work, "d", "in.txt"), &st); err != nil || st.Uid != made.Uid || st.Mode&0o777 != 0o640 {
				t.Fatalf("d/in.txt: uid %d mode %o (%v), want the session's uid %d, 0640", st.Uid, st.Mode&0o777, err, made.Uid)
			}
			if made.Uid == 0 {
				t.Fatal("the session's own files are root's: the owner check proves nothing")
			}
			for _, dest := range []string{"d/shadow", "d/outdir/evil"} {
				if res := d.ctl("cp", src, id+":"+dest); res.code == 0 || !strings.Contains(res.stderr, "symlink") {
					t.Errorf("cp into %s: exit %d %q", dest, res.code, res.stderr)
				}
			}
			if got, _ := os.ReadFile(filepath.Join(secretDir, "secret")); string(got) != secret {
				t.Fatalf("the secret became %q", got)
			}
			if _, err := os.Lstat(filepath.Join(secretDir, "evil")); err == nil {
				t.Fatal("a file was written outside the workdir")
			}
			big := filepath.Join(t.TempDir(), "big")
			if err := os.WriteFile(big, bytes.Repeat([]byte("x"), 80<<20), 0o644); err != nil {
				t.Fatal(err)
			}
			if res := d.ctl("cp", big, id+":big.bin"); res.code == 0 || !strings.Contains(res.stderr, "resources.workdir_max_bytes (67108864)") {
				t.Errorf("cp of 80 MiB into a 64 MiB workdir: exit %d %q", res.code, res.stderr)
			}
			if _, err := os.Lstat(filepath.Join(work, "big.bin")); err == nil {
				t.Error("big.bin was put in place")
			}
			if entries, _ := filepath.Glob(filepath.Join(work, ".roost-*")); len(entries) > 0 {
				t.Errorf("left behind: %v", entries)
			}

			// The 1 GiB sparse file: a range of it reads; the archive is bounded by the budget.
			var info struct {
				Size           string `json:"size"`
				AllocatedBytes string `json:"allocated_bytes"`
			}
			json.Unmarshal([]byte(d.ok("files", "stat", "--json", id, "big/sparse")), &info)
			if info.Size != "1073741824" {
				t.Fatalf("stat big/sparse: %+v", info)
			}
			if out := d.ok("files", "cat", "--offset", "1073741814", "--length", "10", id, "big/sparse"); out != strings.Repeat("\x00", 10) {
				t.Fatalf("the last 10 bytes of big/sparse: %q", out)
			}
			start := time.Now()
			if res := d.ctl("cp", id+":big", t.TempDir()); res.code == 0 || !strings.Contains(res.stderr, "resources.workdir_max_bytes") {
				t.Errorf("cp of the 1 GiB sparse file under a 64 MiB budget: exit %d %q", res.code, res.stderr)
			}
			t.Logf("the sparse file refused in %s", time.Since(start))

			// 100,000 files: listed a page at a time, copied whole.
			start = time.Now()
			if n := strings.Count(d.ok("files", "ls", id, "many"), "\n"); n != 100000 {
				t.Fatalf("files ls many: %d lines", n)
			}
			t.Logf("100,000 entries listed in %s", time.Since(start))
			start = time.Now()
			many := filepath.Join(t.TempDir(), "many")
			d.ok("cp", id+":many", many)
			if entries, _ := os.ReadDir(many); len(entries) != 100000 {
				t.Fatalf("copied %d of 100,000 files", len(entries))
			}
			t.Logf("100,000 files copied out in %s", time.Since(start))

			// The race: swap/inner is a directory, then a link to the secret, again and again.
			for i := range 40 {
				out := filepath.Join(t.TempDir(), "swap")
				if res := d.ctl("cp", id+":swap", out); res.code != 0 {
					t.Fatalf("cp swap, round %d: %+v", i, res)
				}
				noSecret(t, out, secret)
			}
			if names, _ := os.ReadDir(secretDir); len(names) != 2 {
				t.Fatalf("the secret directory now holds %d entries", len(names))
			}

			// A tree in: the session's, its link kept as a link; an archive that climbs out
			// of the workdir is refused.
			tree := filepath.Join(t.TempDir(), "tree")
			os.MkdirAll(filepath.Join(tree, "sub"), 0o755)
			os.WriteFile(filepath.Join(tree, "sub", "a"), []byte("a"), 0o644)
			os.Symlink(secretDir, filepath.Join(tree, "l"))
			d.ok("cp", tree, id+":up")
			if err := unix.Lstat(filepath.Join(work, "up", "sub", "a"), &st); err != nil || st.Uid != made.Uid {
				t.Fatalf("up/sub/a: uid %d (%v), want the session's %d", st.Uid, err, made.Uid)
			}
			if l, err := os.Readlink(filepath.Join(work, "up", "l")); err != nil || l != secretDir {
				t.Fatalf("up/l: %q %v", l, err)
			}
			var arch bytes.Buffer
			tw := tar.NewWriter(&arch)
			tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4})
			tw.Write([]byte("EVIL"))
			tw.Close()
			up := exec.Command(filepath.Join(binDir, "roostctl"), "cp", "-", id+":x")
			up.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
			up.Stdin = &arch
			if out, err := up.CombinedOutput(); err == nil || !strings.Contains(string(out), "climbs out of the workdir") {
				t.Errorf("cp - of an archive naming ../escape: %v %s", err, out)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(work), "escape")); err == nil {
				t.Error("../escape was written beside the workdir")
			}

			// Ended: read, never written.
			d.ok("stop", "--grace", "1s", id)
			if out := d.ok("files", "cat", id, "d/ok"); out != "fine\n" {
				t.Fatalf("cat d/ok once ended: %q", out)
			}
			for _, args := range [][]string{{"cp", src, id + ":d/late.txt"}, {"files", "rm", id, "d/ok"}, {"files", "mkdir", id, "late"}} {
				if res := d.ctl(args...); res.code == 0 || !strings.Contains(res.stderr, "read-only") {
					t.Errorf("roostctl %s on an ended session: exit %d %q", strings.Join(args, " "), res.code, res.stderr)
				}
			}
			if _, err := os.Lstat(filepath.Join(work, "d", "ok")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// benchDaemon starts roostd for a benchmark, as newDaemon does for a test, and dials it.
func benchDaemon(b *testing.B) (roostv1.FilesServiceClient, func(args ...string) string) {
	b.Helper()
	state := b.TempDir()
	os.Chmod(filepath.Dir(state), 0o711)
	socket := filepath.Join(state, "roostd.sock")
	cmd := exec.Command(filepath.Join(binDir, "roostd"), "--state-dir", state, "--socket", socket, "--metrics-addr", "127.0.0.1:0")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	ctl := func(args ...string) string {
		c := exec.Command(filepath.Join(binDir, "roostctl"), args...)
		c.Env = append(os.Environ(), "ROOST_SOCKET="+socket)
		c.Dir = repoRoot()
		out, err := c.Output()
		if err != nil {
			b.Fatalf("roostctl %v: %v\n%s", args, err, log.String())
		}
		return string(out)
	}
	b.Cleanup(func() {
		for _, id := range strings.Fields(ctl("ps", "-q")) {
			exec.Command(filepath.Join(binDir, "roostctl"), "--socket", socket, "kill", id).Run()
		}
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		// What unmountUnder does for a test: the binds roostd left, deepest first.
		mounts, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(state))
		slices.SortStableFunc(mounts, func(x, y *mountinfo.Info) int { return len(y.Mountpoint) - len(x.Mountpoint) })
		for _, m := range mounts {
			unix.Unmount(m.Mountpoint, unix.MNT_DETACH)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c := exec.Command(filepath.Join(binDir, "roostctl"), "--socket", socket, "version"); c.Run() == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("roostd did not come up:\n%s", log.String())
		}
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return roostv1.NewFilesServiceClient(conn), ctl
}

// WriteFile then ReadFile of 1 MiB and of 100 MiB through roostd's socket, into a scoped
// session's workdir; the throughput counts both ways.
func BenchmarkFilesWriteRead(b *testing.B) {
	c, ctl := benchDaemon(b)
	dir := b.TempDir()
	cmd, _ := json.Marshal([]string{"/bin/sh", "-c", "sleep 600"})
	os.WriteFile(filepath.Join(dir, "capsule.yaml"), fmt.Appendf(nil, "name: bench\nversion: 0.1.0\nrun:\n  command: %s\ncapabilities:\n  containment: scoped\n  shell:\n    allow: [sleep]\n", cmd), 0o644)
	id := strings.TrimSpace(ctl("run", "-d", dir))
	for _, size := range []int{1 << 20, 100 << 20} {
		data := bytes.Repeat([]byte("0123456789abcdef"), size/16)
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			b.SetBytes(int64(2 * size))
			ctx := context.Background()
			for b.Loop() {
				w, err := c.WriteFile(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := w.Send(&roostv1.WriteFileRequest{Part: &roostv1.WriteFileRequest_Header{Header: &roostv1.WriteFileHeader{Session: id, Path: "blob"}}}); err != nil {
					b.Fatal(err)
				}
				for off := 0; off < len(data); off += 256 << 10 {
					if err := w.Send(&roostv1.WriteFileRequest{Part: &roostv1.WriteFileRequest_Data{Data: data[off:min(len(data), off+256<<10)]}}); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := w.CloseAndRecv(); err != nil {
					b.Fatal(err)
				}
				r, err := c.ReadFile(ctx, &roostv1.ReadFileRequest{Session: id, Path: "blob"})
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				for {
					resp, err := r.Recv()
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					n += len(resp.GetData())
				}
				if n != size {
					b.Fatalf("read %d of %d bytes", n, size)
				}
			}
		})
	}
}
