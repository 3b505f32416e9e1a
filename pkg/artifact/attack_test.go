package artifact

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
)

// The operator pushes (or stages) a directory an unprivileged user owns; that user, from a
// process of its own, exchanges (renameat2 RENAME_EXCHANGE) a directory of the tree, or one
// on the path to it, with a symlink to a directory of root's it cannot read, as fast as it
// can, while roostd reads. Nothing of root's directory may ever land in the store, where
// its sessions would read it.

// racePushes is how many pushes (and as many imports) each race makes. 2000 is the count
// these tests must pass at: make unit runs them so (without the race detector, which has no
// part in a race between two processes and makes each push several times slower); a plain
// go test makes 300, a few seconds' worth.
var racePushes = flag.Int("race.pushes", 300, "pushes (and imports) each race with an unprivileged attacker makes; the acceptance count is 2000")

// attackerUID is the attacker's uid and gid: nobody's, which owns nothing on the host.
const attackerUID = 65534

// exchangeEnv makes this test binary the attacker: it exchanges the two paths the variable
// names ("a:b") until its stdin closes, then prints how many exchanges it made.
const exchangeEnv = "ROOST_TEST_EXCHANGE"

func TestMain(m *testing.M) {
	if spec := os.Getenv(exchangeEnv); spec != "" {
		os.Exit(exchange(spec))
	}
	os.Exit(m.Run())
}

func exchange(spec string) int {
	a, b, ok := strings.Cut(spec, ":")
	if !ok {
		fmt.Fprintf(os.Stderr, "%s=%q: want a:b\n", exchangeEnv, spec)
		return 2
	}
	var n atomic.Int64
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		fmt.Println(n.Load())
		os.Exit(0)
	}()
	for {
		if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
			fmt.Fprintf(os.Stderr, "exchanging %s and %s: %v\n", a, b, err)
			return 1
		}
		if n.Add(1) == 1 {
			fmt.Println("exchanging")
		}
	}
}

// attack is one race: the directory pushed, the two paths the attacker exchanges, and what
// root's vault holds.
type attack struct {
	base   string
	vault  string // root's, 0700, holding marker
	marker string
	dir    string   // what the operator pushes
	a, b   string   // exchanged by the attacker
	top    *os.File // dir, opened before the race: the manifest is rewritten through it
	// refs are the trees a walk of dir may honestly see, their capsule.yaml rewritten for
	// each version checked.
	refs []string
}

// newAttack makes base, which every user may cross but only root may list or change, and
// in it root's vault: a 0700 directory holding, at each of rels, a 0600 file of the marker.
func newAttack(t *testing.T, rels ...string) *attack {
	testenv.NeedRoot(t, "the attacker runs as another uid, the vault is root's")
	base, err := os.MkdirTemp("", "roost-attack-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	x := &attack{base: base, vault: filepath.Join(base, "vault"), marker: secret(t)}
	for _, rel := range rels {
		write(t, filepath.Join(x.vault, rel), x.marker)
	}
	if err := filepath.WalkDir(x.vault, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o600)
		if d.IsDir() {
			mode = 0o700
		}
		return os.Chmod(path, mode)
	}); err != nil {
		t.Fatal(err)
	}
	return x
}

// giveAway makes everything at path the attacker's.
func giveAway(t *testing.T, path string) {
	t.Helper()
	if err := filepath.WalkDir(path, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, attackerUID, attackerUID)
	}); err != nil {
		t.Fatal(err)
	}
}

// open holds dir before the race starts, for setVersion.
func (x *attack) open(t *testing.T) {
	f, err := os.OpenFile(x.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	x.top = f
}

// setVersion rewrites the tree's capsule.yaml through the descriptor held: by its path,
// root would write into the vault half the time.
func (x *attack) setVersion(t *testing.T, version string) {
	fd, err := unix.Openat(int(x.top.Fd()), "capsule.yaml", unix.O_WRONLY|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "capsule.yaml")
	defer f.Close()
	if _, err := f.WriteString(hostileManifest(version)); err != nil {
		t.Fatal(err)
	}
}

// subdirAttack: the tree holds sub/, a directory, and link, a symlink to the vault, which
// holds a file named like sub's: the attacker exchanges sub and link.
func subdirAttack(t *testing.T) *attack {
	x := newAttack(t, "data")
	tree := filepath.Join(x.base, "tree")
	layout := func(dir, version string, subIsDir, linkIsDir bool) {
		write(t, filepath.Join(dir, "capsule.yaml"), hostileManifest(version))
		for name, isDir := range map[string]bool{"sub": subIsDir, "link": linkIsDir} {
			if isDir {
				write(t, filepath.Join(dir, name, "data"), "inside\n")
			} else if err := os.Symlink(x.vault, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	layout(tree, "0.0.0", true, false)
	giveAway(t, tree)
	x.dir, x.a, x.b = tree, filepath.Join(tree, "sub"), filepath.Join(tree, "link")
	for _, c := range [][2]bool{{true, false}, {false, true}, {true, true}, {false, false}} {
		ref := filepath.Join(t.TempDir(), "ref")
		layout(ref, "0.0.0", c[0], c[1])
		x.refs = append(x.refs, ref)
	}
	x.open(t)
	return x
}

// pathAttack: the tree is home/proj/cap, home being the attacker's; home/evil is a symlink
// to the vault, which holds a cap/ of its own, a capsule of root's with a secret in it: the
// attacker exchanges proj and evil, so the path the operator gave leads into the vault.
func pathAttack(t *testing.T) *attack {
	x := newAttack(t, "cap/data")
	write(t, filepath.Join(x.vault, "cap", "capsule.yaml"), hostileManifest("9.9.9"))
	home := filepath.Join(x.base, "home")
	x.dir = filepath.Join(home, "proj", "cap")
	write(t, filepath.Join(x.dir, "capsule.yaml"), hostileManifest("0.0.0"))
	write(t, filepath.Join(x.dir, "data"), "inside\n")
	if err := os.Symlink(x.vault, filepath.Join(home, "evil")); err != nil {
		t.Fatal(err)
	}
	giveAway(t, home)
	x.a, x.b = filepath.Join(home, "proj"), filepath.Join(home, "evil")
	ref := filepath.Join(t.TempDir(), "ref")
	write(t, filepath.Join(ref, "capsule.yaml"), hostileManifest("0.0.0"))
	write(t, filepath.Join(ref, "data"), "inside\n")
	x.refs = []string{ref}
	x.open(t)
	return x
}

// start runs the attacker: a copy of this test binary (the original's directory is root's
// alone) as attackerUID, exchanging a and b. It returns once the first exchange is made;
// stop ends it and says how many it made.
func (x *attack) start(t *testing.T) (stop func() int64) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(x.base, "bin", "attacker")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Dir = x.base
	cmd.Env = append(os.Environ(), exchangeEnv+"="+x.a+":"+x.b)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: attackerUID, Gid: attackerUID},
		Pdeathsig:  syscall.SIGKILL,
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(out)
	var once sync.Once
	var n int64
	var waitErr error
	stop = func() int64 {
		once.Do(func() {
			in.Close()
			rest, _ := io.ReadAll(r)
			waitErr = cmd.Wait()
			n, _ = strconv.ParseInt(strings.TrimSpace(string(rest)), 10, 64)
		})
		if waitErr != nil {
			t.Errorf("the attacker: %v: %s", waitErr, stderr.String())
		}
		return n
	}
	t.Cleanup(func() { stop() })
	if line, err := r.ReadString('\n'); line != "exchanging\n" {
		stop()
		t.Fatalf("the attacker did not start exchanging (%q, %v): %s", line, err, stderr.String())
	}
	return stop
}

// holdsMarker lists the files under dir, walked as a test may (it is the store's), that
// hold the vault's marker.
func (x *attack) holdsMarker(t *testing.T, dir string) []string {
	var found []string
	if err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(data, []byte(x.marker)) {
			found = append(found, path)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return found
}

// honest says what is wrong with a tree stored as digest, if anything: it must hash to
// digest, and digest must be one of the tree's own states.
func (x *attack) honest(t *testing.T, dir, digest, version string) error {
	if got, err := DigestDir(dir); err != nil || got != digest {
		return fmt.Errorf("%s hashes to %s (%v), stored as %s", dir, got, err, digest)
	}
	var legit []string
	for _, ref := range x.refs {
		write(t, filepath.Join(ref, "capsule.yaml"), hostileManifest(version))
		d, err := DigestDir(ref)
		if err != nil {
			t.Fatal(err)
		}
		legit = append(legit, d)
	}
	if !slices.Contains(legit, digest) {
		return fmt.Errorf("%s: digest %s is none of the tree's own %v", dir, digest, legit)
	}
	return nil
}

func (x *attack) race(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "artifacts"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Many pushes in little time; what they store, not that it survives a crash, is tested.
	s.db.NoSync = true
	stop := x.start(t)
	// A link swapped in on the path to the tree cannot be told from one planted there
	// for good: either is refused as an invalid path, naming the link.
	fine := func(err error) bool {
		return errdefs.IsAborted(err) || errdefs.IsInvalidArgument(err) && strings.Contains(err.Error(), "swapped in")
	}
	pushes, imports := tally{fine: fine}, tally{fine: fine}
	for i := range *racePushes {
		// A version of its own for each call, so that each one copies: a blob already
		// stored is only hashed.
		version := fmt.Sprintf("0.1.%d", i)
		x.setVersion(t, version)
		a, _, err := s.Push(x.dir)
		pushes.add(err, func() error {
			if a.Version != version {
				return fmt.Errorf("push %d stored version %s", i, a.Version)
			}
			return x.honest(t, s.Dir(a), a.SHA256, version)
		})
		version = fmt.Sprintf("0.2.%d", i)
		x.setVersion(t, version)
		im, err := s.Import(x.dir)
		imports.add(err, func() error { return x.honest(t, im.Dir, im.SHA256, version) })
	}
	n := stop()
	t.Logf("%d exchanges", n)
	if n == 0 {
		t.Fatal("the attacker never exchanged anything")
	}
	// Every blob on disk, not only those the calls returned: a call that failed may have
	// left one behind.
	if found := x.holdsMarker(t, filepath.Dir(s.blobs)); len(found) > 0 {
		t.Errorf("the vault's secret is in the store, in %d files: %q", len(found), found[:min(len(found), 5)])
	}
	for _, c := range []struct {
		what string
		*tally
	}{{"Push", &pushes}, {"Import", &imports}} {
		t.Logf("%s: %d succeeded, %d failed (the first: %v), %d wrong", c.what, c.ok, c.failed, c.firstFailure, c.wrong)
		if c.wrong > 0 {
			t.Errorf("%s: %d of %d calls went wrong; the first: %v", c.what, c.wrong, c.ok+c.failed, c.firstWrong)
		}
		if c.ok == 0 {
			t.Errorf("%s never succeeded: a walk that always fails proves nothing", c.what)
		}
	}
}

func TestAttackerSwapsASubdirectory(t *testing.T) { subdirAttack(t).race(t) }

func TestAttackerSwapsADirectoryOnThePath(t *testing.T) { pathAttack(t).race(t) }

// naiveRead reads the tree at dir as a walk by path would: filepath.WalkDir, os.ReadFile.
func naiveRead(dir string) ([]byte, error) {
	var all []byte
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(path)
		all = append(all, data...)
		return err
	})
	return all, err
}

// naiveTries is how many walks the control makes: a walk by path loses the subdirectory's
// race about once in a hundred to two hundred (the path's, about one in two), so this many
// leave no room for a control that misses by chance, and take about a second.
const naiveTries = 20000

// The control for the races above: under the same attacker, a walk by path reads the
// vault, so the race is one a walker can lose on this machine.
func TestNaiveWalkLosesTheRace(t *testing.T) {
	for name, attack := range map[string]func(*testing.T) *attack{"subdirectory": subdirAttack, "path": pathAttack} {
		t.Run(name, func(t *testing.T) {
			x := attack(t)
			stop := x.start(t)
			tries, hits, fails := naiveTries, 0, 0
			for range tries {
				data, err := naiveRead(x.dir)
				if errors.Is(err, fs.ErrNotExist) {
					fails++
				} else if err != nil {
					t.Fatal(err)
				}
				if bytes.Contains(data, []byte(x.marker)) {
					hits++
				}
			}
			n := stop()
			t.Logf("%d of %d naive walks read the vault (%d failed), over %d exchanges", hits, tries, fails, n)
			if hits == 0 {
				t.Fatalf("no naive walk of %d read the vault: the race is not reproduced here", tries)
			}
		})
	}
}
