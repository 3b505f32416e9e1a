package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
)

// Each session tree under roostd's state directory is a nosuid,nodev mount of its own once
// roostd has started, and stays one mount across restarts (a clean one and a kill -9):
// none is stacked. A setuid file a session makes in its workdir runs as whoever runs it on
// the host, not as the session; once the tree is unmounted, the same file runs as the
// session's uid (the positive control). doctor says the trees are sealed.
func TestSessionTreesSealed(t *testing.T) {
	d := newDaemon(t)
	trees := sessionTrees(d.stateDir)
	check := func(when string) {
		t.Helper()
		for _, tree := range trees {
			mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) { return m.Mountpoint != tree, false })
			if err != nil {
				t.Fatal(err)
			}
			if len(mounts) != 1 {
				var each []string
				for _, m := range mounts {
					each = append(each, fmt.Sprintf("%d (%s)", m.ID, m.Options))
				}
				t.Fatalf("%s: %s has %d mounts, want 1: %s", when, tree, len(mounts), strings.Join(each, ", "))
			}
			opts := strings.Split(mounts[0].Options, ",")
			if !slices.Contains(opts, "nosuid") || !slices.Contains(opts, "nodev") {
				t.Fatalf("%s: %s is mounted %s", when, tree, mounts[0].Options)
			}
		}
	}
	check("after start")

	var doc struct {
		Checks []struct{ Name, Status, Detail, Hint string } `json:"checks"`
	}
	if err := json.Unmarshal([]byte(d.ok("doctor", "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(doc.Checks, func(c struct{ Name, Status, Detail, Hint string }) bool {
		return c.Name == "session trees nosuid,nodev"
	})
	if i < 0 || doc.Checks[i].Status != "ok" || !strings.Contains(doc.Checks[i].Detail, filepath.Join(d.stateDir, "work")) {
		t.Fatalf("doctor's session trees check: %+v", doc.Checks)
	}

	// The session makes id(1) setuid to itself and opens its workdir to the host's users.
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "setuid", "cp /usr/bin/id ./id && chmod 4755 ./id && chmod 755 .", "")))
	if res := d.ctl("wait", id); res.code != 0 {
		t.Fatalf("the session: %+v", res)
	}
	planted := filepath.Join(d.inspect(id).Workdir, "id")
	var st syscall.Stat_t
	if err := syscall.Stat(planted, &st); err != nil || st.Mode&syscall.S_ISUID == 0 || st.Uid == 0 {
		t.Fatalf("the session's setuid file: %v, mode %o, uid %d", err, st.Mode, st.Uid)
	}
	if got := euidOf(t, planted); got != nobody {
		t.Fatalf("%s (setuid, uid %d) run by uid %d has euid %d", planted, st.Uid, nobody, got)
	}

	d.cmd.Process.Signal(syscall.SIGTERM)
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("roostd after SIGTERM: %v\n%s", err, d.log)
	}
	d.start()
	check("after a restart")
	d.kill9()
	d.start()
	check("after kill -9 and a start")
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.cmd.Wait()

	// The positive control: the same file, no longer under the seal.
	if err := unix.Unmount(filepath.Join(d.stateDir, "work"), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(planted, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Flags&unix.ST_NOSUID != 0 {
		testenv.Need(t, "a temporary directory on a mount that honours setuid bits, for the positive control", errors.New(d.stateDir+" is on a nosuid mount"))
	}
	if got := euidOf(t, planted); got != int(st.Uid) {
		t.Fatalf("unsealed, %s (setuid, uid %d) has euid %d: the check above could not have failed", planted, st.Uid, got)
	}
}

const nobody = 65534

// euidOf runs path (an id(1)) with -u as uid nobody and returns the effective uid it
// printed.
func euidOf(t *testing.T, path string) int {
	t.Helper()
	cmd := exec.Command(path, "-u")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -u as uid %d: %v\n%s", path, nobody, err, out)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(fmt.Errorf("%s -u printed %q: %w", path, out, err))
	}
	return n
}
