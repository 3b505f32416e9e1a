package spawn

import (
	"fmt"
	"slices"
	"strings"

	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/toolchain"
)

// Parent is what the referee knows of the session asking to spawn.
type Parent struct {
	ID       string
	Policy   *manifest.Policy
	Achieved manifest.Class
	// DepthRemaining is how many levels may still be started below the parent: the least
	// of roostd --max-depth and every ancestor's spawn.max_depth, one less at each level.
	DepthRemaining int
	LiveChildren   int
	// TotalChildren is every child ever staged for the parent that is still recorded, live
	// or ended: what spawn.max_total_children bounds.
	TotalChildren int
	// HostRoot: the parent runs as host root (roostd's sessions.allow_root).
	HostRoot bool
	// Shell is what the parent's shell.allow resolved to (nil: compare names).
	Shell []toolchain.Entry
}

// Child is what the parent asks to start.
type Child struct {
	// Name is the child capsule's name, Ref its name@version.
	Name, Ref string
	Policy    *manifest.Policy
	// Floor is the containment class the child would be staged with.
	Floor manifest.Class
	// HostRoot: the child would run as host root (roostd's sessions.allow_root names it).
	HostRoot bool
	// Shell is what the child's shell.allow resolves to (nil: compare names).
	Shell []toolchain.Entry
}

// Why a spawn is refused, as a bounded metric label.
const (
	ReasonSpawnAllow = "spawn_allow"
	ReasonDepth      = "depth"
	ReasonChildren   = "children"
	ReasonEnvelope   = "envelope"
)

// KeyMaxTotalChildren is the key a refusal for too many children over a session's life
// names.
const KeyMaxTotalChildren = "capabilities.spawn.max_total_children"

// Refusal is a spawn the referee refused, naming the manifest key and the entry that
// failed. It classifies as permission denied.
type Refusal struct {
	Reason string
	Key    string
	Msg    string
}

func (r *Refusal) Error() string { return r.Key + ": " + r.Msg }

// Forbidden marks the refusal as permission denied for errdefs.
func (*Refusal) Forbidden() {}

// Referee decides a spawn, in this order: the child's name is in the parent's spawn.allow;
// the parent has depth left; it has not yet started spawn.max_total_children children; it
// has room for another live child (its spawn.max_children and roostd --max-concurrent);
// the child's policy lies inside the parent's on every axis. A mismatch is refused, never
// narrowed.
func Referee(p Parent, c Child, maxConcurrent int) error {
	if err := Allowed(p.Policy, c.Name); err != nil {
		return err
	}
	if p.DepthRemaining < 1 {
		return &Refusal{ReasonDepth, "capabilities.spawn.max_depth",
			"no delegation depth is left at this level (spawn.max_depth of this session or an ancestor, or roostd --max-depth)"}
	}
	// Before the live count: once spent, the total does not come back as children end.
	if total := p.Policy.Spawn.MaxTotalChildren.Value; int64(p.TotalChildren) >= total {
		return &Refusal{ReasonChildren, KeyMaxTotalChildren,
			fmt.Sprintf("%d children started already, the most this session may start in its life (spawn.max_total_children %d)",
				p.TotalChildren, total)}
	}
	limit := int(p.Policy.Spawn.MaxChildren.Value)
	if maxConcurrent < limit {
		limit = maxConcurrent
	}
	if p.LiveChildren >= limit {
		return &Refusal{ReasonChildren, "capabilities.spawn.max_children",
			fmt.Sprintf("%d children are live, the most this session may have at once (spawn.max_children %d, roostd --max-concurrent %d)",
				p.LiveChildren, p.Policy.Spawn.MaxChildren.Value, maxConcurrent)}
	}
	return envelope(p, c)
}

// Allowed is the referee's first check alone: the name is in the parent's spawn.allow. It
// can be judged before the child's capsule is looked up.
func Allowed(parent *manifest.Policy, name string) error {
	if !slices.Contains(parent.Spawn.Allow, name) {
		return &Refusal{ReasonSpawnAllow, "capabilities.spawn.allow",
			fmt.Sprintf("%q is not among the capsules this session may spawn (%s)", name, listOrNone(parent.Spawn.Allow))}
	}
	return nil
}

func listOrNone(items []string) string {
	if len(items) == 0 {
		return "none"
	}
	return strings.Join(items, ", ")
}

func refuse(key, format string, args ...any) error {
	return &Refusal{ReasonEnvelope, key, fmt.Sprintf(format, args...)}
}

// envelope checks that the child holds nothing its parent does not, axis by axis.
func envelope(p Parent, c Child) error {
	pp, cp := p.Policy, c.Policy
	for _, r := range cp.Network.Allow {
		if !slices.ContainsFunc(pp.Network.Allow, func(q manifest.NetRule) bool { return Covers(q, r) }) {
			return refuse("capabilities.network.allow", "the child declares %q, which its parent does not hold", r.String())
		}
	}
	if cp.Network.UnixSockets && !pp.Network.UnixSockets {
		return refuse("capabilities.network.unix_sockets", "the child declares true; its parent does not hold it")
	}
	// What the child may exec lies within what its parent may: by what the entries resolve
	// to when both are known (a preset, a tree, a file beneath one of the parent's trees),
	// by name otherwise.
	shellNames := cp.Shell.Allow
	if p.Shell != nil && c.Shell != nil {
		shellNames = nil
		if what, ok := toolchain.Covers(p.Shell, c.Shell); !ok {
			return refuse("capabilities.shell.allow", "the child may exec %s, which its parent may not", what)
		}
	}
	for _, axis := range []struct {
		key           string
		child, parent []string
	}{
		{"capabilities.shell.allow", shellNames, pp.Shell.Allow},
		{"capabilities.spawn.allow", cp.Spawn.Allow, pp.Spawn.Allow},
		{"capabilities.env.allow", cp.Env.Allow, pp.Env.Allow},
	} {
		for _, e := range axis.child {
			if !slices.Contains(axis.parent, e) {
				return refuse(axis.key, "the child declares %q, which its parent does not hold", e)
			}
		}
	}
	if ps := pp.Filesystem.Scope; ps != "" {
		cs := cp.Filesystem.Scope
		if cs == "" {
			return refuse("capabilities.filesystem.scope", "the child asks for the whole workdir; its parent is scoped to %q", ps)
		}
		if cs != ps && !strings.HasPrefix(cs, ps+"/") {
			return refuse("capabilities.filesystem.scope", "the child declares %q, which is not %q or beneath it", cs, ps)
		}
	}
	for _, h := range cp.Filesystem.HostRead {
		if !slices.ContainsFunc(pp.Filesystem.HostRead, func(q string) bool { return toolchain.Beneath(h, q) }) {
			return refuse("capabilities.filesystem.host_read", "the child declares %q, which its parent does not hold", h)
		}
	}
	if cp.Filesystem.System == manifest.SystemFull && pp.Filesystem.System != manifest.SystemFull {
		return refuse("capabilities.filesystem.system", "the child declares %q, which lets the ELF loader run every host program; its parent holds %q", manifest.SystemFull, pp.Filesystem.System)
	}
	if cp.Filesystem.WorkdirExec && !pp.Filesystem.WorkdirExec {
		return refuse("capabilities.filesystem.workdir_exec", "the child declares true; its parent does not hold it")
	}
	cr, pr := cp.Resources, pp.Resources
	for _, l := range []struct {
		key           string
		child, parent manifest.Limit
	}{
		{"capabilities.resources.cgroup_memory_bytes", cr.CgroupMemoryBytes, pr.CgroupMemoryBytes},
		{"capabilities.resources.cgroup_pids_max", cr.CgroupPidsMax, pr.CgroupPidsMax},
		{"capabilities.resources.cgroup_cpu_percent", cr.CgroupCPUPercent, pr.CgroupCPUPercent},
		{"capabilities.resources.max_open_files", cr.MaxOpenFiles, pr.MaxOpenFiles},
		{"capabilities.resources.max_file_size_bytes", cr.MaxFileSizeBytes, pr.MaxFileSizeBytes},
		{"capabilities.resources.cpu_seconds", cr.CPUSeconds, pr.CPUSeconds},
		{"capabilities.resources.max_processes", cr.MaxProcesses, pr.MaxProcesses},
		{"capabilities.resources.memory_bytes", cr.MemoryBytes, pr.MemoryBytes},
		{"capabilities.resources.workdir_max_bytes", cr.WorkdirMaxBytes, pr.WorkdirMaxBytes},
		{"capabilities.resources.workdir_max_inodes", cr.WorkdirMaxInodes, pr.WorkdirMaxInodes},
		{"capabilities.resources.log_max_bytes", cr.LogMaxBytes, pr.LogMaxBytes},
		{"capabilities.resources.endpoint_max_connections", cr.EndpointMaxConnections, pr.EndpointMaxConnections},
		{"capabilities.resources.egress_bytes_per_sec", cr.EgressBytesPerSec, pr.EgressBytesPerSec},
		{"capabilities.spawn.max_total_children", cp.Spawn.MaxTotalChildren, pp.Spawn.MaxTotalChildren},
		{"capabilities.limits.memory_bytes", cp.Limits.MemoryBytes, pp.Limits.MemoryBytes},
		{"capabilities.limits.deadline_seconds", cp.Limits.DeadlineSeconds, pp.Limits.DeadlineSeconds},
	} {
		if l.child.Value > l.parent.Value {
			return refuse(l.key, "the child's %d is more than its parent's %d", l.child.Value, l.parent.Value)
		}
	}
	// 0 is no bound: only a bounded parent constrains, and then the child needs a bound too.
	for _, l := range []struct {
		key           string
		child, parent int64
	}{
		{"capabilities.resources.egress_max_bytes", cr.EgressMaxBytes.Value, pr.EgressMaxBytes.Value},
		{"capabilities.limits.wasm_fuel", cp.Limits.WasmFuel.Value, pp.Limits.WasmFuel.Value},
	} {
		switch {
		case l.parent > 0 && l.child == 0:
			return refuse(l.key, "the child declares no bound; its parent's is %d", l.parent)
		case l.parent > 0 && l.child > l.parent:
			return refuse(l.key, "the child's %d is more than its parent's %d", l.child, l.parent)
		}
	}
	if c.Floor < p.Achieved {
		return refuse("capabilities.containment", "the child would run %s, weaker than its parent's %s; a child's containment may only rise", c.Floor, p.Achieved)
	}
	// Host root is the most a session can hold: only a parent that holds it may hand it on.
	if c.HostRoot && !p.HostRoot {
		return refuse("sessions.allow_root", "the child would run as host root (roostd's sessions.allow_root names %q), which its parent does not", c.Name)
	}
	return nil
}

// Covers says whether the parent's network.allow entry p admits everything the child's
// entry c does: a bare host covers every scheme and port of it, host:port that port under
// any scheme, scheme://host[:port] only itself. A parent wildcard *.example.com covers the
// child hosts it matches (a.example.com, x.a.example.com), a narrower or equal wildcard
// (*.a.example.com, *.example.com), but not the apex example.com; a parent's exact host
// never covers a child's wildcard.
func Covers(p, c manifest.NetRule) bool {
	var host bool
	switch {
	case p.Host == c.Host:
		host = true
	case c.IsWildcard():
		// c admits the names beneath its base; p admits them all when it admits the base
		// as a name (and is then itself a wildcard: an exact host admits one name only).
		host = p.IsWildcard() && p.Matches(strings.TrimPrefix(c.Host, "*."))
	default:
		host = p.Matches(c.Host)
	}
	switch {
	case !host:
		return false
	case p.Scheme != "":
		return p.Scheme == c.Scheme && p.Port == c.Port
	case p.Port != 0:
		return c.Port == p.Port
	default:
		return true
	}
}
