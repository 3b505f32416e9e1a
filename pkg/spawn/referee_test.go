package spawn_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/spawn"
	"roost.dev/roost/pkg/toolchain"
)

// policyOf lowers a manifest whose capabilities block is fragment (YAML, indented as if
// it stood at the top level).
func policyOf(t testing.TB, fragment string) *manifest.Policy {
	t.Helper()
	var b strings.Builder
	b.WriteString("name: probe\nversion: 0.1.0\nrun:\n  command: [/bin/true]\n")
	if strings.TrimSpace(fragment) != "" {
		b.WriteString("capabilities:\n")
		for line := range strings.Lines(fragment) {
			b.WriteString("  " + line)
		}
		b.WriteString("\n")
	}
	m, err := manifest.Parse([]byte(b.String()), "capsule.yaml")
	if err != nil {
		t.Fatalf("Parse:\n%s\nerror: %v", b.String(), err)
	}
	p := manifest.Lower(m)
	return &p
}

// caps is a capabilities block as "block.key" → YAML value, so a case can state one
// difference from a base without restating the rest.
type caps map[string]string

// with returns a copy with the given key/value pairs set; an empty value removes the key.
func (c caps) with(kv ...string) caps {
	out := maps.Clone(c)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(out, kv[i])
		} else {
			out[kv[i]] = kv[i+1]
		}
	}
	return out
}

func (c caps) yaml() string {
	var b strings.Builder
	block := ""
	for _, k := range slices.Sorted(maps.Keys(c)) {
		blk, key, ok := strings.Cut(k, ".")
		if !ok {
			fmt.Fprintf(&b, "%s: %s\n", k, c[k])
			block = ""
			continue
		}
		if blk != block {
			fmt.Fprintf(&b, "%s:\n", blk)
			block = blk
		}
		fmt.Fprintf(&b, "  %s: %s\n", key, c[k])
	}
	return b.String()
}

// ceilings are every numeric key the envelope compares, each with the parent's value, all
// below the manifest defaults so that a child leaving one out asks for more.
var ceilings = [][2]string{
	{"resources.cgroup_memory_bytes", "1000001"},
	{"resources.cgroup_pids_max", "102"},
	{"resources.cgroup_cpu_percent", "103"},
	{"resources.max_open_files", "104"},
	{"resources.max_file_size_bytes", "1000005"},
	{"resources.cpu_seconds", "106"},
	{"resources.max_processes", "107"},
	{"resources.memory_bytes", "1000008"},
	{"resources.workdir_max_bytes", "1000009"},
	{"resources.egress_bytes_per_sec", "1000012"},
	{"limits.memory_bytes", "1000010"},
	{"limits.deadline_seconds", "111"},
}

func parentCaps() caps {
	c := caps{
		"network.allow":           `["api.example.com:443", "https://files.example.com", "10.0.0.2"]`,
		"network.unix_sockets":    "true",
		"filesystem.scope":        "src",
		"filesystem.workdir_exec": "true",
		"shell.allow":             "[sh, python3]",
		"spawn.allow":             "[worker, helper]",
		"spawn.max_children":      "4",
		"env.allow":               "[LANG, TZ]",
	}
	for _, kv := range ceilings {
		c[kv[0]] = kv[1]
	}
	return c
}

func class(t *testing.T, name string) manifest.Class {
	t.Helper()
	c, err := manifest.ParseClass(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type refereeCase struct {
	name          string
	parent, child caps
	// Parent and child facts besides their manifests; zero values take the defaults below.
	childName     string
	depth         *int
	live          int
	total         int
	maxConcurrent *int
	achieved      string
	floor         string
	// parentRoot and childRoot: the session runs as host root (sessions.allow_root).
	parentRoot, childRoot bool
	wantReason            string
	wantKey               string
	wantMsgContain        []string
}

func intp(n int) *int { return &n }

func (tc refereeCase) run(t *testing.T) {
	t.Helper()
	p := spawn.Parent{ID: "parent", Policy: policyOf(t, tc.parent.yaml()), Achieved: class(t, "scoped"), DepthRemaining: 2, LiveChildren: tc.live, TotalChildren: tc.total}
	if tc.depth != nil {
		p.DepthRemaining = *tc.depth
	}
	if tc.achieved != "" {
		p.Achieved = class(t, tc.achieved)
	}
	p.HostRoot = tc.parentRoot
	c := spawn.Child{Name: "worker", Ref: "worker@0.1.0", Policy: policyOf(t, tc.child.yaml()), Floor: p.Achieved, HostRoot: tc.childRoot}
	if tc.childName != "" {
		c.Name, c.Ref = tc.childName, tc.childName+"@0.1.0"
	}
	if tc.floor != "" {
		c.Floor = class(t, tc.floor)
	}
	maxConcurrent := 8
	if tc.maxConcurrent != nil {
		maxConcurrent = *tc.maxConcurrent
	}
	err := spawn.Referee(p, c, maxConcurrent)
	if tc.wantReason == "" {
		if err != nil {
			t.Fatalf("refused: %v\nparent:\n%s\nchild:\n%s", err, tc.parent.yaml(), tc.child.yaml())
		}
		return
	}
	if err == nil {
		t.Fatalf("granted; want refusal %s on %s\nparent:\n%s\nchild:\n%s", tc.wantReason, tc.wantKey, tc.parent.yaml(), tc.child.yaml())
	}
	var r *spawn.Refusal
	if !errors.As(err, &r) {
		t.Fatalf("error %T is not a *spawn.Refusal: %v", err, err)
	}
	if r.Reason != tc.wantReason || r.Key != tc.wantKey {
		t.Fatalf("refusal (%s, %s), want (%s, %s): %v", r.Reason, r.Key, tc.wantReason, tc.wantKey, err)
	}
	if !errdefs.IsPermissionDenied(err) {
		t.Fatalf("refusal does not classify as permission denied: %v", err)
	}
	if !strings.HasPrefix(err.Error(), tc.wantKey+": ") {
		t.Fatalf("message does not start with its key %q: %v", tc.wantKey, err)
	}
	for _, s := range tc.wantMsgContain {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("message lacks %q: %v", s, err)
		}
	}
}

func TestRefereeGates(t *testing.T) {
	base := parentCaps()
	cases := []refereeCase{
		{name: "name not in spawn.allow", parent: base, child: base, childName: "rogue",
			wantReason: spawn.ReasonSpawnAllow, wantKey: "capabilities.spawn.allow", wantMsgContain: []string{`"rogue"`, "worker, helper"}},
		{name: "parent with no spawn.allow", parent: base.with("spawn.allow", ""), child: base.with("spawn.allow", ""),
			wantReason: spawn.ReasonSpawnAllow, wantKey: "capabilities.spawn.allow", wantMsgContain: []string{`"worker"`, "none"}},
		{name: "depth exhausted", parent: base, child: base, depth: intp(0),
			wantReason: spawn.ReasonDepth, wantKey: "capabilities.spawn.max_depth"},
		{name: "depth negative", parent: base, child: base, depth: intp(-1),
			wantReason: spawn.ReasonDepth, wantKey: "capabilities.spawn.max_depth"},
		{name: "one level of depth left", parent: base, child: base, depth: intp(1)},
		{name: "at spawn.max_children", parent: base.with("spawn.max_children", "2"), child: base, live: 2,
			wantReason: spawn.ReasonChildren, wantKey: "capabilities.spawn.max_children", wantMsgContain: []string{"2 children are live", "spawn.max_children 2"}},
		{name: "over spawn.max_children", parent: base.with("spawn.max_children", "2"), child: base, live: 3,
			wantReason: spawn.ReasonChildren, wantKey: "capabilities.spawn.max_children"},
		{name: "one below spawn.max_children", parent: base.with("spawn.max_children", "2"), child: base, live: 1},
		{name: "at roostd --max-concurrent", parent: base, child: base, live: 1, maxConcurrent: intp(1),
			wantReason: spawn.ReasonChildren, wantKey: "capabilities.spawn.max_children", wantMsgContain: []string{"--max-concurrent 1"}},
		{name: "roostd --max-concurrent 0", parent: base, child: base, live: 0, maxConcurrent: intp(0),
			wantReason: spawn.ReasonChildren, wantKey: "capabilities.spawn.max_children"},
		{name: "default spawn.max_children", parent: base.with("spawn.max_children", ""), child: base, live: manifest.DefaultSpawnMaxChildren, maxConcurrent: intp(100),
			wantReason: spawn.ReasonChildren, wantKey: "capabilities.spawn.max_children"},
		// spawn.max_total_children counts every child started, ended ones too.
		{name: "at spawn.max_total_children", parent: base.with("spawn.max_total_children", "3"), child: base.with("spawn.max_total_children", "3"), total: 3,
			wantReason: spawn.ReasonChildren, wantKey: spawn.KeyMaxTotalChildren, wantMsgContain: []string{"3 children started already", "spawn.max_total_children 3"}},
		{name: "past spawn.max_total_children", parent: base.with("spawn.max_total_children", "3"), child: base.with("spawn.max_total_children", "1"), total: 7,
			wantReason: spawn.ReasonChildren, wantKey: spawn.KeyMaxTotalChildren},
		{name: "one below spawn.max_total_children", parent: base.with("spawn.max_total_children", "3"), child: base.with("spawn.max_total_children", "3"), total: 2},
		{name: "total spent names the total, not the live count", parent: base.with("spawn.max_total_children", "3", "spawn.max_children", "2"), child: base.with("spawn.max_total_children", "3"), total: 3, live: 2,
			wantReason: spawn.ReasonChildren, wantKey: spawn.KeyMaxTotalChildren},
		{name: "default spawn.max_total_children", parent: base, child: base, total: manifest.DefaultSpawnMaxTotal,
			wantReason: spawn.ReasonChildren, wantKey: spawn.KeyMaxTotalChildren, wantMsgContain: []string{"spawn.max_total_children 64"}},
		{name: "below the default spawn.max_total_children", parent: base, child: base, total: manifest.DefaultSpawnMaxTotal - 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, tc.run)
	}
}

func TestRefereeEnvelope(t *testing.T) {
	base := parentCaps()
	envelope := func(key string, msg ...string) (string, string, []string) {
		return spawn.ReasonEnvelope, "capabilities." + key, msg
	}
	var cases []refereeCase
	add := func(name string, parent, child caps, floor string, reason, key string, msg []string) {
		cases = append(cases, refereeCase{name: name, parent: parent, child: child, floor: floor, wantReason: reason, wantKey: key, wantMsgContain: msg})
	}
	refused := func(name string, parent, child caps, key string, msg ...string) {
		r, k, m := envelope(key, msg...)
		add(name, parent, child, "", r, k, m)
	}
	granted := func(name string, parent, child caps) { add(name, parent, child, "", "", "", nil) }

	granted("child equals parent", base, base)
	smaller := caps{
		"network.allow":    `["https://api.example.com:443"]`,
		"filesystem.scope": "src/sub",
		"spawn.allow":      "[helper]",
		"env.allow":        "[TZ]",
	}
	for _, kv := range ceilings {
		smaller[kv[0]] = "1"
	}
	granted("child strictly smaller", base, smaller)

	refused("network.allow entry not held", base, base.with("network.allow", `["api.example.com"]`),
		"network.allow", `capabilities.network.allow: the child declares "api.example.com", which its parent does not hold`)
	refused("network.allow one of several not held", base, base.with("network.allow", `["10.0.0.2:22", "evil.example.com"]`),
		"network.allow", `"evil.example.com"`)
	refused("network.allow other port", base, base.with("network.allow", `["api.example.com:8443"]`),
		"network.allow", `"api.example.com:8443"`)
	refused("network.allow other scheme", base, base.with("network.allow", `["http://files.example.com"]`),
		"network.allow", `"http://files.example.com"`)
	refused("network.allow against none", base.with("network.allow", ""), base.with("network.allow", `["10.0.0.2"]`),
		"network.allow", `"10.0.0.2"`)
	granted("network.allow covered entries", base, base.with("network.allow", `["https://api.example.com:443", "https://files.example.com", "10.0.0.2:5432", "http://10.0.0.2"]`))

	refused("network.unix_sockets", base.with("network.unix_sockets", "false"), base.with("network.unix_sockets", "true"),
		"network.unix_sockets")
	granted("network.unix_sockets dropped", base, base.with("network.unix_sockets", "false"))

	refused("shell.allow", base, base.with("shell.allow", "[sh, bash]"), "shell.allow", `"bash"`)
	refused("shell.allow against none", base.with("shell.allow", ""), base.with("shell.allow", "[sh]"), "shell.allow", `"sh"`)
	refused("spawn.allow wider than the parent's", base, base.with("spawn.allow", "[worker, helper, rogue]"), "spawn.allow", `"rogue"`)
	refused("env.allow", base, base.with("env.allow", "[LANG, HOME]"), "env.allow", `"HOME"`)

	refused("filesystem.scope unscoped child of a scoped parent", base, base.with("filesystem.scope", ""),
		"filesystem.scope", `"src"`)
	refused("filesystem.scope sibling", base, base.with("filesystem.scope", "lib"),
		"filesystem.scope", `"lib"`, `"src"`)
	refused("filesystem.scope sharing a string prefix", base, base.with("filesystem.scope", "srcx"),
		"filesystem.scope", `"srcx"`)
	refused("filesystem.scope sharing a string prefix beneath", base, base.with("filesystem.scope", "srcx/sub"),
		"filesystem.scope", `"srcx/sub"`)
	granted("filesystem.scope beneath", base, base.with("filesystem.scope", "src/sub"))
	granted("filesystem.scope beneath, written unclean", base, base.with("filesystem.scope", "./src//sub/"))
	granted("filesystem.scope of an unscoped parent", base.with("filesystem.scope", ""), base.with("filesystem.scope", "anything"))

	refused("filesystem.workdir_exec", base.with("filesystem.workdir_exec", "false"), base.with("filesystem.workdir_exec", "true"),
		"filesystem.workdir_exec")
	granted("filesystem.workdir_exec dropped", base, base.with("filesystem.workdir_exec", "false"))

	withHost := base.with("filesystem.host_read", "[/opt/tools]")
	refused("filesystem.host_read the parent lacks", base, withHost, "filesystem.host_read", `"/opt/tools"`)
	granted("filesystem.host_read beneath the parent's", withHost, base.with("filesystem.host_read", "[/opt/tools/rust]"))
	refused("filesystem.host_read sharing a string prefix", withHost, base.with("filesystem.host_read", "[/opt/toolsx]"), "filesystem.host_read")

	for _, kv := range ceilings {
		key, val := kv[0], kv[1]
		var n int64
		if _, err := fmt.Sscan(val, &n); err != nil {
			t.Fatal(err)
		}
		refused(key+" above the parent's", base, base.with(key, fmt.Sprint(n+1)), key,
			fmt.Sprintf("the child's %d is more than its parent's %d", n+1, n))
		granted(key+" below the parent's", base, base.with(key, fmt.Sprint(n-1)))
		if key == "resources.max_processes" {
			// Left out, it is the child's cgroup_pids_max (102 here), within the parent's;
			// and so it follows a pids.max raised past the parent's max_processes.
			granted(key+" left to cgroup_pids_max", base, base.with(key, ""))
			refused(key+" left to a cgroup_pids_max above it", base.with("resources.cgroup_pids_max", "200"),
				base.with(key, "").with("resources.cgroup_pids_max", "150"), key, "the child's 150 is more than its parent's 107")
			continue
		}
		// Left out, the child gets the default, far above every ceiling here.
		refused(key+" left to the default", base, base.with(key, ""), key)
	}

	// resources.egress_max_bytes: 0 is no bound, so a bounded parent's child needs one too.
	egress := "resources.egress_max_bytes"
	granted(egress+" unbounded under unbounded", base, base)
	granted(egress+" bounded under unbounded", base, base.with(egress, "1000"))
	granted(egress+" below the parent's", base.with(egress, "1000"), base.with(egress, "999"))
	refused(egress+" above the parent's", base.with(egress, "1000"), base.with(egress, "1001"), egress, "the child's 1001 is more than its parent's 1000")
	refused(egress+" unbounded under a bound", base.with(egress, "1000"), base, egress, "the child declares no bound; its parent's is 1000")
	fuel := "limits.wasm_fuel"
	granted(fuel+" bounded under unbounded", base, base.with(fuel, "1000"))
	refused(fuel+" above the parent's", base.with(fuel, "1000"), base.with(fuel, "1001"), fuel, "the child's 1001 is more than its parent's 1000")
	refused(fuel+" unbounded under a bound", base.with(fuel, "1000"), base, fuel, "the child declares no bound; its parent's is 1000")

	for _, c := range []struct {
		achieved, floor string
		ok              bool
	}{
		{"scoped", "advisory", false},
		{"sealed", "scoped", false},
		{"advisory", "unconfined", false},
		{"scoped", "scoped", true},
		{"scoped", "sealed", true},
		{"unconfined", "advisory", true},
	} {
		tc := refereeCase{name: "containment " + c.floor + " under " + c.achieved, parent: base, child: base, achieved: c.achieved, floor: c.floor}
		if !c.ok {
			tc.wantReason, tc.wantKey, tc.wantMsgContain = spawn.ReasonEnvelope, "capabilities.containment", []string{c.floor, c.achieved}
		}
		cases = append(cases, tc)
	}

	// Host root only from a parent that has it.
	cases = append(cases,
		refereeCase{name: "host root child under an unprivileged parent", parent: base, child: base, childRoot: true,
			wantReason: spawn.ReasonEnvelope, wantKey: "sessions.allow_root", wantMsgContain: []string{"host root", "worker"}},
		refereeCase{name: "host root child under a host root parent", parent: base, child: base, childRoot: true, parentRoot: true},
		refereeCase{name: "unprivileged child under a host root parent", parent: base, child: base, parentRoot: true},
	)

	for _, tc := range cases {
		t.Run(tc.name, tc.run)
	}
}

// TestRefereeOrder: with several gates failing at once, the first in the documented order
// (spawn.allow, depth, children, envelope) is the one reported.
func TestRefereeOrder(t *testing.T) {
	base := parentCaps()
	wider := base.with("shell.allow", "[sh, python3, bash]")
	cases := []refereeCase{
		{name: "spawn.allow before everything", parent: base, child: wider, childName: "rogue", depth: intp(0), live: 8,
			wantReason: spawn.ReasonSpawnAllow, wantKey: "capabilities.spawn.allow"},
		{name: "depth before children and envelope", parent: base, child: wider, depth: intp(0), live: 8,
			wantReason: spawn.ReasonDepth, wantKey: "capabilities.spawn.max_depth"},
		{name: "children before envelope", parent: base, child: wider, live: 8,
			wantReason: spawn.ReasonChildren, wantKey: "capabilities.spawn.max_children"},
		{name: "envelope last", parent: base, child: wider,
			wantReason: spawn.ReasonEnvelope, wantKey: "capabilities.shell.allow"},
	}
	for _, tc := range cases {
		t.Run(tc.name, tc.run)
	}
}

func TestCovers(t *testing.T) {
	rule := func(s string) manifest.NetRule {
		t.Helper()
		r, err := manifest.ParseNetRule(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	cases := []struct {
		parent, child string
		want          bool
	}{
		// A bare host covers every scheme and port of it.
		{"api.example.com", "api.example.com", true},
		{"api.example.com", "api.example.com:443", true},
		{"api.example.com", "https://api.example.com", true},
		{"api.example.com", "https://api.example.com:8443", true},
		{"api.example.com", "http://api.example.com:80", true},
		{"API.example.com", "api.EXAMPLE.com:1", true},
		{"10.0.0.2", "10.0.0.2:22", true},
		{"[::1]", "[::1]:8080", true},
		// host:port covers that port under any scheme, nothing else.
		{"api.example.com:443", "api.example.com:443", true},
		{"api.example.com:443", "https://api.example.com:443", true},
		{"api.example.com:443", "http://api.example.com:443", true},
		{"api.example.com:443", "api.example.com:444", false},
		{"api.example.com:443", "https://api.example.com:8443", false},
		{"api.example.com:443", "api.example.com", false},
		{"api.example.com:443", "https://api.example.com", false},
		// scheme://host[:port] covers only itself.
		{"https://api.example.com", "https://api.example.com", true},
		{"https://api.example.com", "http://api.example.com", false},
		{"https://api.example.com", "https://api.example.com:443", false},
		{"https://api.example.com", "api.example.com", false},
		{"https://api.example.com", "api.example.com:443", false},
		{"https://api.example.com:8443", "https://api.example.com:8443", true},
		{"https://api.example.com:8443", "https://api.example.com", false},
		{"https://api.example.com:8443", "api.example.com:8443", false},
		{"https://api.example.com:8443", "http://api.example.com:8443", false},
		// Different hosts never.
		{"example.com", "api.example.com", false},
		{"api.example.com", "example.com", false},
		{"example.com:443", "example.org:443", false},
		{"https://example.com", "https://example.org", false},
		{"10.0.0.2", "10.0.0.20", false},
	}
	for _, tc := range cases {
		if got := spawn.Covers(rule(tc.parent), rule(tc.child)); got != tc.want {
			t.Errorf("Covers(%q, %q) = %v, want %v", tc.parent, tc.child, got, tc.want)
		}
	}
}

// What shell.allow resolved to is the envelope's measure when both sides have it: a child's
// tree beneath the parent's preset passes, a program the parent cannot run does not.
func TestRefereeShellByResolution(t *testing.T) {
	base := parentCaps()
	p := spawn.Parent{ID: "parent", Policy: policyOf(t, base.yaml()), Achieved: class(t, "scoped"), DepthRemaining: 2,
		Shell: []toolchain.Entry{{Entry: "@gcc", Files: []string{"/usr/bin/gcc"}, Trees: []string{"/usr/lib/gcc/x86_64-linux-gnu/12"}}}}
	child := func(entries ...toolchain.Entry) spawn.Child {
		return spawn.Child{Name: "worker", Ref: "worker@0.1.0", Policy: policyOf(t, base.with("shell.allow", "[cc1]").yaml()), Floor: p.Achieved, Shell: entries}
	}
	if err := spawn.Referee(p, child(toolchain.Entry{Entry: "/usr/lib/gcc/x86_64-linux-gnu/12/cc1", Files: []string{"/usr/lib/gcc/x86_64-linux-gnu/12/cc1"}}), 8); err != nil {
		t.Fatalf("a file beneath the parent's tree: %v", err)
	}
	err := spawn.Referee(p, child(toolchain.Entry{Entry: "curl", Files: []string{"/usr/bin/curl"}}), 8)
	var r *spawn.Refusal
	if !errors.As(err, &r) || r.Key != "capabilities.shell.allow" || !strings.Contains(r.Msg, "/usr/bin/curl") {
		t.Fatalf("a program the parent cannot run: %v", err)
	}
}
