package containment

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/manifest"
)

// How a grant is held.
const (
	Enforced      = "enforced"
	Advisory      = "advisory"
	NotApplicable = "not_applicable"
)

// Grant is one resolved policy key and how the session's class holds it.
type Grant struct {
	Key         string
	Value       string
	Enforcement string
	Mechanism   string
}

// Rlimits are the resource limits a plain-process session gets, one per resources key that
// maps to an rlimit. Without a cgroup scope, RLIMIT_NPROC and RLIMIT_AS stand in for the
// cgroup's pids and memory limits.
func Rlimits(p *manifest.Policy) []Rlimit {
	r := p.Resources
	return []Rlimit{
		{Name: "resources.max_open_files", Resource: unix.RLIMIT_NOFILE, Value: uint64(r.MaxOpenFiles.Value)},
		{Name: "resources.max_file_size_bytes", Resource: unix.RLIMIT_FSIZE, Value: uint64(r.MaxFileSizeBytes.Value)},
		{Name: "resources.cpu_seconds", Resource: unix.RLIMIT_CPU, Value: uint64(r.CPUSeconds.Value)},
		{Name: "resources.max_processes", Resource: unix.RLIMIT_NPROC, Value: uint64(r.MaxProcesses.Value)},
		{Name: "resources.memory_bytes", Resource: unix.RLIMIT_AS, Value: uint64(r.MemoryBytes.Value)},
	}
}

// Grants lists every key of the policy with how a session of class holds it on this host.
// A class this build cannot run gets values only: nothing is claimed for it.
func Grants(class manifest.Class, p *manifest.Policy, h Host) []Grant {
	plain := class == manifest.Unconfined || class == manifest.Advisory
	g := &grantList{plain: plain}
	noKernel := "not enforced: the " + class.String() + " class has no kernel sandbox"

	g.add("containment", class.String(), Enforced, "the class this session runs under")
	g.add("network.allow", netList(p.Network.Allow), Advisory, noKernel+" (no network namespace); the program reaches whatever the host reaches")
	g.add("network.unix_sockets", strconv.FormatBool(p.Network.UnixSockets), Advisory, noKernel+" (no seccomp filter)")
	g.add("filesystem.scope", orWhole(p.Filesystem.Scope), Advisory, noKernel+" (no Landlock, no mount confinement)")
	g.add("filesystem.workdir_exec", strconv.FormatBool(p.Filesystem.WorkdirExec), Advisory, noKernel)
	g.add("filesystem.read_only", list(p.Filesystem.ReadOnly), Advisory, noKernel)
	g.add("shell.allow", list(p.Shell.Allow), Advisory, noKernel+" (no exec allowlist)")
	noEndpoint := "this build serves no spawn endpoint, so roost starts no child for it; the program itself is not fenced off from roostd"
	g.add("spawn.allow", list(p.Spawn.Allow), Advisory, noEndpoint)
	g.add("spawn.workdir_snapshot", list(p.Spawn.WorkdirSnapshot), Advisory, noEndpoint)
	g.add("spawn.max_depth", limit(p.Spawn.MaxDepth), Advisory, noEndpoint)
	g.add("spawn.max_children", limit(p.Spawn.MaxChildren), Advisory, noEndpoint)
	g.add("env.allow", list(p.Env.Allow), Enforced, "roost builds the environment: the manifest's env, these host variables, and ROOST_*")
	g.add("limits.deadline_seconds", limit(p.Limits.DeadlineSeconds), Enforced, "roostd sends SIGTERM at the deadline and SIGKILL 10s later")
	g.add("limits.memory_bytes", limit(p.Limits.MemoryBytes), NotApplicable, "bounds a WASM guest's memory; this session runs a command")
	noCgroup := noKernel + " (no cgroup)"
	g.add("resources.cgroup_memory_bytes", limit(p.Resources.CgroupMemoryBytes), Advisory, noCgroup)
	g.add("resources.cgroup_pids_max", limit(p.Resources.CgroupPidsMax), Advisory, noCgroup)
	g.add("resources.cgroup_cpu_percent", limit(p.Resources.CgroupCPUPercent), Advisory, noCgroup)
	g.add("resources.max_open_files", limit(p.Resources.MaxOpenFiles), Enforced, "RLIMIT_NOFILE on every process")
	g.add("resources.max_file_size_bytes", limit(p.Resources.MaxFileSizeBytes), Enforced, "RLIMIT_FSIZE on every process")
	g.add("resources.cpu_seconds", limit(p.Resources.CPUSeconds), Enforced, "RLIMIT_CPU on every process")
	if h.Root {
		g.add("resources.max_processes", limit(p.Resources.MaxProcesses), Advisory, "RLIMIT_NPROC is set, but the kernel does not apply it to root, which this session runs as")
	} else {
		g.add("resources.max_processes", limit(p.Resources.MaxProcesses), Enforced, "RLIMIT_NPROC")
	}
	g.add("resources.memory_bytes", limit(p.Resources.MemoryBytes), Enforced, "RLIMIT_AS on every process")
	g.add("resources.workdir_max_bytes", limit(p.Resources.WorkdirMaxBytes), Advisory, noKernel+" (no quota)")
	noGateway := "this build has no inference gateway or ledger"
	g.add("inference.upstream", orNone(p.Inference.Upstream), NotApplicable, noGateway)
	tokens := "none"
	if p.Inference.MaxSessionTokens != nil {
		tokens = strconv.FormatInt(*p.Inference.MaxSessionTokens, 10)
	}
	g.add("inference.max_session_tokens", tokens, NotApplicable, noGateway)
	g.add("inference.on_exhausted", p.Inference.OnExhausted, NotApplicable, noGateway)
	return g.out
}

type grantList struct {
	plain bool
	out   []Grant
}

func (g *grantList) add(key, value, enforcement, mechanism string) {
	if !g.plain {
		enforcement, mechanism = "", ""
	}
	g.out = append(g.out, Grant{Key: key, Value: value, Enforcement: enforcement, Mechanism: mechanism})
}

func list(items []string) string {
	if len(items) == 0 {
		return "none"
	}
	return strings.Join(items, ", ")
}

func netList(rules []manifest.NetRule) string {
	items := make([]string, len(rules))
	for i, r := range rules {
		items[i] = r.String()
	}
	return list(items)
}

func orWhole(scope string) string {
	if scope == "" {
		return "whole workdir"
	}
	return scope
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func limit(l manifest.Limit) string {
	s := strconv.FormatInt(l.Value, 10)
	if l.Declared == nil {
		return s + " (default)"
	}
	if *l.Declared != l.Value {
		return fmt.Sprintf("%s (declared %d)", s, *l.Declared)
	}
	return s
}
