package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
)

// waitWarm waits until roostd has n sandboxes made ahead, as its metrics say.
func waitWarm(t *testing.T, d *daemon, n int) {
	t.Helper()
	want := fmt.Sprintf("roost_warm_sandboxes %d\n", n)
	var got string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + d.metricsAddr + "/metrics"); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got = string(body)
			if strings.Contains(got, want) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in roostd's metrics after 30s\nroostd:\n%s", want, d.log)
		}
	}
}

// TestWarmPool: with roostd --warm-pool, a sealed session that fits starts in a sandbox made
// ahead, says so in inspect and its trace, and explain says it would; one that does not fit
// starts cold and explain names why. Stopping roostd ends every sandbox no session claimed.
func TestWarmPool(t *testing.T) {
	testenv.NeedRoot(t, "sealed sessions need root")
	d := newDaemon(t, "--warm-pool", "2")
	fits := capsule(t, "warm-fits", `echo "uid map $(cat /proc/self/uid_map)"; exit 3`,
		"capabilities:\n  containment: sealed\n  shell:\n    allow: [cat]\n")
	other := capsule(t, "warm-other", `echo cold`, "capabilities:\n  containment: sealed\n  network:\n    unix_sockets: true\n")

	if out := d.ok("explain", fits); !strings.Contains(strings.Join(strings.Fields(out), " "), "start warm: roostd keeps 2 sealed sandboxes ready") {
		t.Errorf("explain of a capsule that fits:\n%s", out)
	}
	if out := d.ok("explain", other); !strings.Contains(strings.Join(strings.Fields(out), " "), "start cold: warm sandboxes are made with a default capsule's seccomp filter (network.unix_sockets)") {
		t.Errorf("explain of a capsule that does not fit:\n%s", out)
	}
	waitWarm(t, d, 2)
	res := d.ctl("run", fits)
	if res.code != 3 || !strings.Contains(res.stdout, "uid map") {
		t.Fatalf("run in a warm sandbox: exit %d\n%s%s\nroostd:\n%s", res.code, res.stdout, res.stderr, d.log)
	}
	list := d.ps()
	s := list[len(list)-1]
	if !s.Warm {
		t.Errorf("the session did not start warm:\n%s", d.log)
	}
	if out := d.ok("inspect", s.ID); !strings.Contains(out, "start:        warm") {
		t.Errorf("inspect does not say warm:\n%s", out)
	}
	if trace, _ := os.ReadFile(filepath.Join(s.RecordsDir, "trace.jsonl")); !bytes.Contains(trace, []byte(`"start":"warm"`)) {
		t.Errorf("the trace does not say warm:\n%s", trace)
	}
	// The session's uid range is the sandbox's: the one its uid_map maps onto is the one
	// inspect names.
	uidMap := strings.Fields(strings.TrimPrefix(strings.TrimSpace(res.stdout), "uid map"))
	if len(uidMap) != 3 || uidMap[0] != "0" || uidMap[1] != fmt.Sprint(d.identity(s.ID).Identity.UID) {
		t.Errorf("the warm session's uid_map %q; inspect says it runs as host uid %d", uidMap, d.identity(s.ID).Identity.UID)
	}

	if res := d.ctl("run", other); res.code != 0 || res.stdout != "cold\n" {
		t.Fatalf("run of a capsule that does not fit: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	list = d.ps()
	if list[len(list)-1].Warm {
		t.Error("a session that does not fit started warm")
	}
	// A second warm session, from the other sandbox: no two sessions share a range, warm
	// or cold (each holds its own until rm).
	waitWarm(t, d, 2)
	if res := d.ctl("run", fits); res.code != 3 {
		t.Fatalf("a second run in a warm sandbox: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	owner := map[uint32]string{}
	list = d.ps()
	for _, o := range list {
		uid := d.identity(o.ID).Identity.UID
		if prev, ok := owner[uid]; ok {
			t.Errorf("sessions %s and %s share host uid %d", prev, o.ID, uid)
		}
		owner[uid] = o.ID
	}
	if len(list) != 3 || !list[2].Warm {
		t.Errorf("sessions: %+v; want three, the last warm", list)
	}

	waitWarm(t, d, 2)
	sandboxes, _ := filepath.Glob(filepath.Join(d.stateDir, "containers", "warm-*"))
	if len(sandboxes) != 2 {
		t.Fatalf("sandboxes waiting: %v", sandboxes)
	}
	sandboxPaths := func(sb string) []string {
		id := filepath.Base(sb)
		return append([]string{sb, filepath.Join(d.stateDir, "netns", id), filepath.Join(d.stateDir, "records", "warm", id)}, cgroupDirs(t, id)...)
	}
	// Each is there while the sandboxes wait, so that their absence after means something.
	for _, sb := range sandboxes {
		for _, p := range sandboxPaths(sb) {
			if _, err := os.Stat(p); err != nil {
				t.Errorf("a waiting sandbox: %v", err)
			}
		}
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.cmd.Wait()
	for _, sb := range sandboxes {
		for _, p := range sandboxPaths(sb) {
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s left after roostd stopped: %v", p, err)
			}
		}
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); bytes.Contains(mounts, []byte(filepath.Join(d.stateDir, "netns", "warm-"))) {
		t.Error("a warm sandbox's network namespace is still pinned")
	}
}

// TestWarmPoolCapsuleShapes: roostd --warm-pool-capsule keeps sandboxes made for a
// capsule's own shape (here its seccomp variant, network.unix_sockets), which sessions of
// it take, while others take the default capsule's; a session that fits neither starts
// cold and explain names how it differs from each. A capsule that would not start sealed is
// refused at roostd's start, naming it.
func TestWarmPoolCapsuleShapes(t *testing.T) {
	testenv.NeedRoot(t, "sealed sessions need root")
	sockets := capsule(t, "warm-sockets", `grep Seccomp: /proc/self/status; exit 5`,
		"capabilities:\n  containment: sealed\n  network:\n    unix_sockets: true\n  shell:\n    allow: [grep]\n")
	plain := capsule(t, "warm-plain", `echo plain`, "capabilities:\n  containment: sealed\n")
	neither := capsule(t, "warm-neither", `echo neither`, "capabilities:\n  containment: sealed\n  filesystem:\n    workdir_exec: true\n")
	d := newDaemon(t, "--warm-pool", "1", "--warm-pool-capsule", sockets+"=2")

	flat := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	if out := flat(d.ok("explain", sockets)); !strings.Contains(out, "start warm: roostd keeps 2 sealed sandboxes made for capsule warm-sockets@0.1.0 ready") {
		t.Errorf("explain of the capsule a shape is made for:\n%s", out)
	}
	if out := flat(d.ok("explain", plain)); !strings.Contains(out, "start warm: roostd keeps 1 sealed sandbox ready") {
		t.Errorf("explain of a default capsule:\n%s", out)
	}
	out := flat(d.ok("explain", neither))
	if !strings.Contains(out, "start cold: warm sandboxes are made with a default capsule's") || !strings.Contains(out, "; warm sandboxes are made with capsule warm-sockets@0.1.0's") {
		t.Errorf("explain of a capsule that fits no shape does not say how it differs from each:\n%s", out)
	}

	waitWarm(t, d, 3)
	if res := d.ctl("run", sockets); res.code != 5 || !strings.Contains(res.stdout, "Seccomp:\t2") {
		t.Fatalf("run in a sandbox of the capsule's shape: exit %d\n%s%s\nroostd:\n%s", res.code, res.stdout, res.stderr, d.log)
	}
	waitWarm(t, d, 3)
	if out := d.ok("run", plain); out != "plain\n" {
		t.Fatalf("run of a default capsule: %q", out)
	}
	waitWarm(t, d, 3)
	if out := d.ok("run", neither); out != "neither\n" {
		t.Fatalf("run of a capsule that fits no shape: %q", out)
	}
	for _, s := range d.ps() {
		if want := s.Capsule.Name != "warm-neither"; s.Warm != want {
			t.Errorf("%s (%s) started warm: %v, want %v", s.ID, s.Capsule.Name, s.Warm, want)
		}
	}
	// The refill makes what each shape lacks.
	waitWarm(t, d, 3)

	unconfined := capsule(t, "warm-unconfined", `true`, "capabilities:\n  containment: advisory\n")
	missing := filepath.Join(t.TempDir(), "none")
	// A block of its own: the daemon above holds the default one.
	block := filepath.Join(t.TempDir(), "roostd.yaml")
	if err := os.WriteFile(block, []byte("sessions:\n  ids:\n    first: 1476395008\n    slots: 16\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for arg, says := range map[string]string{
		unconfined + "=1": "capsule warm-unconfined@0.1.0 (" + unconfined + ") runs advisory: only sealed sessions start in a sandbox made ahead",
		missing + "=1":    "the warm pool: capsule " + missing + ": ",
	} {
		out, err := exec.Command(filepath.Join(binDir, "roostd"), "--config", block, "--state-dir", stateDir(t), "--socket", filepath.Join(t.TempDir(), "s.sock"),
			"--metrics-addr", "", "--warm-pool-capsule", arg).CombinedOutput()
		if err == nil || !strings.Contains(string(out), says) {
			t.Errorf("roostd --warm-pool-capsule %s: %v\n%s\nwant it refused saying %q", arg, err, out, says)
		}
	}
}

// TestWarmPoolNoCarryOver: a session writes into every place it can write, leaves a
// process behind and a SysV segment; the next session from the pool sees none of it.
func TestWarmPoolNoCarryOver(t *testing.T) {
	testenv.NeedRoot(t, "sealed sessions need root")
	d := newDaemon(t, "--warm-pool", "1")
	const caps = "capabilities:\n  containment: sealed\n  shell:\n    allow: [find, ls, ps, ipcs, ipcmk, sleep, grep, cat, tr]\n"
	writer := capsule(t, "warm-writer", `for d in /work /tmp /dev/shm /root /run /run/roost /dev /dev/mqueue /var/tmp /etc /usr /capsule /; do
  echo secret > "$d/carried" 2>/dev/null && echo "wrote $d"
done
ipcmk -M 4096 >/dev/null 2>&1 && echo "made a shm segment"
(sleep 300 &) ; echo started a straggler`, caps)
	reader := capsule(t, "warm-reader", `find / -xdev -name carried 2>/dev/null
for d in /tmp /dev/shm /root /run /dev /dev/mqueue; do ls -A "$d" 2>/dev/null | grep -q carried && echo "found in $d"; done
echo "segments $(ipcs -m | grep -c '^0x')"
echo "processes $(ps -e -o comm= | grep -v -e '^ps$' -e '^grep$' -e '^sh$' -e '^tr$' | tr '\n' ' ')"
true`, caps)
	waitWarm(t, d, 1)
	out := d.ok("run", writer)
	for _, want := range []string{"wrote /work", "wrote /tmp", "wrote /dev/shm", "wrote /root", "started a straggler"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the writer could not do what the test needs (%s):\n%s", want, out)
		}
	}
	waitWarm(t, d, 1)
	got := d.ok("run", reader)
	if strings.Contains(got, "carried") || strings.Contains(got, "found in") || !strings.Contains(got, "segments 0") || !strings.Contains(got, "processes roost-init \n") {
		t.Errorf("the next warm session sees the last one's state:\n%s\n(the writer: %s)", got, out)
	}
	for _, s := range d.ps() {
		if !s.Warm {
			t.Errorf("%s %s did not start warm", s.ID, s.Capsule.Name)
		}
	}
}
