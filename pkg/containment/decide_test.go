package containment_test

import (
	"strings"
	"testing"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/manifest"
)

func policy(t *testing.T, caps string) manifest.Policy {
	t.Helper()
	return *testkit.Policy(t, caps)
}

func TestDecide(t *testing.T) {
	catalog := containment.NewCatalog(containment.Host{Root: true}, containment.ErrNoRuntime, containment.ErrNoRuntime)
	cases := []struct {
		name        string
		caps        string
		daemon, run manifest.Class
		floor       manifest.Class
		met         bool
		reason      string
	}{
		{"default is advisory", "", 0, 0, manifest.Advisory, true, "every other grant recorded"},
		{"unconfined by manifest", "capabilities: {containment: unconfined}", 0, 0, manifest.Unconfined, true, "plain child process"},
		{"daemon raises", "capabilities: {containment: unconfined}", manifest.Advisory, 0, manifest.Advisory, true, "every other grant recorded"},
		{"run cannot lower", "capabilities: {containment: advisory}", 0, manifest.Unconfined, manifest.Advisory, true, "every other grant recorded"},
		{"sealed refused", "capabilities: {containment: sealed}", 0, 0, manifest.Sealed, false, `containment floor "sealed" (from capabilities.containment) cannot be met: this build and host deliver at most "advisory"`},
		{"scoped by run refused", "", 0, manifest.Scoped, manifest.Scoped, false, `floor "scoped" (from run --containment)`},
		{"workdir_exec with advisory", "capabilities: {filesystem: {workdir_exec: true}}", 0, 0, manifest.Advisory, true, "every other grant recorded"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := policy(t, c.caps)
			d := containment.Decide(&p, containment.Sources(&p, c.daemon, c.run), catalog)
			if d.Floor != c.floor || d.Met != c.met {
				t.Fatalf("decision %+v", d)
			}
			if c.met && d.Achieved != c.floor {
				t.Fatalf("achieved %v, want the floor %v", d.Achieved, c.floor)
			}
			if !c.met && d.Achieved != manifest.ClassNone {
				t.Fatalf("refused decision claims %v", d.Achieved)
			}
			if got := d.Shortfall + d.Mechanism; !strings.Contains(got, c.reason) {
				t.Fatalf("shortfall/mechanism %q does not contain %q", got, c.reason)
			}
			if c.met == (d.Shortfall != "") {
				t.Fatalf("met=%v with shortfall %q", c.met, d.Shortfall)
			}
		})
	}
}

// An executable workdir keeps the class: the kernel boundary holds, and the decision says
// which trees may exec.
func TestDecideWorkdirExecKeepsTheClass(t *testing.T) {
	catalog := containment.NewCatalog(containment.Host{Root: true}, nil, nil)
	for _, class := range []string{"scoped", "sealed"} {
		p := policy(t, "capabilities: {containment: "+class+", filesystem: {workdir_exec: true}}")
		d := containment.Decide(&p, containment.Sources(&p, 0, 0), catalog)
		if !d.Met || d.Achieved.String() != class || !strings.Contains(d.Mechanism, "workdir and scratch directories may exec") {
			t.Fatalf("%s with workdir_exec: %+v", class, d)
		}
	}
}

func TestGrantsNeverClaimWhatAPlainProcessCannotHold(t *testing.T) {
	p := policy(t, "capabilities: {network: {allow: [example.com]}, shell: {allow: [sh]}, filesystem: {scope: src}}")
	for _, root := range []bool{true, false} {
		grants := containment.Grants(manifest.Advisory, &p, root, false)
		byKey := map[string]containment.Grant{}
		for _, g := range grants {
			byKey[g.Key] = g
		}
		for _, key := range []string{"network.allow", "network.unix_sockets", "filesystem.scope", "filesystem.read_only", "shell.allow", "resources.cgroup_memory_bytes", "spawn.allow"} {
			if byKey[key].Enforcement != containment.Advisory {
				t.Errorf("%s claimed %q in an advisory session", key, byKey[key].Enforcement)
			}
		}
		for _, key := range []string{"env.allow", "limits.deadline_seconds", "resources.max_open_files", "resources.workdir_max_bytes"} {
			if byKey[key].Enforcement != containment.Enforced {
				t.Errorf("%s is %q; roost enforces it", key, byKey[key].Enforcement)
			}
		}
		want := containment.Enforced
		if root {
			want = containment.Advisory
		}
		if byKey["resources.max_processes"].Enforcement != want {
			t.Errorf("max_processes as root=%v: %q", root, byKey["resources.max_processes"].Enforcement)
		}
		if byKey["network.allow"].Value != "example.com" || byKey["resources.max_open_files"].Value != "1024 (default)" {
			t.Errorf("values: %+v %+v", byKey["network.allow"], byKey["resources.max_open_files"])
		}
	}
	// RLIMIT_AS always in a class without a cgroup (at its default when undeclared).
	declared := policy(t, "capabilities: {resources: {memory_bytes: 1073741824}}")
	for _, g := range containment.Grants(manifest.Advisory, &declared, false, false) {
		if g.Key == "resources.memory_bytes" && g.Enforcement != containment.Enforced {
			t.Errorf("a declared memory_bytes is %q", g.Enforcement)
		}
	}
	for _, g := range containment.Grants(manifest.Advisory, &p, false, false) {
		if g.Key == "resources.memory_bytes" && (g.Enforcement != containment.Enforced || g.Value != "68719476736 (default)") {
			t.Errorf("an undeclared memory_bytes is %q, %q", g.Enforcement, g.Value)
		}
	}
	// Nothing is claimed for a class there is no runtime for.
	for _, g := range containment.Grants(manifest.ClassNone, &p, false, false) {
		if g.Enforcement != "" {
			t.Fatalf("grant %s claims %q for no class", g.Key, g.Enforcement)
		}
	}
	// Every row of every class this build runs says how it is held, for a command and for a
	// WASM module; a WASM session's guest memory and fuel are held, a command's are not.
	for _, class := range manifest.Classes {
		for _, wasm := range []bool{false, true} {
			byKey := map[string]containment.Grant{}
			for _, g := range containment.Grants(class, &p, true, wasm) {
				byKey[g.Key] = g
				if g.Enforcement == "" || g.Mechanism == "" {
					t.Errorf("%s, wasm %v: %s has no enforcement or mechanism", class, wasm, g.Key)
				}
			}
			want := containment.NotApplicable
			if wasm {
				want = containment.Enforced
				if byKey["run.wasm"].Enforcement != containment.Enforced {
					t.Errorf("%s: a WASM session's preopens are not reported: %+v", class, byKey["run.wasm"])
				}
			}
			for _, key := range []string{"limits.memory_bytes", "limits.wasm_fuel"} {
				if byKey[key].Enforcement != want {
					t.Errorf("%s, wasm %v: %s is %q", class, wasm, key, byKey[key].Enforcement)
				}
			}
		}
	}
}

func TestCatalog(t *testing.T) {
	c := containment.NewCatalog(containment.Probe(), containment.ErrNoRuntime, containment.ErrNoRuntime)
	if c.Strongest() != manifest.Advisory {
		t.Fatalf("strongest %v", c.Strongest())
	}
	if c.Lookup(manifest.Sealed).Available || !c.Lookup(manifest.Unconfined).Available {
		t.Fatalf("catalog %+v", c)
	}
}
