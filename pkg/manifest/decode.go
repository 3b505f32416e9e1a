package manifest

import (
	"fmt"
	"slices"

	"go.yaml.in/yaml/v3"
)

// This file is the manifest's schema: which keys exist where, and what each must hold.

func (d *decoder) manifest(n *yaml.Node) *Manifest {
	m := &Manifest{}
	var runNode *yaml.Node
	// runProblems counts what was found wrong inside run: a misspelt or mistyped command
	// is already reported there, and "it has neither" would only repeat it.
	runProblems := 0
	seen := d.mapping(n, "", []field{
		{"name", set(&m.Name, d.checkedStr(checkName))},
		{"version", set(&m.Version, d.checkedStr(checkVersion))},
		{"run", func(n *yaml.Node, p string) {
			runNode = n
			before := len(d.errs)
			m.Run = d.run(n, p)
			runProblems = len(d.errs) - before
		}},
		{"env", func(n *yaml.Node, p string) { m.Env = d.env(n, p) }},
		{"inference", func(n *yaml.Node, p string) { m.Inference = d.inference(n, p) }},
		{"capabilities", func(n *yaml.Node, p string) { m.Capabilities = d.capabilities(n, p) }},
	})
	if n.Kind != yaml.MappingNode {
		return m
	}
	for _, key := range []string{"name", "version", "run"} {
		if !seen[key] {
			d.fail(n, key, "required")
		}
	}
	if runNode != nil && runNode.Kind == yaml.MappingNode {
		// Said at the run key itself: a block mapping's own position is its first child
		// key, which would put the problem on a line it is not about.
		at := keyNode(n, "run")
		switch {
		case m.Run.Command == nil && m.Run.Wasm == "" && runProblems == 0:
			d.fail(at, "run", "needs exactly one of command or wasm; it has neither")
		case m.Run.Command != nil && m.Run.Wasm != "":
			d.fail(at, "run", "needs exactly one of command or wasm; it has both")
		}
	}
	return m
}

func (d *decoder) run(n *yaml.Node, path string) Run {
	var r Run
	d.mapping(n, path, []field{
		{"command", func(n *yaml.Node, p string) {
			r.Command = d.strList(n, p)
			if r.Command == nil {
				return
			}
			if len(r.Command) == 0 {
				d.fail(n, p, "must name a program; the list is empty")
			} else if r.Command[0] == "" {
				d.fail(n, p+"[0]", "the program must not be empty")
			} else if err := checkNoNUL(r.Command); err != nil {
				d.fail(n, p, "%v", err)
			}
		}},
		{"wasm", set(&r.Wasm, d.checkedStr(checkRelative))},
		{"args", func(n *yaml.Node, p string) {
			r.Args = d.strList(n, p)
			if err := checkNoNUL(r.Args); err != nil {
				d.fail(n, p, "%v", err)
			}
		}},
	})
	return r
}

func (d *decoder) env(n *yaml.Node, path string) map[string]string {
	if !d.kind(n, path, yaml.MappingNode, "a mapping of NAME: value") {
		return nil
	}
	env := map[string]string{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			d.fail(k, path, "variable names must be plain strings")
			continue
		}
		p := join(path, k.Value)
		if _, dup := env[k.Value]; dup {
			d.fail(k, p, "variable appears twice")
			continue
		}
		if err := checkEnvName(k.Value); err != nil {
			d.fail(k, p, "%v", err)
			continue
		}
		// Values may be written as numbers or booleans (PORT: 8080), as in compose files;
		// the program sees the literal text either way. Structures are refused.
		if v.Kind != yaml.ScalarNode || isNull(v) {
			d.fail(v, p, "expected a value, got %s", describe(v))
			continue
		}
		if err := checkNoNUL([]string{v.Value}); err != nil {
			d.fail(v, p, "%v", err)
			continue
		}
		env[k.Value] = v.Value
	}
	return env
}

func (d *decoder) inference(n *yaml.Node, path string) *Inference {
	inf := &Inference{}
	d.mapping(n, path, []field{
		{"upstream", set(&inf.Upstream, d.checkedStr(checkUpstream))},
		{"model", set(&inf.Model, d.strVal)},
		{"max_session_tokens", set(&inf.MaxSessionTokens, d.positive)},
		{"on_exhausted", set(&inf.OnExhausted, d.checkedStr(checkOnExhausted))},
	})
	return inf
}

func (d *decoder) capabilities(n *yaml.Node, path string) *Capabilities {
	c := &Capabilities{}
	d.mapping(n, path, []field{
		{"containment", func(n *yaml.Node, p string) {
			if s, ok := d.str(n, p); ok {
				if cls, err := ParseClass(s); err != nil {
					d.fail(n, p, "%v", err)
				} else {
					c.Containment = &cls
				}
			}
		}},
		{"network", func(n *yaml.Node, p string) {
			c.Network = &Network{}
			d.mapping(n, p, []field{
				{"allow", set(&c.Network.Allow, d.checkedList(checkNetworkEntry))},
				{"unix_sockets", set(&c.Network.UnixSockets, d.boolean)},
			})
		}},
		{"filesystem", func(n *yaml.Node, p string) {
			c.Filesystem = &Filesystem{}
			d.mapping(n, p, []field{
				{"scope", set(&c.Filesystem.Scope, d.strPtrChecked(checkScope))},
				{"workdir_exec", set(&c.Filesystem.WorkdirExec, d.boolean)},
				{"read_only", set(&c.Filesystem.ReadOnly, d.checkedList(checkReadOnly))},
				{"host_read", set(&c.Filesystem.HostRead, d.checkedList(checkHostPath))},
				{"system", set(&c.Filesystem.System, d.checkedStr(checkSystem))},
			})
		}},
		{"shell", func(n *yaml.Node, p string) {
			c.Shell = &Shell{}
			d.mapping(n, p, []field{{"allow", set(&c.Shell.Allow, d.checkedList(checkShellEntry))}})
		}},
		{"spawn", func(n *yaml.Node, p string) {
			s := &Spawn{}
			c.Spawn = s
			var snapNode *yaml.Node
			d.mapping(n, p, []field{
				{"allow", set(&s.Allow, d.checkedList(checkName))},
				{"workdir_snapshot", func(n *yaml.Node, p string) {
					snapNode = n
					s.WorkdirSnapshot = d.checkedList(checkName)(n, p)
				}},
				{"max_depth", set(&s.MaxDepth, d.positive)},
				{"max_children", set(&s.MaxChildren, d.positive)},
				{"max_total_children", set(&s.MaxTotalChildren, d.positive)},
			})
			for i, name := range s.WorkdirSnapshot {
				if !slices.Contains(s.Allow, name) && snapNode != nil && i < len(snapNode.Content) {
					d.fail(snapNode.Content[i], fmt.Sprintf("%s.workdir_snapshot[%d]", p, i),
						"%q is not in %s.allow; a snapshot is only for a capsule this one may spawn", name, p)
				}
			}
		}},
		{"env", func(n *yaml.Node, p string) {
			c.Env = &EnvGrant{}
			d.mapping(n, p, []field{{"allow", set(&c.Env.Allow, d.checkedList(checkEnvAllow))}})
		}},
		{"limits", func(n *yaml.Node, p string) {
			l := &Limits{}
			c.Limits = l
			d.mapping(n, p, []field{
				{"deadline_seconds", func(n *yaml.Node, p string) {
					l.DeadlineSeconds = d.positive(n, p)
					if l.DeadlineSeconds != nil && *l.DeadlineSeconds > maxDeadlineSeconds {
						d.fail(n, p, "must be at most %d (about 290 years)", int64(maxDeadlineSeconds))
						l.DeadlineSeconds = nil
					}
				}},
				{"memory_bytes", set(&l.MemoryBytes, d.size)},
				{"wasm_fuel", set(&l.WasmFuel, d.positive)},
			})
		}},
		{"resources", func(n *yaml.Node, p string) {
			r := &Resources{}
			c.Resources = r
			d.mapping(n, p, []field{
				{"cgroup_memory_bytes", set(&r.CgroupMemoryBytes, d.size)},
				{"cgroup_pids_max", set(&r.CgroupPidsMax, d.positive)},
				{"cgroup_cpu_percent", set(&r.CgroupCPUPercent, d.positive)},
				{"max_open_files", set(&r.MaxOpenFiles, d.positive)},
				{"max_file_size_bytes", set(&r.MaxFileSizeBytes, d.size)},
				{"cpu_seconds", set(&r.CPUSeconds, d.positive)},
				{"max_processes", set(&r.MaxProcesses, d.positive)},
				{"memory_bytes", set(&r.MemoryBytes, d.size)},
				{"workdir_max_bytes", set(&r.WorkdirMaxBytes, d.size)},
				{"workdir_max_inodes", set(&r.WorkdirMaxInodes, d.positive)},
				{"log_max_bytes", set(&r.LogMaxBytes, d.size)},
				{"endpoint_max_connections", set(&r.EndpointMaxConnections, d.positive)},
				{"egress_max_bytes", set(&r.EgressMaxBytes, d.size)},
				{"egress_bytes_per_sec", set(&r.EgressBytesPerSec, d.size)},
			})
		}},
	})
	return c
}

func (d *decoder) strPtrChecked(check func(string) error) func(*yaml.Node, string) *string {
	read := d.checkedStr(check)
	return func(n *yaml.Node, path string) *string {
		before := len(d.errs)
		s := read(n, path)
		if len(d.errs) != before {
			return nil
		}
		return &s
	}
}
