package session

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/containment/idsweep"
	"roost.dev/roost/pkg/session/store"
)

// leaveBehind is a program that leaves, outside its session's trees, what a uid can: SysV
// shared memory, a semaphore set and a message queue, 0600 files in /tmp and /dev/shm, and
// a daemon in a session of its own. It notes their ids in its workdir.
const leaveBehind = `set -e
umask 077
ipcmk -M 4096 -p 0600 | awk '{print $NF}' > shm
ipcmk -S 1 -p 0600 | awk '{print $NF}' > sem
ipcmk -Q -p 0600 | awk '{print $NF}' > msg
echo "secret of $ROOST_SESSION_ID" > /tmp/roost-leftover-$ROOST_SESSION_ID
echo "secret of $ROOST_SESSION_ID" > /dev/shm/roost-leftover-$ROOST_SESSION_ID
setsid sleep 1000 </dev/null >/dev/null 2>&1 &
echo $! > daemon
`

type leftBehind struct {
	shm, sem, msg, daemon int
	files                 []string
}

func readLeftBehind(t *testing.T, rec *store.Record) leftBehind {
	t.Helper()
	num := func(name string) int {
		data, err := os.ReadFile(filepath.Join(rec.Workdir, name))
		if err != nil {
			t.Fatalf("%s: %v (the program: %q)", name, err, rec.Detail)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			t.Fatalf("%s: %q", name, data)
		}
		return n
	}
	l := leftBehind{shm: num("shm"), sem: num("sem"), msg: num("msg"), daemon: num("daemon"),
		files: []string{"/tmp/roost-leftover-" + rec.ID, "/dev/shm/roost-leftover-" + rec.ID}}
	t.Cleanup(func() {
		syscall.Kill(l.daemon, syscall.SIGKILL)
		for _, a := range [][]string{{"-m", fmt.Sprint(l.shm)}, {"-s", fmt.Sprint(l.sem)}, {"-q", fmt.Sprint(l.msg)}} {
			exec.Command("ipcrm", a...).Run()
		}
		for _, f := range l.files {
			os.Remove(f)
		}
	})
	return l
}

func ipcThere(l leftBehind) error {
	var d unix.SysvShmDesc
	_, err := unix.SysvShmCtl(l.shm, unix.IPC_STAT, &d)
	return err
}

func running(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(data), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// asUID runs argv as uid, as the next session on its range would, and returns its stderr.
func asUID(uid uint32, argv ...string) (string, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// failingSweeper stands for a daemon killed before its sweep: nothing is swept.
type failingSweeper struct{}

func (failingSweeper) Sweep(idsweep.Ranges) (idsweep.Report, error) {
	return idsweep.Report{}, errors.New("roostd was killed before it swept")
}

// TestRangeReuseFindsNothing: a session leaves SysV objects, files in /tmp and /dev/shm
// and a daemonised process; while they are there, a process of its uid reads them (the
// attack works). Once it is removed, the next session, given the same range, finds none
// of them, and the daemon is gone. A range whose sweep did not happen (a daemon killed
// first) is handed to no one until a restarted daemon sweeps it.
func TestRangeReuseFindsNothing(t *testing.T) {
	testenv.NeedRoot(t, "sessions run as uids of their own")
	for _, tool := range []string{"ipcmk", "ipcrm", "setsid"} {
		_, err := exec.LookPath(tool)
		testenv.Need(t, tool, err)
	}
	for _, crash := range []bool{false, true} {
		t.Run(map[bool]string{false: "swept at rm", true: "swept after a restart"}[crash], func(t *testing.T) {
			state := stateDir(t)
			cfg := testConfig(state, &recorder{})
			cfg.IDs = store.IDPool{First: testPool.First, Slots: 2} // one range for sessions
			if crash {
				cfg.Sweeper = failingSweeper{}
			}
			m, err := Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { m.Close() }()
			a, err := m.Stage(StageOptions{Capsule: capsule(t, leaveBehind, "")})
			if err != nil {
				t.Fatal(err)
			}
			if a, err = m.Launch(t.Context(), a.ID); err != nil {
				t.Fatal(err)
			}
			a = waitEnd(t, m, a.ID)
			if a.ExitStatus != store.StatusOK {
				t.Fatalf("the leaving session: %s %q", a.ExitStatus, a.Detail)
			}
			left := readLeftBehind(t, a)
			uid := a.IDs.First
			// A process of the range outside the session, as a host user running a setuid
			// copy the session planted would start (the runtime ends the session's own).
			host := exec.Command("setsid", "sleep", "1000")
			host.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
			if err := host.Start(); err != nil {
				t.Fatal(err)
			}
			go host.Wait()
			t.Cleanup(func() { host.Process.Kill() })
			left.daemon = host.Process.Pid

			// The attack works while nothing sweeps: the uid's next process reads it all.
			if err := ipcThere(left); err != nil {
				t.Fatalf("control: the shared memory it made is not there: %v", err)
			}
			if !running(left.daemon) {
				t.Fatalf("control: its daemon %d does not run", left.daemon)
			}
			for _, f := range left.files {
				if out, err := asUID(uid, "cat", f); err != nil || !strings.Contains(out, "secret of "+a.ID) {
					t.Fatalf("control: uid %d cannot read %s: %v %q", uid, f, err, out)
				}
			}

			if err := m.Remove(a.ID); err != nil {
				t.Fatal(err)
			}
			if crash {
				if _, err := m.Stage(StageOptions{Capsule: capsule(t, "true", "")}); !errdefs.IsResourceExhausted(err) {
					t.Fatalf("a range not swept was handed out: %v", err)
				}
				if !running(left.daemon) {
					t.Fatal("nothing was swept, yet the daemon is gone: this run proves nothing")
				}
				m.Close()
				cfg.Sweeper = nil
				if m, err = Open(cfg); err != nil {
					t.Fatal(err)
				}
			}
			probe := `for f in /tmp/roost-leftover-` + a.ID + ` /dev/shm/roost-leftover-` + a.ID + `; do cat $f 2>&1 || true; done
kill -0 ` + strconv.Itoa(left.daemon) + ` 2>&1 && echo daemon-alive || true
ipcs -m -i ` + strconv.Itoa(left.shm) + ` 2>&1 | head -1 || true
`
			b, err := m.Stage(StageOptions{Capsule: capsule(t, probe, "")})
			if err != nil {
				t.Fatal(err)
			}
			if b.IDs.First != uid {
				t.Fatalf("the next session got range %d, not %d: this run proves nothing", b.IDs.First, uid)
			}
			if b, err = m.Launch(t.Context(), b.ID); err != nil {
				t.Fatal(err)
			}
			waitEnd(t, m, b.ID)
			out, _ := logs(t, m, b.ID)
			t.Logf("the next session found:\n%s", out)
			for _, f := range left.files {
				if !strings.Contains(out, f+": No such file or directory") {
					t.Errorf("the next session on the range did not meet ENOENT for %s", f)
				}
			}
			if strings.Contains(out, "secret of") || strings.Contains(out, "daemon-alive") {
				t.Errorf("the next session found what the last left")
			}
			var d unix.SysvShmDesc
			if _, err := unix.SysvShmCtl(left.shm, unix.IPC_STAT, &d); !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EIDRM) {
				t.Errorf("the shared memory after the sweep: %v, want EINVAL", err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for running(left.daemon) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if running(left.daemon) {
				t.Errorf("the daemon %d survived rm", left.daemon)
			}
			st := m.Status()
			if st.Ranges["held"] != 1 || st.Ranges["quarantined"] != 0 || len(st.Quarantined) != 0 {
				t.Errorf("ranges after: %v %+v", st.Ranges, st.Quarantined)
			}
		})
	}
}

// TestRangesBoundedPerTreeAndForSpawns: ended children keep their ranges, so one tree
// could take the block: sessions.ids.per_tree refuses its next spawn, naming the limit, the
// tree and its count; sessions.ids.spawns caps all spawned sessions together, and the
// operator can still stage with every spawn's range taken. A child removed gives its
// range back.
func TestRangesBoundedPerTreeAndForSpawns(t *testing.T) {
	d := newDelegationWith(t, func(cfg *Config) {
		cfg.IDs = store.IDPool{First: testPool.First, Slots: 10} // 9 ranges for sessions
		cfg.RangesPerTree, cfg.RangesForSpawns = 3, 4
	})
	d.push("parent", "sleep 30", parentCaps)
	d.push("worker", "true", "")
	a := d.start("parent")
	var kids []string
	for range 2 {
		res, err := d.spawn(a, "worker", "", true)
		if err != nil {
			t.Fatal(err)
		}
		kids = append(kids, res.SessionID)
	}
	_, err := d.spawn(a, "worker", "", true)
	if err == nil || !strings.Contains(err.Error(), "the delegation tree of "+a.ID+" holds 3 id ranges, sessions.ids.per_tree (3)") {
		t.Fatalf("a third child of a tree of 3: %v", err)
	}
	if ev := boundsLimitEvent(t, d.m, a.ID, store.LimitIDRanges); !strings.Contains(ev, "sessions.ids.per_tree") {
		t.Fatalf("event: %q", ev)
	}
	// Removing an ended child gives its range back to the tree.
	if err := d.m.Remove(kids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := d.spawn(a, "worker", "", true); err != nil {
		t.Fatalf("after a child was removed: %v", err)
	}
	b := d.start("parent")
	for range 2 {
		if _, err := d.spawn(b, "worker", "", true); err != nil {
			t.Fatal(err)
		}
	}
	// Four spawned ranges are held: no tree may take a fifth.
	c := d.start("parent")
	_, err = d.spawn(c, "worker", "", true)
	if err == nil || !strings.Contains(err.Error(), "spawned sessions hold 4 id ranges, sessions.ids.spawns (4)") {
		t.Fatalf("a fifth spawned range: %v", err)
	}
	// The operator's reserve: a top-level stage still gets a range.
	if _, err := d.m.Stage(StageOptions{Capsule: "parent@0.1.0"}); err != nil {
		t.Fatalf("the operator's stage with every spawn range taken: %v", err)
	}
}

// TestSessionIDNotInCommandLines: other users of the host read every command line (ps), and
// a session's id names its paths: no process roost starts for a session shows it. The scan
// finds what the program put in its own command line, so it would find the id too.
func TestSessionIDNotInCommandLines(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	const marker = "roost-cmdline-marker"
	rec := run(t, m, StageOptions{Capsule: capsule(t, "sleep 30; : "+marker, "")})
	t.Cleanup(func() { m.Kill(t.Context(), rec.ID, syscall.SIGKILL) })
	var sawMarker bool
	var withID []string
	deadline := time.Now().Add(10 * time.Second)
	for !sawMarker && time.Now().Before(deadline) {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if _, err := strconv.Atoi(e.Name()); err != nil {
				continue
			}
			cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err != nil {
				continue
			}
			if strings.Contains(string(cmdline), marker) {
				sawMarker = true
			}
			if strings.Contains(string(cmdline), rec.ID) {
				withID = append(withID, strings.ReplaceAll(string(cmdline), "\x00", " "))
			}
		}
	}
	if !sawMarker {
		t.Fatal("control: the scan did not find the program's own command line")
	}
	if len(withID) > 0 {
		t.Fatalf("command lines name the session: %q", withID)
	}
}

// recordingSweeper notes every range it is asked to sweep.
type recordingSweeper struct{ swept []idsweep.Range }

func (r *recordingSweeper) Sweep(rs idsweep.Ranges) (idsweep.Report, error) {
	r.swept = append(r.swept, rs...)
	return idsweep.Report{}, nil
}

// TestSweepActsOnlyWithinTheBlock: a range let go under one block and left unswept is not
// swept once the daemon's block has moved (its ids are no longer roostd's to act on): it
// is forgotten. The same range under the same block is swept (the control).
func TestSweepActsOnlyWithinTheBlock(t *testing.T) {
	for _, moved := range []bool{false, true} {
		state := stateDir(t)
		cfg := testConfig(state, &recorder{})
		cfg.IDs, cfg.Sweeper = store.IDPool{First: testPool.First, Slots: 4}, failingSweeper{}
		m, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		// It runs on its range, which is to be swept once it is removed.
		rec := run(t, m, StageOptions{Capsule: capsule(t, "true", "")})
		waitEnd(t, m, rec.ID)
		if err := m.Remove(rec.ID); err != nil {
			t.Fatal(err)
		}
		m.Close()
		rs := &recordingSweeper{}
		cfg.Sweeper = rs
		if moved {
			cfg.IDs = store.IDPool{First: testPool.First + 16*65536, Slots: 4}
		}
		if m, err = Open(cfg); err != nil {
			t.Fatal(err)
		}
		st := m.Status()
		m.Close()
		switch {
		case moved && (len(rs.swept) != 0 || st.Ranges["quarantined"] != 0):
			t.Errorf("the block moved, yet range %d was swept (%v) or kept (%v)", rec.IDs.First, rs.swept, st.Ranges)
		case !moved && (len(rs.swept) != 1 || rs.swept[0].First != rec.IDs.First || st.Ranges["quarantined"] != 0):
			t.Errorf("control: range %d under its own block: swept %v, ranges %v", rec.IDs.First, rs.swept, st.Ranges)
		}
	}
}
