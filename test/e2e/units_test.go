package e2e

import (
	"encoding/json"
	"strings"
	"testing"
)

// memoryRecord is what inspect --json says of a session's memory: what it was staged with
// and, while it lives, its cgroup's memory.max (int64s are strings in proto JSON).
type memoryRecord struct {
	MemoryLimitBytes string `json:"memory_limit_bytes"`
	Usage            *struct {
		MemoryLimitBytes string `json:"memory_limit_bytes"`
	} `json:"usage"`
}

func (d *daemon) memory(id string) memoryRecord {
	d.t.Helper()
	var m memoryRecord
	if err := json.Unmarshal([]byte(d.ok("inspect", "--json", id)), &m); err != nil {
		d.t.Fatal(err)
	}
	return m
}

// run --memory lowers the capsule's resources.cgroup_memory_bytes: a capsule of 1Gi that
// holds 200 MiB runs to its end, and OOM-kills under --memory 64Mi; sealed and scoped
// cgroups get the lowered figure, an advisory session records it; one above the capsule's
// and one in docker's units are refused with run's 125, naming the flag.
func TestRunMemoryFlag(t *testing.T) {
	d := newDaemon(t)
	// tail keeps a line it has not seen the end of: 200 MiB of zeros, in memory.
	hog := capsule(t, "hog", "head -c 209715200 /dev/zero | tail >/dev/null",
		"capabilities:\n  containment: sealed\n  resources:\n    cgroup_memory_bytes: 1Gi\n  shell:\n    allow: [head, tail]\n")

	if res := d.ctl("run", hog); res.code != 0 {
		t.Fatalf("200 MiB under the capsule's 1Gi: %+v", res)
	}
	list := d.ps()
	if m := d.memory(list[len(list)-1].ID); m.MemoryLimitBytes != "1073741824" {
		t.Errorf("without --memory, memory_limit_bytes %q, want the capsule's 1073741824", m.MemoryLimitBytes)
	}

	res := d.ctl("run", "--memory", "64Mi", hog)
	list = d.ps()
	bomb := d.inspect(list[len(list)-1].ID)
	if res.code != 137 || bomb.ExitStatus != "crashed" || bomb.Detail != "oom" || bomb.Containment.Achieved != "sealed" {
		t.Fatalf("200 MiB under --memory 64Mi: exit %d, %s %q, class %q", res.code, bomb.ExitStatus, bomb.Detail, bomb.Containment.Achieved)
	}
	if m := d.memory(bomb.ID); m.MemoryLimitBytes != "67108864" {
		t.Errorf("--memory 64Mi: memory_limit_bytes %q, want 67108864", m.MemoryLimitBytes)
	}
	if out := d.ok("inspect", bomb.ID); !strings.Contains(out, "memory limit: 64Mi (67108864 bytes; cgroup memory.max, no swap)") {
		t.Errorf("inspect does not show the lowered limit:\n%s", out)
	}

	// The live cgroup's memory.max is the lowered figure; advisory's cgroup sets none.
	for class, want := range map[string]string{"sealed": "50331648", "scoped": "50331648", "advisory": "0"} {
		sleeper := capsule(t, "sleeper-"+class, "sleep 60", "capabilities:\n  containment: "+class+"\n  shell:\n    allow: [sleep]\n")
		id := strings.TrimSpace(d.ok("run", "-d", "-m", "48Mi", sleeper))
		m := d.memory(id)
		if m.MemoryLimitBytes != "50331648" || m.Usage == nil || m.Usage.MemoryLimitBytes != want {
			t.Errorf("%s -m 48Mi: recorded %q, cgroup %+v; want 50331648 recorded and memory.max %s", class, m.MemoryLimitBytes, m.Usage, want)
		}
		d.ok("kill", id)
	}

	res = d.ctl("run", "--memory", "4Gi", hog)
	if want := "--memory 4Gi is above the capsule's resources.cgroup_memory_bytes (1Gi); it can only lower it"; res.code != 125 || !strings.Contains(res.stderr, want) {
		t.Errorf("--memory above the capsule's: exit %d, stderr %q; want 125 and %q", res.code, res.stderr, want)
	}
	res = d.ctl("run", "--memory", "64mb", hog)
	if res.code != 125 || !strings.Contains(res.stderr, `"64mb" for "-m, --memory" flag`) || !strings.Contains(res.stderr, "64Mi, 4Gi: powers of 1024; 64M, 4G: powers of 1000") {
		t.Errorf("--memory 64mb: exit %d, stderr %q; want 125 naming the flag and the units", res.code, res.stderr)
	}
	if n := len(d.ps()); n != len(list)+3 {
		t.Errorf("%d sessions after the refusals, want %d: a refused --memory stages nothing", n, len(list)+3)
	}
}

// Token counts take SI multipliers where an operator types them: roostd
// --machine-tokens-per-day 10M, roostctl spend set-limit 2M; a binary unit is refused.
func TestTokenCountUnits(t *testing.T) {
	d := newDaemon(t, "--machine-tokens-per-day", "10M")
	if c := d.spend().MachineCeiling; c != "10000000" {
		t.Fatalf("--machine-tokens-per-day 10M: ceiling %q, want 10000000", c)
	}
	if out := d.ok("spend", "set-limit", "2M"); !strings.Contains(out, "machine ceiling: 2000000 tokens per UTC day (was 10000000") {
		t.Errorf("set-limit 2M: %q", out)
	}
	if c := d.spend().MachineCeiling; c != "2000000" {
		t.Errorf("after set-limit 2M: ceiling %q, want 2000000", c)
	}
	d.ok("spend", "set-limit", "500k")
	if c := d.spend().MachineCeiling; c != "500000" {
		t.Errorf("after set-limit 500k: ceiling %q, want 500000", c)
	}
	res := d.ctl("spend", "set-limit", "2Mi")
	if res.code != 2 || !strings.Contains(res.stderr, "Mi is a power of 1024, for sizes in bytes") {
		t.Errorf("set-limit 2Mi: exit %d, stderr %q", res.code, res.stderr)
	}
	if c := d.spend().MachineCeiling; c != "500000" {
		t.Errorf("a refused set-limit changed the ceiling to %q", c)
	}
}
