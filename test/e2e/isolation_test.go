package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// isolationBlock is these tests' block of host ids: one range for sessions, so the next
// session is given the last one's range, and a block no other test's daemon uses (a freed
// range is swept: what runs on it is killed).
const isolationBlock = 0x56000000

// leaveOnHost is a program that leaves, outside its trees, what its uid can, noting each
// thing it managed to leave: SysV shared memory, a semaphore set, a message queue, 0600
// files in /tmp and /dev/shm.
const leaveOnHost = `umask 077
ipcmk -M 4096 -p 0600 2>/dev/null | awk '{print $NF}' > shm
ipcmk -S 1 -p 0600 2>/dev/null | awk '{print $NF}' > sem
ipcmk -Q -p 0600 2>/dev/null | awk '{print $NF}' > msg
echo "secret of $ROOST_SESSION_ID" > /tmp/roost-e2e-left-$ROOST_SESSION_ID && echo /tmp/roost-e2e-left-$ROOST_SESSION_ID >> files
echo "secret of $ROOST_SESSION_ID" > /dev/shm/roost-e2e-left-$ROOST_SESSION_ID && echo /dev/shm/roost-e2e-left-$ROOST_SESSION_ID >> files
true
`

// TestRangeSweptBeforeReuse: an advisory session and a scoped one each leave what their
// uid can outside their trees, and a host user's process runs as that uid (a setuid copy
// the session planted, say). While the session is recorded the uid's next process reads it
// all (the attack works); after rm — and a SIGKILL of roostd before the next stage — the
// next session, given the same range, finds none of it, and the process is gone.
func TestRangeSweptBeforeReuse(t *testing.T) {
	for _, tool := range []string{"ipcmk", "ipcs", "setsid"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
	}
	cfg := filepath.Join(t.TempDir(), "roostd.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("sessions:\n  ids:\n    first: %d\n    slots: 2\n", isolationBlock)), 0o644); err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t, "--config", cfg)
	for _, class := range []string{"advisory", "scoped"} {
		t.Run(class, func(t *testing.T) {
			caps := "capabilities:\n  containment: " + class + "\n  shell:\n    allow: [sh, ipcmk, awk, cat, \"true\", ipcs, head]\n"
			res := d.ctl("run", "--json", capsule(t, "leave", leaveOnHost, caps))
			if res.code != 0 {
				t.Fatalf("run: %+v", res)
			}
			a := d.ps()[len(d.ps())-1]
			a = d.inspect(a.ID)
			uid := uint32(isolationBlock + 65536)
			read := func(name string) string {
				data, _ := os.ReadFile(filepath.Join(a.Workdir, name))
				return strings.TrimSpace(string(data))
			}
			// What the session made that the host sees (a scoped session's /tmp is its own).
			var files []string
			for _, f := range strings.Fields(read("files")) {
				if _, err := os.Lstat(f); err == nil {
					files = append(files, f)
				}
			}
			shm, _ := strconv.Atoi(read("shm"))
			if class == "advisory" && (len(files) != 2 || shm == 0) {
				t.Fatalf("control: an advisory session could not leave its files and shared memory: %q %q (%s)", files, read("shm"), a.Detail)
			}
			for _, f := range files {
				cmd := exec.Command("cat", f)
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
				if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "secret of "+a.ID) {
					t.Fatalf("control: uid %d cannot read %s: %v %q", uid, f, err, out)
				}
			}
			host := exec.Command("setsid", "sleep", "1000")
			host.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
			if err := host.Start(); err != nil {
				t.Fatal(err)
			}
			go host.Wait()
			t.Cleanup(func() { host.Process.Kill() })

			d.ok("rm", a.ID)
			d.kill9()
			d.start()

			probe := "for f in " + strings.Join(append(files, "/tmp/roost-e2e-none"), " ") + "; do cat $f 2>&1; done\n" +
				"kill -0 " + strconv.Itoa(host.Process.Pid) + " 2>&1 && echo process-alive\n"
			if shm != 0 {
				probe += "ipcs -m -i " + strconv.Itoa(shm) + " 2>&1 | head -1\n"
			}
			res = d.ctl("run", capsule(t, "probe", probe, caps))
			b := d.ps()[len(d.ps())-1]
			t.Logf("the next session found:\n%s", res.stdout)
			var who struct {
				Identity struct {
					UID uint32 `json:"uid"`
				} `json:"identity"`
			}
			if err := json.Unmarshal([]byte(d.ok("inspect", "--json", b.ID)), &who); err != nil || who.Identity.UID != uid {
				t.Fatalf("the next session runs as %d, not %d (%v): this run proves nothing", who.Identity.UID, uid, err)
			}
			if !strings.Contains(res.stdout, "/tmp/roost-e2e-none: No such file or directory") {
				t.Fatalf("control: the probe's own ENOENT is missing: %q", res.stdout)
			}
			for _, f := range files {
				if !strings.Contains(res.stdout, f+": No such file or directory") {
					t.Errorf("the next session did not meet ENOENT for %s", f)
				}
			}
			if strings.Contains(res.stdout, "secret of") || strings.Contains(res.stdout, "process-alive") {
				t.Errorf("the next session found what the last one left")
			}
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				if _, err := os.Stat(fmt.Sprintf("/proc/%d", host.Process.Pid)); err != nil {
					break
				}
				if data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", host.Process.Pid)); strings.Contains(string(data), ") Z") {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", host.Process.Pid)); err == nil && !strings.Contains(string(data), ") Z") {
				t.Errorf("the range's process %d survived rm", host.Process.Pid)
			}
			d.ok("rm", b.ID)
		})
	}
}

// TestPushThroughTheOperatorsOwnLink: roostd follows only root's links on the path to a
// tree, so a link another user owns is refused when roostd is handed it; roostctl resolves
// the operator's own links before it asks, so pushing through one works.
func TestPushThroughTheOperatorsOwnLink(t *testing.T) {
	d := newDaemon(t)
	dir := capsule(t, "linked", "echo hi", "")
	parent := t.TempDir()
	link := filepath.Join(parent, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if out := d.ctl("push", link); out.code != 0 || !strings.Contains(out.stdout+out.stderr, "linked@0.1.0") {
		t.Fatalf("push through a link: %+v", out)
	}
}
