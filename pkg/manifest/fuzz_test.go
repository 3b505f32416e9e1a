package manifest

import (
	"errors"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the parser. It must never panic, every refusal must be
// an *Error with at least one problem, and every accepted manifest must lower to a policy
// whose limits are all positive and whose identity is valid.
func FuzzParse(f *testing.F) {
	f.Add([]byte(head))
	f.Add([]byte(head + "capabilities:\n  network:\n    allow: [\"https://a.b:1\", \"[::1]:2\"]\n  filesystem:\n    scope: a/b\n    read_only: [\" x \"]\n"))
	f.Add([]byte(head + "capabilities:\n  resources:\n    max_open_files: 0x10\n  limits:\n    deadline_seconds: 1_000\n"))
	f.Add([]byte("name: &a x\nversion: *a\n"))
	f.Add([]byte("{name: x, version: 0.0.0, run: {wasm: a.wasm}, env: {A: 1}}"))
	f.Add([]byte("- [\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data, "fuzz.yaml")
		if err != nil {
			var me *Error
			if !errors.As(err, &me) || len(me.Fields) == 0 || me.Error() == "" {
				t.Fatalf("refusal is not a populated *Error: %#v", err)
			}
			// Problems come in file order, as the operator reads the file.
			for i := 1; i < len(me.Fields); i++ {
				a, b := me.Fields[i-1], me.Fields[i]
				if a.Line > b.Line || a.Line == b.Line && a.Column > b.Column {
					t.Fatalf("problems out of file order:\n%v", me)
				}
			}
			return
		}
		if checkName(m.Name) != nil || checkVersion(m.Version) != nil {
			t.Fatalf("accepted invalid identity %q@%q", m.Name, m.Version)
		}
		if (len(m.Run.Command) == 0) == (m.Run.Wasm == "") {
			t.Fatalf("accepted run without exactly one of command/wasm: %+v", m.Run)
		}
		p := Lower(m)
		r := p.Resources
		for _, l := range []Limit{p.Limits.DeadlineSeconds, p.Limits.MemoryBytes, r.CgroupMemoryBytes, r.CgroupPidsMax, r.CgroupCPUPercent, r.MaxOpenFiles, r.MaxFileSizeBytes, r.CPUSeconds, r.MaxProcesses, r.MemoryBytes, r.WorkdirMaxBytes, p.Spawn.MaxDepth, p.Spawn.MaxChildren} {
			if l.Value <= 0 {
				t.Fatalf("limit resolved to %d", l.Value)
			}
		}
		if p.Filesystem.Scope != "" && checkRelative(p.Filesystem.Scope) != nil {
			t.Fatalf("scope %q escapes", p.Filesystem.Scope)
		}
		for _, ro := range p.Filesystem.ReadOnly {
			if checkRelative(ro) != nil {
				t.Fatalf("read_only %q escapes", ro)
			}
		}
		if p.Containment == ClassNone {
			t.Fatal("policy without a containment class")
		}
	})
}
