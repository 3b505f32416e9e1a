package manifest

import (
	"path"
	"slices"
	"strings"
)

// Defaults for every limit a manifest may leave out. They follow murmur's capabilities block
// where it has the key, so a capsule's grants carry over unchanged.
const (
	DefaultDeadlineSeconds   = 3600
	DefaultWasmMemoryBytes   = 512 << 20
	DefaultCgroupMemoryBytes = 4 << 30
	DefaultCgroupPidsMax     = 4096
	DefaultCgroupCPUPercent  = 200
	DefaultMaxOpenFiles      = 1024
	DefaultMaxFileSizeBytes  = 4 << 30
	DefaultCPUSeconds        = 3600
	// resources.memory_bytes is RLIMIT_AS, which caps address space, not memory. V8 reserves
	// a 4 GiB pointer cage and 10 GiB per WebAssembly memory (Node's own HTTP client is one),
	// wasmtime 6 GiB per linear memory, the JVM a quarter of the host's RAM for its heap plus
	// 1 GiB of class space, Go's runtime a few hundred MiB. 64 GiB holds Node with several
	// WebAssembly instances and a default JVM on a host of up to 200 GiB of RAM.
	DefaultMemoryBytes      = 64 << 30
	DefaultWorkdirMaxBytes  = 10 << 30
	DefaultWorkdirMaxInodes = 1_000_000
	DefaultLogMaxBytes      = 64 << 20
	DefaultEndpointMaxConns = 64
	// resources.egress_bytes_per_sec is a session's share of the link, each way. 32 MiB/s
	// is a quarter of a 1 Gbit/s link: three sessions pulling as fast as they can still
	// leave a fourth its share, and a 1 GiB download takes half a minute. A session that
	// needs more declares it, up to roostd's egress.max_bytes_per_sec_per_session.
	DefaultEgressBytesPerSec = 32 << 20
	DefaultSpawnMaxDepth     = 3
	DefaultSpawnMaxChildren  = 4
	DefaultSpawnMaxTotal     = 64
)

// What inference.on_exhausted may say.
const (
	OnExhaustedFail = "fail"
	OnExhaustedWait = "wait"
)

// Limit is a resolved limit beside its declared form. Value is always usable; Declared is
// nil when the manifest said nothing, so a declared value equal to the default is still
// told apart from the default.
type Limit struct {
	Value    int64
	Declared *int64
}

func resolve(declared *int64, def int64) Limit {
	if declared == nil {
		return Limit{Value: def}
	}
	v := *declared
	return Limit{Value: v, Declared: &v}
}

// Policy is a manifest's capabilities lowered to one fully resolved value: no field is
// "unset". Every absent block, absent key, false and empty list is a deny.
type Policy struct {
	// Containment is the manifest's floor; DefaultClass when it names none.
	Containment         Class
	ContainmentDeclared bool
	Network             NetworkPolicy
	Filesystem          FilesystemPolicy
	Shell               ShellPolicy
	Spawn               SpawnPolicy
	Env                 EnvPolicy
	Limits              LimitsPolicy
	Resources           ResourcesPolicy
	Inference           InferencePolicy
}

// NetworkPolicy is where the program may connect.
type NetworkPolicy struct {
	Allow       []NetRule
	UnixSockets bool
}

// FilesystemPolicy is what the program may do in its workdir.
type FilesystemPolicy struct {
	// Scope is the workdir subtree the program may write, clean and relative; "" is the
	// whole workdir.
	Scope       string
	WorkdirExec bool
	ReadOnly    []string
	// HostRead lists host trees (absolute, clean) the program may read, among those roostd's
	// sessions.host_paths offers: toolchains outside /usr.
	HostRead []string
	// System is how much of the host's system trees (/usr and the /bin, /lib* links) a
	// contained session sees: SystemAllowlist, the closure of what it may execute, or
	// SystemFull, all of them.
	System string
}

// How much of the host's system trees a contained session sees (filesystem.system).
const (
	// SystemAllowlist: the files its allowlist's programs are made of (their ELF loader and
	// libraries), the trees its presets name, and the data every program reads. The ELF
	// loader, which maps what it is given without exec, then finds nothing else to run.
	SystemAllowlist = "allowlist"
	// SystemFull: every file of the system trees, readable; the loader can run any of them,
	// so the allowlist does not hold against it.
	SystemFull = "full"
)

// ShellPolicy is what the program may exec besides run.command[0].
type ShellPolicy struct {
	Allow []string
}

// SpawnPolicy is what the session may spawn.
type SpawnPolicy struct {
	Allow           []string
	WorkdirSnapshot []string
	MaxDepth        Limit
	MaxChildren     Limit
	// MaxTotalChildren bounds the children started over the session's whole life.
	MaxTotalChildren Limit
}

// EnvPolicy is which host variables pass through.
type EnvPolicy struct {
	Allow []string
}

// LimitsPolicy is capabilities.limits resolved.
type LimitsPolicy struct {
	DeadlineSeconds Limit
	MemoryBytes     Limit
	// WasmFuel bounds a WASM guest's instructions; Value 0 when undeclared: no bound.
	WasmFuel Limit
}

// ResourcesPolicy is capabilities.resources resolved.
type ResourcesPolicy struct {
	CgroupMemoryBytes Limit
	CgroupPidsMax     Limit
	CgroupCPUPercent  Limit
	MaxOpenFiles      Limit
	MaxFileSizeBytes  Limit
	CPUSeconds        Limit
	MaxProcesses      Limit
	MemoryBytes       Limit
	WorkdirMaxBytes   Limit
	// WorkdirMaxInodes bounds the files the workdir (with the home, TMPDIR and children's
	// workdirs) may hold.
	WorkdirMaxInodes Limit
	// LogMaxBytes bounds each output stream kept in the records directory.
	LogMaxBytes Limit
	// EndpointMaxConnections bounds the session's concurrent connections to its endpoint.
	EndpointMaxConnections Limit
	// EgressMaxBytes bounds what the session's egress proxy carries, up and down together;
	// Value 0 when undeclared: no bound.
	EgressMaxBytes Limit
	// EgressBytesPerSec is the session's bandwidth share through its egress proxy, each way.
	EgressBytesPerSec Limit
}

// InferencePolicy is the inference block resolved.
type InferencePolicy struct {
	Upstream string
	Model    string
	// MaxSessionTokens is nil when the session has no ceiling of its own.
	MaxSessionTokens *int64
	OnExhausted      string
}

// Lower resolves a manifest's capabilities into a Policy.
func Lower(m *Manifest) Policy {
	c := m.Capabilities
	if c == nil {
		c = &Capabilities{}
	}
	p := Policy{Containment: DefaultClass}
	p.Filesystem.System = SystemAllowlist
	if c.Containment != nil {
		p.Containment, p.ContainmentDeclared = *c.Containment, true
	}

	if n := c.Network; n != nil {
		for _, e := range n.Allow {
			// Parse has validated every entry.
			if r, err := ParseNetRule(e); err == nil && !slices.Contains(p.Network.Allow, r) {
				p.Network.Allow = append(p.Network.Allow, r)
			}
		}
		p.Network.UnixSockets = deref(n.UnixSockets)
	}

	if f := c.Filesystem; f != nil {
		if f.Scope != nil {
			if s := path.Clean(*f.Scope); s != "." {
				p.Filesystem.Scope = s
			}
		}
		p.Filesystem.WorkdirExec = deref(f.WorkdirExec)
		for _, ro := range f.ReadOnly {
			if ro = strings.TrimSpace(ro); ro != "" {
				p.Filesystem.ReadOnly = appendUnique(p.Filesystem.ReadOnly, path.Clean(ro))
			}
		}
		p.Filesystem.HostRead = unique(f.HostRead)
		if f.System != "" {
			p.Filesystem.System = f.System
		}
	}

	if s := c.Shell; s != nil {
		p.Shell.Allow = unique(s.Allow)
	}

	var sp Spawn
	if c.Spawn != nil {
		sp = *c.Spawn
	}
	p.Spawn = SpawnPolicy{
		Allow:            unique(sp.Allow),
		WorkdirSnapshot:  unique(sp.WorkdirSnapshot),
		MaxDepth:         resolve(sp.MaxDepth, DefaultSpawnMaxDepth),
		MaxChildren:      resolve(sp.MaxChildren, DefaultSpawnMaxChildren),
		MaxTotalChildren: resolve(sp.MaxTotalChildren, DefaultSpawnMaxTotal),
	}

	if e := c.Env; e != nil {
		p.Env.Allow = unique(e.Allow)
	}

	var l Limits
	if c.Limits != nil {
		l = *c.Limits
	}
	p.Limits = LimitsPolicy{
		DeadlineSeconds: resolve(l.DeadlineSeconds, DefaultDeadlineSeconds),
		MemoryBytes:     resolve(l.MemoryBytes, DefaultWasmMemoryBytes),
		WasmFuel:        resolve(l.WasmFuel, 0),
	}

	var r Resources
	if c.Resources != nil {
		r = *c.Resources
	}
	// max_processes defaults to cgroup_pids_max: one ceiling on processes, the cgroup's.
	// pids.max counts the session's whole tree, and RLIMIT_NPROC (its uid's processes,
	// which that tree holds) at the same number adds no lower one. A lower RLIMIT_NPROC
	// failed make -j$(nproc) on a 128-core host (some 400 processes: make, gcc, cc1 and as
	// per job) even with pids.max raised.
	pids := resolve(r.CgroupPidsMax, DefaultCgroupPidsMax)
	p.Resources = ResourcesPolicy{
		CgroupMemoryBytes:      resolve(r.CgroupMemoryBytes, DefaultCgroupMemoryBytes),
		CgroupPidsMax:          pids,
		CgroupCPUPercent:       resolve(r.CgroupCPUPercent, DefaultCgroupCPUPercent),
		MaxOpenFiles:           resolve(r.MaxOpenFiles, DefaultMaxOpenFiles),
		MaxFileSizeBytes:       resolve(r.MaxFileSizeBytes, DefaultMaxFileSizeBytes),
		CPUSeconds:             resolve(r.CPUSeconds, DefaultCPUSeconds),
		MaxProcesses:           resolve(r.MaxProcesses, pids.Value),
		MemoryBytes:            resolve(r.MemoryBytes, DefaultMemoryBytes),
		WorkdirMaxBytes:        resolve(r.WorkdirMaxBytes, DefaultWorkdirMaxBytes),
		WorkdirMaxInodes:       resolve(r.WorkdirMaxInodes, DefaultWorkdirMaxInodes),
		LogMaxBytes:            resolve(r.LogMaxBytes, DefaultLogMaxBytes),
		EndpointMaxConnections: resolve(r.EndpointMaxConnections, DefaultEndpointMaxConns),
		EgressMaxBytes:         resolve(r.EgressMaxBytes, 0),
		EgressBytesPerSec:      resolve(r.EgressBytesPerSec, DefaultEgressBytesPerSec),
	}

	p.Inference.OnExhausted = OnExhaustedFail
	if inf := m.Inference; inf != nil {
		p.Inference.Upstream = inf.Upstream
		p.Inference.Model = inf.Model
		if inf.MaxSessionTokens != nil {
			v := *inf.MaxSessionTokens
			p.Inference.MaxSessionTokens = &v
		}
		if inf.OnExhausted != "" {
			p.Inference.OnExhausted = inf.OnExhausted
		}
	}
	return p
}

// LowerDeadline lowers the deadline to seconds when that is shorter; a deadline can only be
// lowered from outside the manifest. The declared form is kept.
func (p *Policy) LowerDeadline(seconds int64) {
	if seconds > 0 && seconds < p.Limits.DeadlineSeconds.Value {
		p.Limits.DeadlineSeconds.Value = seconds
	}
}

// LowerCgroupMemory lowers resources.cgroup_memory_bytes to bytes when that is less; like the
// deadline, it can only be lowered from outside the manifest. The declared form is kept.
func (p *Policy) LowerCgroupMemory(bytes int64) {
	if bytes > 0 && bytes < p.Resources.CgroupMemoryBytes.Value {
		p.Resources.CgroupMemoryBytes.Value = bytes
	}
}

func deref(b *bool) bool { return b != nil && *b }

func unique(in []string) []string {
	var out []string
	for _, s := range in {
		out = appendUnique(out, s)
	}
	return out
}

func appendUnique(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
