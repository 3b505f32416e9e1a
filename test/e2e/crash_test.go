package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
)

// TestCrashRecovery SIGKILLs roostd at random moments while sealed sessions are staged,
// launched and ending, restarts it each time, and then checks that nothing was lost: every
// session that ran has exactly its program's exit code and every line it printed, a session
// recorded lost never ran, no container, cgroup or mount of an ended session is left, and a
// follower that reconnected across every restart saw every event once, in order.
//
// With a warm pool, kills also land while sandboxes made ahead wait or are being claimed;
// a daemon started again without the pool must leave nothing of them.
func TestCrashRecovery(t *testing.T) {
	testenv.NeedRoot(t, "sealed sessions need root")
	t.Run("cold", func(t *testing.T) { crashRecovery(t, false) })
	t.Run("warm-pool", func(t *testing.T) { crashRecovery(t, true) })
}

func crashRecovery(t *testing.T, pool bool) {
	const kills = 5

	// Capsules of different lifetimes and exit codes; the name says what to expect.
	type want struct{ lines, code int }
	wants := map[string]want{}
	var capsules []string
	for k := range 8 {
		w := want{lines: 2 + 3*k, code: k % 5}
		name := fmt.Sprintf("crash-%d-%d", w.lines, w.code)
		wants[name] = w
		caps := "capabilities:\n  containment: sealed\n  shell:\n    allow: [seq, sleep, printf]\n"
		if k == 7 {
			// Of another shape, which the pool keeps sandboxes of too (--warm-pool-capsule).
			caps += "  network:\n    unix_sockets: true\n"
		}
		capsules = append(capsules, capsule(t, name,
			// Every line comes from a program in /usr, so a session whose root broke across a
			// restart loses lines.
			fmt.Sprintf(`for i in $(seq 1 %d); do /usr/bin/printf "line %%s\n" $i; sleep 0.05; done; exit %d`, w.lines, w.code),
			caps))
	}
	var d *daemon
	if pool {
		d = newDaemon(t, "--warm-pool", "3", "--warm-pool-capsule", capsules[7]+"=2")
	} else {
		d = newDaemon(t)
	}

	follower := exec.Command(filepath.Join(binDir, "roostctl"), "events", "--follow", "--json")
	follower.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	var followed, followErr bytes.Buffer
	var followedMu sync.Mutex
	follower.Stderr = &followErr
	pipe, _ := follower.StdoutPipe()
	if err := follower.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			followedMu.Lock()
			followed.WriteString(sc.Text() + "\n")
			followedMu.Unlock()
		}
	}()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Run refuses while the daemon is down; that is part of the test.
			d.ctl("run", "--detach", capsules[i%len(capsules)])
			time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
		}
	}()
	for range kills {
		time.Sleep(time.Duration(300+rand.IntN(900)) * time.Millisecond)
		d.kill9()
		time.Sleep(time.Duration(rand.IntN(500)) * time.Millisecond)
		d.start()
	}
	close(stop)
	wg.Wait()

	// Let every session end (the longest runs about a second).
	var list []session
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		list = d.ps()
		live := 0
		for _, s := range list {
			if s.State != "exited" && s.State != "staged" {
				live++
			}
		}
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions still live after 30s", live)
		}
	}

	ran, lost, warm, warmShaped := 0, 0, 0, 0
	for _, s := range list {
		if s.State == "staged" {
			continue
		}
		if s.Warm {
			warm++
			if s.Capsule.Name == "crash-23-2" {
				warmShaped++
			}
		}
		w := wants[s.Capsule.Name]
		logs := d.ok("logs", s.ID)
		switch s.ExitStatus {
		case "lost", "start_failed":
			// Only a launch the daemon died in the middle of, before the program ran.
			if logs != "" {
				t.Errorf("%s %s: %s (%s), yet its program printed %q\nroostd:\n%s", s.ID, s.Capsule.Name, s.ExitStatus, s.Detail, logs, d.log)
			}
			lost++
			continue
		}
		ran++
		if s.ExitCode == nil || *s.ExitCode != w.code {
			t.Errorf("%s %s: exit %s %v, want code %d (%s)", s.ID, s.Capsule.Name, s.ExitStatus, s.ExitCode, w.code, s.Detail)
		}
		var lines []string
		for i := 1; i <= w.lines; i++ {
			lines = append(lines, "line "+strconv.Itoa(i))
		}
		if want := strings.Join(lines, "\n") + "\n"; logs != want {
			files, _ := os.ReadDir(s.RecordsDir)
			var names []string
			for _, f := range files {
				info, _ := f.Info()
				names = append(names, fmt.Sprintf("%s(%d)", f.Name(), info.Size()))
			}
			trace, _ := os.ReadFile(filepath.Join(s.RecordsDir, "trace.jsonl"))
			t.Errorf("%s %s: logs %q, want %d lines; %s %v %q; records %v\n%s", s.ID, s.Capsule.Name, logs, w.lines, s.ExitStatus, *s.ExitCode, s.Detail, names, trace)
		}
	}
	t.Logf("%d kills; %d sessions ran and were checked (%d warm, %d of them in the unix_sockets capsule's shape), %d never ran, %d stayed staged",
		kills, ran, warm, warmShaped, lost, len(list)-ran-lost)
	if ran == 0 {
		t.Fatal("no session ran")
	}
	if pool && warm == 0 {
		t.Fatal("no session started warm")
	}
	if pool {
		// The last daemon's sandboxes wait; one killed, and a daemon without a pool started
		// in its place, must free every one.
		waiting, _ := filepath.Glob(filepath.Join(d.stateDir, "containers", "warm-*"))
		if len(waiting) == 0 {
			t.Error("no warm sandbox waits at the end")
		}
		// What must go is there first: their cgroups and pinned network namespaces.
		for _, sb := range waiting {
			for _, p := range append(cgroupDirs(t, filepath.Base(sb)), filepath.Join(d.stateDir, "netns", filepath.Base(sb))) {
				if _, err := os.Stat(p); err != nil {
					t.Errorf("warm sandbox %s before the kill: %v", filepath.Base(sb), err)
				}
			}
		}
		d.kill9()
		d.args = nil
		d.start()
		if left, _ := filepath.Glob(filepath.Join(d.stateDir, "records", "warm", "*")); len(left) != 0 {
			t.Errorf("warm records directories left: %v", left)
		}
		for _, sb := range waiting {
			for _, dir := range cgroupDirs(t, filepath.Base(sb)) {
				if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("cgroup of warm sandbox %s left: %s (%v)", filepath.Base(sb), dir, err)
				}
			}
			if _, err := os.Stat(filepath.Join(d.stateDir, "netns", filepath.Base(sb))); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("network namespace of warm sandbox %s left pinned: %v", filepath.Base(sb), err)
			}
		}
	}

	// Nothing of the ended sessions is left.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		entries, _ := os.ReadDir(filepath.Join(d.stateDir, "containers"))
		if len(entries) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container state left: %v", entries)
		}
	}
	ids := map[string]bool{}
	for _, s := range list {
		ids[s.ID] = true
	}
	// By id: what a session that started cold had. One that started warm was in its
	// sandbox's cgroup, whose name no record keeps; the waiting sandboxes' are checked above.
	for id := range ids {
		for _, dir := range cgroupDirs(t, id) {
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup of an ended session left: %s (%v)", dir, err)
			}
		}
	}
	if left := d.sessionMounts(); len(left) != 0 {
		t.Errorf("mounts under the state dir remain on the host: %v", left)
	}

	// The follower, reconnecting after every kill, saw exactly the registry's events.
	all := d.events(0)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		followedMu.Lock()
		n := strings.Count(followed.String(), "\n")
		followedMu.Unlock()
		if n >= len(all) {
			break
		}
	}
	follower.Process.Signal(syscall.SIGTERM)
	follower.Wait()
	followedMu.Lock()
	var got []event
	sc := bufio.NewScanner(&followed)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("follower line %q: %v", sc.Text(), err)
		}
		got = append(got, ev)
	}
	followedMu.Unlock()
	for i, ev := range all {
		if ev.Seq != strconv.Itoa(i+1) {
			t.Fatalf("registry event %d has seq %s", i, ev.Seq)
		}
	}
	if !slices.Equal(got, all) {
		t.Fatalf("follower saw %d events, registry has %d; first difference at %d\nfollower stderr:\n%s", len(got), len(all), firstDiff(got, all), followErr.String())
	}
}

func firstDiff(a, b []event) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// The acceptance scenario: five sealed sessions of different lifetimes and exit codes,
// roostd SIGKILLed after a second and started again ten seconds later, when every one has
// ended while no daemon watched.
func TestFiveSealedAcrossRestart(t *testing.T) {
	testenv.NeedRoot(t, "sealed sessions need root")
	d := newDaemon(t)
	sleeps := []int{1, 2, 4, 6, 8}
	ids := make([]string, len(sleeps))
	for i, s := range sleeps {
		ids[i] = strings.TrimSpace(d.ok("run", "--detach", capsule(t, fmt.Sprintf("five-%d", i),
			fmt.Sprintf(`echo "start %d"; sleep %d; echo "end %d"; exit %d`, i, s, i, i),
			"capabilities:\n  containment: sealed\n  shell:\n    allow: [sleep]\n")))
	}
	// Killed once every one has started (the shortest runs a second, so it may end first,
	// as it could have after the second this once slept)...
	for i, id := range ids {
		waitFor(t, fmt.Sprintf("session %d to start", i), func() bool { return strings.Contains(d.ok("logs", id), fmt.Sprintf("start %d\n", i)) })
	}
	recs := make([]session, len(ids))
	for i, id := range ids {
		recs[i] = d.inspect(id)
	}
	d.kill9()
	// ...and started again once every one has ended while no daemon watched.
	for i := range recs {
		waitFor(t, fmt.Sprintf("session %d to end with no daemon", i), func() bool { return programEnded(recs[i]) })
	}
	d.start()
	for i, id := range ids {
		s := d.inspect(id)
		if s.State != "exited" || s.ExitCode == nil || *s.ExitCode != i {
			t.Errorf("session %d: %s %s %v (%s)", i, s.State, s.ExitStatus, s.ExitCode, s.Detail)
		}
		if logs, want := d.ok("logs", id), fmt.Sprintf("start %d\nend %d\n", i, i); logs != want {
			t.Errorf("session %d: logs %q, want %q", i, logs, want)
		}
	}
	if entries := d.sessionContainers(); len(entries) != 0 {
		t.Fatalf("container state left: %v", entries)
	}
	if left := d.sessionMounts(); len(left) != 0 {
		t.Errorf("mounts under the state dir remain on the host: %v", left)
	}
}
