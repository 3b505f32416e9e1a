package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
)

// roostd --retain-ended 5 and 20 quick sessions: the 5 that ended last remain, their events
// with them; a replay from before the window fails and names where it starts; a follower at
// the head goes on across compactions; prune --dry-run lists, prune removes.
func TestBoundsRetention(t *testing.T) {
	d := newDaemon(t, "--retain-ended", "5")
	dir := capsule(t, "quick", "true", "")
	var ids []string
	for range 20 {
		id := strings.TrimSpace(d.ok("run", "--detach", dir))
		if res := d.ctl("wait", id); res.code != 0 {
			t.Fatalf("wait %s: %+v", id, res)
		}
		ids = append(ids, id)
	}
	var left []string
	waitFor(t, "5 sessions in ps --all", func() bool {
		left = left[:0]
		for _, s := range d.ps() {
			left = append(left, s.ID)
		}
		return len(left) == 5
	})
	if !slices.Equal(left, ids[15:]) {
		t.Fatalf("ps --all after 20 sessions under --retain-ended 5: %v, want the last five %v", left, ids[15:])
	}
	// The kept five's records and workdirs are where the removed ones' are looked for.
	for _, id := range ids[15:] {
		for _, p := range []string{filepath.Join(d.stateDir, "records", id), filepath.Join(d.stateDir, "work", id)} {
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("a kept session: %v", err)
			}
		}
	}
	for _, id := range ids[:15] {
		if _, err := os.Stat(filepath.Join(d.stateDir, "records", id)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("records of removed session %s: %v", id, err)
		}
		if _, err := os.Stat(filepath.Join(d.stateDir, "work", id)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("workdir of removed session %s: %v", id, err)
		}
	}

	// The pass that removed the last of the fifteen compacts the log after the removal ps
	// shows: wait for the window to start at a kept session's events.
	compacted := regexp.MustCompile(`^roostctl: events before (\d+) were compacted away \(by roostd --retain-ended 5, with the sessions it removed\); the oldest kept is (\d+): use --since (\d+) or later\n$`)
	var kept []event
	waitFor(t, "the event log compacted to the kept sessions", func() bool {
		res := d.ctl("events", "--since", "0")
		m := compacted.FindStringSubmatch(res.stderr)
		if res.code != 1 || m == nil || m[1] != m[2] || res.stdout != "" {
			t.Fatalf("events --since 0 after compaction: %+v", res)
		}
		res = d.ctl("events", "--json", "--since", m[3])
		if res.code != 0 {
			return false // compacted again between the two reads
		}
		kept = kept[:0]
		sc := bufio.NewScanner(strings.NewReader(res.stdout))
		for sc.Scan() {
			var ev event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("event line %q: %v", sc.Text(), err)
			}
			kept = append(kept, ev)
		}
		if len(kept) == 0 || kept[0].Seq != m[1] {
			t.Fatalf("events --since %s: %+v", m[3], kept)
		}
		return slices.Contains(ids[15:], kept[0].SessionID)
	})
	for _, ev := range kept {
		// The window holds the kept sessions' events and the latest removals.
		if !slices.Contains(ids[15:], ev.SessionID) && ev.Type != "session.removed" {
			t.Fatalf("kept event of a removed session: %+v", ev)
		}
	}

	// A follower from the head sees the next session whole, through the compaction its end
	// brings.
	head, _ := strconv.Atoi(kept[len(kept)-1].Seq)
	follow := exec.Command(filepath.Join(binDir, "roostctl"), "events", "--follow", "--json", "--since", fmt.Sprint(head))
	follow.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	stdout, _ := follow.StdoutPipe()
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	defer follow.Process.Kill()
	next := strings.TrimSpace(d.ok("run", "--detach", dir))
	d.ok("wait", next)
	followed := make(chan event, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev event
			json.Unmarshal(sc.Bytes(), &ev)
			followed <- ev
		}
		close(followed)
	}()
	var types []string
	removed := false
	for want := head + 1; !removed; want++ {
		select {
		case ev, ok := <-followed:
			if !ok {
				t.Fatalf("the follower stopped after %v", types)
			}
			if ev.Seq != fmt.Sprint(want) {
				t.Fatalf("followed seq %s, want %d", ev.Seq, want)
			}
			if ev.SessionID == next {
				types = append(types, ev.Type)
			}
			removed = ev.Type == "session.removed" && ev.SessionID == ids[15]
		case <-time.After(15 * time.Second):
			t.Fatalf("follower saw %v of %s, and not %s removed", types, next, ids[15])
		}
	}
	if !slices.Equal(types[:4], []string{"session.staged", "session.launching", "session.running", "session.exited"}) {
		t.Fatalf("followed %v", types)
	}

	// prune: a dry run lists the five and removes nothing; then they go.
	d.ok("stage", dir)
	out := d.ok("prune", "--dry-run")
	if !strings.Contains(out, "would remove 5 ended sessions") || strings.Count(out, "quick@0.1.0") != 5 {
		t.Fatalf("prune --dry-run:\n%s", out)
	}
	if n := len(d.ps()); n != 6 {
		t.Fatalf("a dry run removed sessions: %d left", n)
	}
	if out := d.ok("prune", "--until", "1h"); !strings.Contains(out, "removed 0 ended sessions") {
		t.Fatalf("prune --until 1h:\n%s", out)
	}
	var resp struct {
		Removed []struct {
			ID    string `json:"id"`
			Bytes string `json:"bytes"`
		} `json:"removed"`
		Bytes           string `json:"bytes"`
		EventsCompacted string `json:"events_compacted"`
	}
	if err := json.Unmarshal([]byte(d.ok("prune", "--json")), &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.Removed) != 5 || resp.Removed[4].ID != next || resp.Bytes == "0" || resp.EventsCompacted == "0" {
		t.Fatalf("prune --json: %+v", resp)
	}
	if list := d.ps(); len(list) != 1 || list[0].State != "staged" {
		t.Fatalf("after prune: %+v", list)
	}
	if res := d.ctl("prune", "--until", "-1h"); res.code != 2 {
		t.Fatalf("prune --until -1h: %+v", res)
	}
}

// newDaemonIn is newDaemon on a state directory the test made.
func newDaemonIn(t *testing.T, state string, args ...string) *daemon {
	t.Helper()
	d := &daemon{t: t, stateDir: state, socket: filepath.Join(t.TempDir(), "roostd.sock"), metricsAddr: freePort(t), args: args}
	if err := os.Chmod(filepath.Dir(d.socket), 0o755); err != nil {
		t.Fatal(err)
	}
	d.start()
	t.Cleanup(func() {
		if d.cmd == nil || d.cmd.ProcessState != nil {
			return
		}
		for _, id := range strings.Fields(d.ctl("ps", "-q").stdout) {
			d.ctl("kill", id)
		}
		d.cmd.Process.Signal(syscall.SIGTERM)
		d.cmd.Wait()
	})
	return d
}

// fillDisk writes a file until its filesystem has no room left.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for _, n := range []int{1 << 20, 64 << 10, 4 << 10, 1} {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
}

// The state directory's filesystem fills up: stage and run are refused with a clear
// ResourceExhausted naming the directory and its free space, counted as disk_full; sessions
// already running keep running and, once there is room, end with their exact codes (one that
// ended while the disk was full too); the registry and the ledger open whole afterwards.
func TestBoundsDiskFull(t *testing.T) {
	testenv.NeedRoot(t, "mounting a tmpfs needs root")
	state := stateDir(t)
	if err := syscall.Mount("tmpfs", state, "tmpfs", 0, "size=32m,mode=0711"); err != nil {
		testenv.Need(t, "a tmpfs mount for the state directory", err)
	}
	// Registered first, so it runs after the daemon's cleanup has stopped everything.
	t.Cleanup(func() {
		if err := syscall.Unmount(state, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", state, err)
		}
	})
	d := newDaemonIn(t, state)
	waiter := capsule(t, "waiter", "while [ ! -e go ]; do sleep 0.05; done; exit 7", "")
	later := strings.TrimSpace(d.ok("run", "--detach", waiter))
	during := strings.TrimSpace(d.ok("run", "--detach", waiter))
	// Both run before the disk fills.
	for _, id := range []string{later, during} {
		waitFor(t, id+" running", func() bool { return d.inspect(id).State == "running" })
	}

	ballast := filepath.Join(state, "ballast")
	// A failing test still frees the disk before the daemon's cleanup ends the sessions.
	t.Cleanup(func() { os.Remove(ballast) })
	fillDisk(t, ballast)
	quick := capsule(t, "quick", "true", "")
	for _, cmd := range [][]string{{"stage", quick}, {"run", quick}} {
		res := d.ctl(cmd...)
		if res.code != 125 || !strings.Contains(res.stderr, "refusing to stage a session: roostd keeps 4.0 MiB free on the state directory's filesystem") ||
			!strings.Contains(res.stderr, "the state directory "+state+" has ") || !strings.Contains(res.stderr, " free of 32.0 MiB") {
			t.Fatalf("%s on a full state dir: %+v", cmd[0], res)
		}
		t.Logf("%s: %s", cmd[0], strings.TrimSpace(res.stderr))
	}
	if got := grepLines(scrape(t, d), `roost_limit_hits_total{limit="disk_full"}`); got != `roost_limit_hits_total{limit="disk_full"} 2` {
		t.Fatalf("disk_full count: %q", got)
	}
	// What runs keeps running; one ends while the disk is still full.
	if s := d.inspect(later); s.State != "running" {
		t.Fatalf("a session on the full disk: %+v", s)
	}
	duringPID := d.identity(during).Pid
	if duringPID == 0 {
		t.Fatalf("%s has no program pid: %s", during, d.ok("inspect", during))
	}
	if err := os.WriteFile(filepath.Join(d.inspect(during).Workdir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Its end cannot reach the full disk (exit.json waits for room), but its program goes:
	// gone from the host's process table once roost-init has reaped it.
	waitFor(t, "the program of "+during+" to end on the full disk", func() bool {
		return syscall.Kill(duringPID, 0) == syscall.ESRCH
	})

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.inspect(later).Workdir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{later, during} {
		if res := d.ctlWithin(30*time.Second, "wait", id); res.code != 7 {
			t.Errorf("wait %s: %+v\n%s", id, res, d.inspect(id).Detail)
		}
	}
	if res := d.ctl("run", quick); res.code != 0 {
		t.Fatalf("run once there is room: %+v", res)
	}

	// A restart opens the registry and the ledger whole.
	d.cmd.Process.Signal(syscall.SIGTERM)
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("roostd after SIGTERM: %v\n%s", err, d.log)
	}
	d.start()
	byID := map[string]session{}
	for _, s := range d.ps() {
		byID[s.ID] = s
	}
	for _, id := range []string{later, during} {
		if s := byID[id]; s.State != "exited" || s.ExitCode == nil || *s.ExitCode != 7 {
			t.Errorf("%s after the restart: %+v", id, s)
		}
	}
	if len(byID) != 3 {
		t.Fatalf("ps --all after the restart: %+v", byID)
	}
	d.ok("spend")
}
