package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The workdir guard through roostd: what a session holds on disk, counted by descriptors,
// ends it past resources.workdir_max_bytes or workdir_max_inodes, in sealed and in scoped;
// its children count against it; rm takes a session's whole tree.

// bwCaps is a capabilities block for class with shell.allow and further lines.
func bwCaps(class, shell, extra string) string {
	return fmt.Sprintf("capabilities:\n  containment: %s\n  shell:\n    allow: [%s]\n  limits:\n    deadline_seconds: 120\n%s", class, shell, extra)
}

// bwWhat is what the detail says was measured: a scoped session's TMPDIR is on the host's
// disk, a sealed one's /tmp a tmpfs bounded by size.
func bwWhat(class string, children bool) string {
	parts := []string{"workdir", "home"}
	if class == "scoped" {
		parts = append(parts, "TMPDIR")
	}
	if children {
		parts = append(parts, "children's workdirs")
	}
	return "the " + strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

// bwLimitEvents returns the details of the session.limit events of id.
func bwLimitEvents(t *testing.T, d *daemon, id string) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(strings.NewReader(d.ok("events", "--json")))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev struct {
			Type      string `json:"type"`
			SessionID string `json:"session_id"`
			Detail    string `json:"detail"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event line %q: %v", sc.Text(), err)
		}
		if ev.Type == "session.limit" && ev.SessionID == id {
			out = append(out, ev.Detail)
		}
	}
	return out
}

// bwEnded runs dir detached, waits for its end and checks it was terminated with a detail
// holding every one of want, and a session.limit event for limit saying the same.
func bwEnded(t *testing.T, d *daemon, dir, limit string, want ...string) session {
	t.Helper()
	id := strings.TrimSpace(d.ok("run", "--detach", dir))
	d.ctlWithin(3*time.Minute, "wait", id)
	s := d.inspect(id)
	if s.State != "exited" || s.ExitStatus != "terminated" {
		t.Fatalf("%s: %s %s %q\nlogs: %s", s.Capsule.Name, s.State, s.ExitStatus, s.Detail, d.ctl("logs", id).stdout)
	}
	for _, w := range want {
		if !strings.Contains(s.Detail, w) {
			t.Fatalf("%s: the detail %q lacks %q", s.Capsule.Name, s.Detail, w)
		}
	}
	var events []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		events = bwLimitEvents(t, d, id)
		if len(events) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(events) != 1 || !strings.HasPrefix(events[0], limit+": ") || !strings.Contains(events[0], want[len(want)-1]) {
		t.Fatalf("%s: session.limit events %q, want one %s", s.Capsule.Name, events, limit)
	}
	return s
}

// 300,000 empty files: no bytes to speak of, but the host's inodes. Stopped at 10,000.
func TestBoundsWorkdirInodeFlood(t *testing.T) {
	outer := newDaemon(t)
	for _, class := range []string{"sealed", "scoped"} {
		t.Run(class, func(t *testing.T) {
			d := outer.in(t)
			dir := capsule(t, "flood", `i=0; while [ $i -lt 300000 ]; do : > f$i; i=$((i+1)); done; echo made them all; sleep 10`,
				bwCaps(class, "sleep", "  resources:\n    workdir_max_inodes: 10000\n"))
			s := bwEnded(t, d, dir, "workdir_inodes", bwWhat(class, false)+" hold ", " files and directories, past resources.workdir_max_inodes (10000)")
			if strings.Contains(d.ctl("logs", s.ID).stdout, "made them all") {
				t.Error("the program made all its files before it was stopped")
			}
		})
	}
}

// bwDeepScript builds, one relative cd at a time, 300 levels of 250-character names (a
// path of 75 KB, far past PATH_MAX), then writes 8 MB at the bottom.
var bwDeepScript = `n=` + strings.Repeat("d", 250) + `; i=0
while [ $i -lt 300 ]; do mkdir $n && cd -P $n || exit 9; i=$((i+1)); done
head -c 8000000 /dev/urandom > big && echo wrote; sleep 10`

func TestBoundsWorkdirDeepPath(t *testing.T) {
	outer := newDaemon(t)
	for _, class := range []string{"sealed", "scoped"} {
		t.Run(class, func(t *testing.T) {
			d := outer.in(t)
			dir := capsule(t, "deep", bwDeepScript, bwCaps(class, "mkdir, head, sleep", "  resources:\n    workdir_max_bytes: 4194304\n"))
			s := bwEnded(t, d, dir, "workdir_bytes", bwWhat(class, false)+" grew to ", "past resources.workdir_max_bytes (4194304)")
			// And rm takes it all, deep as it is.
			doomed := []string{s.Workdir, filepath.Join(d.stateDir, "home", s.ID)}
			bwMustExist(t, doomed)
			d.ok("rm", s.ID)
			bwMustBeGone(t, "rm", doomed)
		})
	}
}

// A scoped session's TMPDIR is its own directory on the host's disk: it counts with the
// workdir. (A sealed session's /tmp is a tmpfs of at most workdir_max_bytes.)
func TestBoundsWorkdirScopedTmpdir(t *testing.T) {
	d := newDaemon(t)
	dir := capsule(t, "tmpfill", `head -c 8000000 /dev/urandom > "$TMPDIR/big" && echo wrote; sleep 10`,
		bwCaps("scoped", "head, sleep", "  resources:\n    workdir_max_bytes: 4194304\n"))
	bwEnded(t, d, dir, "workdir_bytes", "the workdir, home and TMPDIR grew to ", "past resources.workdir_max_bytes (4194304)")
}

// A child's workdir is charged to its parent: each writes 2.5 MB under a limit of 4 MiB, and
// the parent is stopped for the two together; its child ends with it, before the parent's
// wait returns. rm of the parent then takes the child: record, workdir, home and the
// parent's children/ directory.
func TestBoundsWorkdirChildren(t *testing.T) {
	outer := newDaemon(t)
	limit := "  resources:\n    workdir_max_bytes: 4194304\n"
	for _, class := range []string{"sealed", "scoped"} {
		t.Run(class, func(t *testing.T) {
			d := outer.in(t)
			d.push(capsule(t, "filler-"+class, `head -c 2500000 /dev/urandom > theirs && echo wrote; sleep 30`, bwCaps(class, "head, sleep", limit)))
			parent := capsule(t, "parent-"+class, apiShell+`
api -d '{"capsule":"filler-`+class+`","version":"0.1.0"}' "$ROOST_ENDPOINT/v1/spawn" > spawned.json
while [ ! -s spawned.json ]; do sleep 0.1; done
head -c 2500000 /dev/urandom > mine && echo wrote; sleep 30`,
				bwCaps(class, "curl, head, sleep", limit+"  spawn:\n    allow: [filler-"+class+"]\n"))
			p := bwEnded(t, d, parent, "workdir_bytes", bwWhat(class, true)+" grew to ", "past resources.workdir_max_bytes (4194304)")
			kids := d.byCapsule("filler-" + class)
			if len(kids) != 1 {
				t.Fatalf("%d children: %+v\nparent's logs: %s", len(kids), kids, d.ctl("logs", p.ID).stdout)
			}
			c := d.inspect(kids[0].ID)
			if c.State != "exited" || c.ExitStatus != "terminated" || !strings.Contains(c.Detail, "its parent "+p.ID+" ended") {
				t.Fatalf("child, once its parent's wait returned: %s %s %q", c.State, c.ExitStatus, c.Detail)
			}
			doomed := []string{p.Workdir, c.Workdir, c.RecordsDir, filepath.Join(d.stateDir, "home", p.ID), filepath.Join(d.stateDir, "home", c.ID)}
			// Only a parent without a sealed root has a directory for its children's
			// workdirs; a sealed one's children work beneath its own workdir.
			if class != "sealed" {
				doomed = append(doomed, filepath.Join(d.stateDir, "children", p.ID))
			}
			bwMustExist(t, doomed)
			d.ok("rm", p.ID)
			if res := d.ctl("inspect", c.ID); res.code != 1 || !strings.Contains(res.stderr, `no session "`+c.ID+`"`) {
				t.Errorf("the child is still recorded after rm of its parent")
			}
			bwMustBeGone(t, "rm", doomed)
		})
	}
}

// rm refuses a tree with a live session in it; rm -f kills the tree and removes it.
func TestBoundsWorkdirRmTree(t *testing.T) {
	d := newDaemon(t)
	d.push(capsule(t, "sleeper", "sleep 60", sealedCaps("sleep", "", 90)))
	parent := capsule(t, "parent", apiShell+`
api -d '{"capsule":"sleeper","version":"0.1.0"}' "$ROOST_ENDPOINT/v1/spawn" >/dev/null
sleep 60
`, sealedCaps("curl, sleep", "sleeper", 120))
	id := strings.TrimSpace(d.ok("run", "--detach", parent))
	var child session
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if kids := d.byCapsule("sleeper"); len(kids) == 1 && kids[0].State == "running" {
			child = kids[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child never ran: %+v\n%s", d.ps(), d.log)
		}
	}
	if res := d.ctl("rm", id); res.code != 1 || !strings.Contains(res.stderr, "stop it before removing it") {
		t.Fatalf("rm of a live tree: %+v", res)
	}
	if len(d.ps()) != 2 {
		t.Fatalf("a refused rm removed something: %+v", d.ps())
	}
	doomed := []string{child.Workdir, child.RecordsDir, filepath.Join(d.stateDir, "home", child.ID), filepath.Join(d.stateDir, "home", id)}
	bwMustExist(t, doomed)
	if out := d.ok("rm", "-f", id); strings.TrimSpace(out) != id {
		t.Fatalf("rm -f: %q", out)
	}
	if left := d.ps(); len(left) != 0 {
		t.Fatalf("after rm -f: %+v", left)
	}
	bwMustBeGone(t, "rm -f", doomed)
}

// bwMustExist checks, before an rm, that each path it is to take is there: a check that
// it is gone afterwards proves nothing of a path nothing made (or of an empty one).
func bwMustExist(t *testing.T, paths []string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Lstat(p); p == "" || err != nil {
			t.Fatalf("before rm, %q is not there to be removed: %v", p, err)
		}
	}
}

// bwMustBeGone checks that rm took each of paths.
func bwMustBeGone(t *testing.T, rm string, paths []string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survived %s: %v", p, rm, err)
		}
	}
}
