package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// seqOffset is where line k (numbered from 1) of `seq 1 n` begins.
func seqOffset(k int64) int64 {
	var off int64
	for digits, lo := int64(1), int64(1); lo < k; digits, lo = digits+1, lo*10 {
		hi := min(lo*10, k)
		off += (hi - lo) * (digits + 1)
	}
	return off
}

type logStats struct {
	WrittenBytes string `json:"written_bytes"`
	DroppedBytes string `json:"dropped_bytes"`
	MaxBytes     string `json:"max_bytes"`
	FailedBytes  string `json:"failed_bytes"`
}

func (d *daemon) logStats(id string) (stdout, stderr logStats) {
	d.t.Helper()
	var s struct {
		Stdout *logStats `json:"stdout"`
		Stderr *logStats `json:"stderr"`
	}
	if err := json.Unmarshal([]byte(d.ok("inspect", "--json", id)), &s); err != nil {
		d.t.Fatal(err)
	}
	if s.Stdout == nil || s.Stderr == nil {
		d.t.Fatalf("inspect --json of %s has no log stats", id)
	}
	return *s.Stdout, *s.Stderr
}

func atoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

// consecutive checks that lines are the numbers from first on, one per line.
func consecutive(t *testing.T, what string, lines []string, first int64) {
	t.Helper()
	for i, l := range lines {
		if l != strconv.FormatInt(first+int64(i), 10) {
			t.Fatalf("%s: line %d is %.40q, want %d", what, i, l, first+int64(i))
		}
	}
}

const floodCaps = "capabilities:\n  containment: sealed\n  shell:\n    allow: [seq]\n  limits:\n    deadline_seconds: 120\n  resources:\n    log_max_bytes: 8388608\n"

var cutMarker = regexp.MustCompile(`\n--- roost: (\d+) bytes of stdout dropped here \(resources\.log_max_bytes 8388608\) ---\n`)

// A sealed capsule floods 1 GiB of numbered lines under log_max_bytes 8 MiB: its records
// stay within the cap, it is never held up, logs shows how it started, the cut and how it
// ended, and inspect counts what was written and dropped.
func TestBoundsLogsFlood(t *testing.T) {
	const maxBytes, lines = 8 << 20, 120_000_000
	total := seqOffset(lines + 1)
	d := newDaemon(t)
	start := time.Now()
	id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "flood", "seq 1 120000000", floodCaps)))
	if res := d.ctl("wait", id); res.code != 0 {
		t.Fatalf("wait: %+v", res)
	}
	took := time.Since(start)
	s := d.inspect(id)
	entries, err := os.ReadDir(s.RecordsDir)
	if err != nil {
		t.Fatal(err)
	}
	var size int64
	var names []string
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			size += info.Size()
			names = append(names, e.Name())
		}
	}
	t.Logf("%d bytes in %s (%.0f MB/s, run to end through roostd); records: %d bytes in %v", total, took.Round(time.Millisecond), float64(total)/took.Seconds()/1e6, size, names)
	if size > maxBytes+1<<20 {
		t.Fatalf("the records directory holds %d bytes, past the cap %d + 1 MiB", size, maxBytes)
	}

	logs := d.ok("logs", id)
	m := cutMarker.FindAllStringSubmatchIndex(logs, -1)
	if len(m) != 1 {
		t.Fatalf("%d cut markers in %d bytes of logs: %.200q", len(m), len(logs), logs)
	}
	head, tail := logs[:m[0][0]], logs[m[0][1]:]
	dropped := atoi(t, logs[m[0][2]:m[0][3]])
	// How it started: the first lines, whole, up to where the head was cut.
	headLines := strings.Split(head, "\n")
	consecutive(t, "head", headLines[:len(headLines)-1], 1)
	// How it ended: a run of the newest lines up to the last one.
	if !strings.HasSuffix(tail, "\n120000000\n") {
		t.Fatalf("logs end %q", tail[max(0, len(tail)-40):])
	}
	tailLines := strings.Split(strings.TrimSuffix(tail, "\n"), "\n")[1:]
	firstTail := atoi(t, tailLines[0])
	consecutive(t, "tail", tailLines, firstTail)
	// The head is what roost-init kept first (stdout.log). The marker stands on a line of its
	// own: when the head ends with a newline it is the marker's leading one in the text, so
	// the head's length comes from the file, not from the text before the marker.
	headFile, err := os.ReadFile(filepath.Join(s.RecordsDir, "stdout.log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSuffix(string(headFile), "\n") != head {
		t.Fatalf("logs' head (%d bytes) is not stdout.log (%d bytes)", len(head), len(headFile))
	}
	kept := int64(len(headFile) + len(tail))
	if kept+dropped != total || kept > maxBytes {
		t.Fatalf("kept %d + dropped %d != written %d", kept, dropped, total)
	}

	out, errStats := d.logStats(id)
	if atoi(t, out.WrittenBytes) != total || atoi(t, out.DroppedBytes) != dropped || atoi(t, out.MaxBytes) != maxBytes || atoi(t, out.FailedBytes) != 0 {
		t.Fatalf("inspect --json stdout %+v; want %d written, %d dropped", out, total, dropped)
	}
	if errStats.WrittenBytes != "0" || errStats.DroppedBytes != "0" {
		t.Fatalf("inspect --json stderr %+v", errStats)
	}
	if human := d.ok("inspect", id); !regexp.MustCompile(`stdout:\s+1\.0 GiB written, 1\.0 GiB dropped past resources\.log_max_bytes \(8\.0 MiB`).MatchString(human) {
		t.Fatalf("inspect:\n%s", human)
	}
}

// logs -f of a session that floods keeps up: it goes on showing newer lines, in order,
// skipping (and marking) what the cap drops while it reads.
func TestBoundsLogsFollowFlood(t *testing.T) {
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "flood", "seq 1 100000000000", floodCaps)))
	t.Cleanup(func() { d.ctl("kill", id) })
	cmd := exec.Command(filepath.Join(binDir, "roostctl"), "logs", "-f", id)
	cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	type seen struct {
		line    int64
		markers int
	}
	progress := make(chan seen, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var last int64
		markers := 0
		// A line is judged once the next is read: the one before a marker, and the one
		// after it, may be parts of a line the cut went through; the next one resumes.
		pending, afterCut := "", 0
		judge := func(l string, nextIsMarker bool) bool {
			if nextIsMarker {
				return true
			}
			if afterCut == 1 {
				afterCut = 2
				return true
			}
			n, err := strconv.ParseInt(l, 10, 64)
			if afterCut == 2 && err == nil && n > last {
				afterCut, last = 0, n
				return true
			}
			if err != nil || n != last+1 {
				t.Errorf("line %.40q after %d: out of order", l, last)
				return false
			}
			last = n
			return true
		}
		for sc.Scan() {
			l := sc.Text()
			marker := strings.HasPrefix(l, "--- roost: ")
			if pending != "" && !judge(pending, marker) {
				return
			}
			pending = l
			if marker {
				markers++
				pending, afterCut = "", 1
				continue
			}
			select {
			case <-progress:
			default:
			}
			progress <- seen{last, markers}
		}
	}()
	var current seen
	latest := func(wait time.Duration) seen {
		for deadline := time.After(wait); ; {
			select {
			case current = <-progress:
			case <-deadline:
				return current
			}
		}
	}
	prev := latest(2 * time.Second)
	for i := range 3 {
		// What the capsule has written by now: logs -f must be past it a moment later.
		out, _ := d.logStats(id)
		written := atoi(t, out.WrittenBytes)
		cur := latest(1500 * time.Millisecond)
		t.Logf("second %d: line %d (%d markers); the capsule had written %d bytes (line ~%d)", i, cur.line, cur.markers, written, lineAt(written))
		if cur.line <= prev.line || seqOffset(cur.line) < written {
			t.Fatalf("logs -f fell behind: line %d after %d; %d bytes written before", cur.line, prev.line, written)
		}
		prev = cur
	}
	if prev.markers == 0 {
		t.Fatalf("no cut marked in a flood")
	}
	if out := d.ok("stop", id); !strings.Contains(out, "terminated") {
		t.Fatalf("stop: %s", out)
	}
}

// lineAt is the number of the line of `seq` output that holds byte offset off.
func lineAt(off int64) int64 {
	lo, hi := int64(1), int64(1)<<40
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if seqOffset(mid) <= off {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}
