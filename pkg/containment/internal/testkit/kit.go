// Package testkit is what the containment packages' tests share: sessions' specs, runtimes
// made with the test binary's own cgroup parent, the roost-init and roost-sealer binaries
// they mount or start through, and the escape probes' helpers. It is for _test.go files
// only (external test packages: it imports every runtime), and it holds no state of its
// own: each test binary keeps its Kit in a variable of its test files.
package testkit

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/internal/cgtest"
	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/cgroups"
	"roost.dev/roost/pkg/containment/scoped"
	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/containment/sealer"
	"roost.dev/roost/pkg/containment/seccomp"
	"roost.dev/roost/pkg/manifest"
)

// Kit is one test binary's: the uid ranges it gives sessions, the binaries it builds once,
// the cgroup parent its runtimes put sessions under, and whether its sealed sessions start
// in sandboxes made ahead.
type Kit struct {
	// FirstID places the binary's sessions' uid ranges apart from roostd's default block and
	// from other test binaries', which may run at the same time.
	FirstID uint32

	slot    atomic.Uint32
	parents atomic.Int32
	warm    *bool
	cgroups *cgroups.Sessions

	initOnce sync.Once
	initBin  string
	initErr  error

	sealerOnce   sync.Once
	sealerClient *sealer.Client
	sealerErr    error
}

// Main is a test binary's TestMain: when the binary is started as roost-init or roost-exec
// (containment.RunHelper) it is that and nothing else; otherwise it runs the tests with the
// runtimes' cgroup parent a cgroup of the test binary's own,
// removed at the end from every hierarchy: what the tests leave there never reaches /roost,
// nor another test binary's sessions. It takes -warm: SealedRun then starts its sessions in
// sandboxes made ahead (roostd --warm-pool) where they fit, and make unit runs the sealed
// and hostile suites both ways.
func (k *Kit) Main(m *testing.M) int {
	if containment.RunHelper(os.Args) {
		return 0
	}
	k.warm = flag.Bool("warm", false, "start sealed test sessions in sandboxes made ahead (roostd --warm-pool) where they fit")
	if os.Geteuid() == 0 {
		parent := "/roost-unit-" + strconv.Itoa(os.Getpid())
		if c, err := cgroups.New(cgroups.Config{Parent: parent}); err == nil {
			k.cgroups = c
			defer func() {
				if err := cgtest.RemoveTree(parent); err != nil {
					fmt.Fprintln(os.Stderr, "removing the tests' cgroups:", err)
				}
			}()
		}
	}
	return m.Run()
}

// Warm says whether the binary was given -warm.
func (k *Kit) Warm() bool { return k.warm != nil && *k.warm }

// IDs is a uid range no other session of this test binary holds.
func (k *Kit) IDs() containment.IDs {
	return containment.IDs{First: k.FirstID + k.slot.Add(1)*65536, Size: 65536}
}

// options puts the binary's cgroup parent before opts, which may name another.
func (k *Kit) options(opts []containment.Option) []containment.Option {
	return append([]containment.Option{containment.WithCgroups(k.cgroups)}, opts...)
}

// NewProcessRuntime is containment.NewProcessRuntime with the binary's cgroup parent, unless
// opts name another.
func (k *Kit) NewProcessRuntime(init string, opts ...containment.Option) *containment.ProcessRuntime {
	return containment.NewProcessRuntime(init, k.options(opts)...)
}

// NewScopedRuntime is scoped.NewRuntime with the binary's cgroup parent, unless opts name
// another.
func (k *Kit) NewScopedRuntime(stateDir, init string, rehearsal containment.IDs, opts ...containment.Option) (*scoped.Runtime, error) {
	return scoped.NewRuntime(stateDir, init, rehearsal, k.options(opts)...)
}

// NewSealedRuntime is sealed.NewRuntime with the binary's cgroup parent, unless
// opts name another.
func (k *Kit) NewSealedRuntime(stateDir, init string, rehearsal containment.IDs, opts ...containment.Option) (*sealed.Runtime, error) {
	return sealed.NewRuntime(stateDir, init, rehearsal, k.options(opts)...)
}

// TestCgroups is a cgroupfs configuration whose parent is the test's own, removed with
// everything beneath it when the test ends; notes go to stateDir ("" for none).
func (k *Kit) TestCgroups(t *testing.T, stateDir string) *cgroups.Sessions {
	t.Helper()
	parent := fmt.Sprintf("/roost-test-%d-%d", os.Getpid(), k.parents.Add(1))
	c, err := cgroups.New(cgroups.Config{Parent: parent, StateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cgtest.RemoveTree(parent) })
	return c
}

// Init builds cmd/roost-init once, static, as the Makefile does: sealed roots mount it.
func (k *Kit) Init(t testing.TB) string {
	t.Helper()
	k.initOnce.Do(func() {
		dir, err := os.MkdirTemp("", "roost-init-")
		if err != nil {
			k.initErr = err
			return
		}
		k.initBin = filepath.Join(dir, containment.InitName)
		cmd := exec.Command("go", "build", "-trimpath", "-o", k.initBin, "roost.dev/roost/cmd/roost-init")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			k.initErr = fmt.Errorf("building roost-init: %v\n%s", err, out)
		}
	})
	if k.initErr != nil {
		t.Fatal(k.initErr)
	}
	return k.initBin
}

// Sealer is a roost-sealer built from cmd/roost-sealer as the Makefile builds it, shared by
// the test binary's sealed runtimes: sealed sessions start through it, as roostd's do. It
// ends with the test binary (its control socket closes).
func (k *Kit) Sealer(t *testing.T) containment.Option {
	t.Helper()
	NeedRoot(t)
	k.sealerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "roost-sealer-")
		if err != nil {
			k.sealerErr = err
			return
		}
		bin := filepath.Join(dir, sealer.Name)
		cmd := exec.Command("go", "build", "-tags", "seccomp", "-trimpath", "-o", bin, "roost.dev/roost/cmd/roost-sealer")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			k.sealerErr = fmt.Errorf("building roost-sealer: %v\n%s", err, out)
			return
		}
		k.sealerClient, k.sealerErr = sealer.NewClient(bin)
	})
	if k.sealerErr != nil {
		t.Fatal(k.sealerErr)
	}
	return containment.WithSealer(k.sealerClient)
}

// NeedRoot stops a test of sessions with a kernel sandbox unless it can run them (a failure
// on CI).
func NeedRoot(t testing.TB) {
	t.Helper()
	testenv.NeedRoot(t, "sessions with a kernel sandbox")
	if !seccomp.Built {
		testenv.Need(t, "the seccomp build tag", errors.New("built without it: run with -tags seccomp (make test does)"))
	}
}

// ReachableDir is a temporary directory the sessions' unprivileged uids can pass through,
// as they can through roostd's state directory.
func ReachableDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Spec is a session's start with its workdir owned by its ids, as roostd prepares it.
func (k *Kit) Spec(t testing.TB, argv ...string) containment.Spec {
	t.Helper()
	dir := ReachableDir(t)
	records := filepath.Join(dir, "records")
	work := filepath.Join(dir, "work")
	for _, d := range []string{records, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ids := k.IDs()
	if err := os.Chown(work, int(ids.First), int(ids.First)); err != nil {
		t.Fatal(err)
	}
	return containment.Spec{
		SessionID:  "ses_test",
		Argv:       argv,
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + work},
		Dir:        work,
		RecordsDir: records,
		IDs:        ids,
	}
}

// Policy is the policy of a capsule with the capabilities caps.
func Policy(t testing.TB, caps string) *manifest.Policy {
	t.Helper()
	m, err := manifest.Parse([]byte("name: a\nversion: 0.1.0\nrun: {command: [x]}\n"+caps), "")
	if err != nil {
		t.Fatal(err)
	}
	p := manifest.Lower(m)
	return &p
}

// WaitDone waits for the session to end and returns how it did.
func WaitDone(t *testing.T, p containment.Process) containment.ExitInfo {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("session did not end")
	}
	info, err := p.Exit()
	if err != nil {
		t.Fatalf("Exit: %v", err)
	}
	return info
}

// KillAndWait ends the session and waits until it has.
func KillAndWait(t *testing.T, p containment.Process) {
	t.Helper()
	_ = p.Signal(syscall.SIGKILL)
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("session did not end")
	}
}

// ReadFile is path's content.
func ReadFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// WaitFile waits until path exists.
func WaitFile(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
	}
	t.Fatalf("%s never appeared", path)
}

// WaitOutput waits until the session's stdout holds want.
func WaitOutput(t *testing.T, s containment.Spec, want string) string {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if data, _ := os.ReadFile(filepath.Join(s.RecordsDir, containment.StdoutFile)); strings.Contains(string(data), want) {
			return string(data)
		}
	}
	data, _ := os.ReadFile(filepath.Join(s.RecordsDir, containment.StdoutFile))
	errOut, _ := os.ReadFile(filepath.Join(s.RecordsDir, containment.StderrFile))
	t.Fatalf("no %q in the session's output:\n%s\n%s", want, data, errOut)
	return ""
}

// ExpectOutput fails unless out holds every one of wants.
func ExpectOutput(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}
