package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// statsLine is one object of stats --format json.
type statsLine struct {
	ID               string   `json:"id"`
	Name             string   `json:"name"`
	Capsule          string   `json:"capsule"`
	State            string   `json:"state"`
	CPUPercent       *float64 `json:"cpu_percent"`
	MemoryBytes      int64    `json:"memory_bytes"`
	MemoryLimitBytes int64    `json:"memory_limit_bytes"`
	MemoryPercent    *float64 `json:"memory_percent"`
	Pids             int64    `json:"pids"`
	PidsLimit        int64    `json:"pids_limit"`
	WorkdirBytes     int64    `json:"workdir_bytes"`
}

// stats --no-stream of a scoped session shows its cgroup's ceilings as its manifest set
// them, what it uses, and what its workdir holds once the program wrote a file of known size.
func TestStatsNoStream(t *testing.T) {
	d := newDaemon(t)
	const fileSize = 3_000_000
	dir := capsule(t, "hog", "head -c 3000000 /dev/zero > blob; echo ready > ready; sleep 60",
		"capabilities:\n  containment: scoped\n  shell:\n    allow: [head, sleep]\n  resources:\n    cgroup_memory_bytes: 100663296\n    cgroup_pids_max: 50\n")
	id := strings.TrimSpace(d.ok("run", "-d", "--name", "hog-1", dir))
	s := d.inspect(id)
	waitFor(t, "the program's file", func() bool {
		_, err := os.Stat(filepath.Join(s.Workdir, "ready"))
		return err == nil
	})

	// roostd measures a workdir at most every 2 s (as its workdir bound does), so the file
	// shows within a few seconds.
	var st statsLine
	deadline := time.Now().Add(15 * time.Second)
	for {
		out := d.ok("stats", "--no-stream", "--format", "json", "hog-1")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 1 {
			t.Fatalf("stats --no-stream --format json of one session:\n%s", out)
		}
		if err := json.Unmarshal([]byte(lines[0]), &st); err != nil {
			t.Fatalf("%v: %s", err, lines[0])
		}
		if st.WorkdirBytes >= fileSize || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st.ID != id || st.Name != "hog-1" || st.Capsule != "hog@0.1.0" || st.State != "running" {
		t.Fatalf("who: %+v", st)
	}
	if st.MemoryLimitBytes != 100663296 || st.PidsLimit != 50 {
		t.Fatalf("ceilings: memory %d, pids %d; want 100663296, 50", st.MemoryLimitBytes, st.PidsLimit)
	}
	if st.MemoryBytes <= 0 || st.MemoryPercent == nil || *st.MemoryPercent <= 0 || st.Pids < 2 {
		t.Fatalf("use: %+v", st)
	}
	if st.WorkdirBytes < fileSize {
		t.Fatalf("workdir %d bytes after a %d-byte file", st.WorkdirBytes, fileSize)
	}
	// --no-stream samples twice and shows the second: it has a CPU %.
	if st.CPUPercent == nil {
		t.Fatalf("stats --no-stream has no CPU %%: %+v", st)
	}

	// The table: the name, the ceiling beside the use, the pids' ceiling, the workdir.
	table := d.ok("stats", "--no-stream", id[len(id)-12:])
	rows := strings.Split(strings.TrimSpace(table), "\n")
	if len(rows) != 2 || !strings.HasPrefix(rows[0], "SESSION") || !strings.Contains(rows[0], "MEM / LIMIT") {
		t.Fatalf("stats --no-stream:\n%s", table)
	}
	for _, want := range []string{"hog-1", "hog@0.1.0", "/ 96.0 MiB", "/ 50", "2.9 MiB"} {
		if !strings.Contains(rows[1], want) {
			t.Errorf("row %q lacks %q", rows[1], want)
		}
	}
	if cells := strings.Fields(rows[1]); len(cells) < 3 || !strings.HasSuffix(cells[2], "%") {
		t.Errorf("row %q has no CPU %%", rows[1])
	}
	// Without SESSIONs: every live session, this one among them.
	if all := d.ok("stats", "--no-stream"); !strings.Contains(all, "hog-1") {
		t.Fatalf("stats --no-stream:\n%s", all)
	}

	if res := d.ctl("stats", "--no-stream", "ses_nosuch"); res.code != 1 || !strings.Contains(res.stderr, "ses_nosuch") {
		t.Fatalf("stats of an unknown session: %+v", res)
	}
	if res := d.ctl("stats", "--format", "yaml"); res.code != 2 {
		t.Fatalf("stats --format yaml: %+v", res)
	}
}

// Watched, a session that ends shows "exited" once and drops off; stats of named sessions
// ends when they all have. Without SESSIONs it watches until Ctrl-C, which exits 0.
func TestStatsStreamSeesTheEnd(t *testing.T) {
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "idle", "sleep 60", "")))

	cmd := exec.Command(filepath.Join(binDir, "roostctl"), "stats", "--format", "json", id)
	cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan statsLine)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var st statsLine
			if err := json.Unmarshal(sc.Bytes(), &st); err != nil {
				t.Errorf("%v: %s", err, sc.Text())
				return
			}
			lines <- st
		}
	}()
	next := func() (statsLine, bool) {
		select {
		case st, ok := <-lines:
			return st, ok
		case <-time.After(20 * time.Second):
			t.Fatal("stats stopped sampling")
		}
		return statsLine{}, false
	}
	first, _ := next()
	second, _ := next()
	if first.State != "running" || first.CPUPercent != nil || second.CPUPercent == nil {
		t.Fatalf("the first two samples: %+v, %+v", first, second)
	}
	d.ok("kill", id)
	var last statsLine
	for {
		st, ok := next()
		if !ok {
			break
		}
		last = st
	}
	if last.State != "exited" {
		t.Fatalf("the last sample of an ended session: %+v", last)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("stats of a session that ended: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stats kept going after its only session ended")
	}

	// Every live session, until Ctrl-C.
	all := exec.Command(filepath.Join(binDir, "roostctl"), "stats")
	all.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	allOut, _ := all.StdoutPipe()
	if err := all.Start(); err != nil {
		t.Fatal(err)
	}
	defer all.Process.Kill()
	header := make(chan string, 1)
	go func() {
		r := bufio.NewReader(allOut)
		line, _ := r.ReadString('\n')
		header <- line
		// Keep reading, so a full pipe never holds stats up.
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case h := <-header:
		if !strings.HasPrefix(h, "SESSION") {
			t.Fatalf("stats printed %q first", h)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("stats printed nothing")
	}
	all.Process.Signal(syscall.SIGINT)
	go func() { done <- all.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("stats after Ctrl-C: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stats did not end on Ctrl-C")
	}
}

// stats --no-stream's CPU % is the rate between its two samples: a session spinning shows
// a core's worth or near it (the host's other work takes some), an idle one near 0, in
// JSON and in the table.
func TestStatsNoStreamCPU(t *testing.T) {
	d := newDaemon(t)
	scoped := "capabilities:\n  containment: scoped\n  shell:\n    allow: [sleep]\n"
	d.ok("run", "-d", "--name", "spin", capsule(t, "spin", "while :; do :; done", scoped))
	d.ok("run", "-d", "--name", "idle", capsule(t, "idle", "sleep 300", scoped))
	// Past the sessions' start, when sh and sleep are exec'd and loaded.
	time.Sleep(time.Second)

	cpu := map[string]float64{}
	start := time.Now()
	out := d.ok("stats", "--no-stream", "--json", "spin", "idle")
	took := time.Since(start)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var st statsLine
		if err := json.Unmarshal([]byte(line), &st); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		if st.CPUPercent == nil {
			t.Fatalf("stats --no-stream --json without a CPU %%: %s", line)
		}
		cpu[st.Name] = *st.CPUPercent
	}
	t.Logf("stats --no-stream took %v: spin %.1f%%, idle %.1f%%", took, cpu["spin"], cpu["idle"])
	if len(cpu) != 2 || cpu["spin"] < 30 || cpu["spin"] > 210 || cpu["idle"] > 5 {
		t.Fatalf("CPU %% of a spinning and an idle session: %v", cpu)
	}
	if took < 500*time.Millisecond {
		t.Fatalf("stats --no-stream took %v: not two samples 500 ms apart", took)
	}

	table := d.ok("stats", "--no-stream", "spin")
	rows := strings.Split(strings.TrimSpace(table), "\n")
	if len(rows) != 2 {
		t.Fatalf("stats --no-stream spin:\n%s", table)
	}
	cells := strings.Fields(rows[1])
	if len(cells) < 3 || !strings.HasSuffix(cells[2], "%") {
		t.Fatalf("stats --no-stream spin shows no CPU %%:\n%s", table)
	}
	if p, err := strconv.ParseFloat(strings.TrimSuffix(cells[2], "%"), 64); err != nil || p < 30 {
		t.Fatalf("stats --no-stream spin shows CPU %q:\n%s", cells[2], table)
	}
}
