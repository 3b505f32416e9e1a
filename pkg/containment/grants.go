package containment

import (
	"fmt"
	"os"
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

// Rlimits are the resource limits a session's processes get, one per resources key that
// maps to an rlimit. RLIMIT_AS is address space, not memory: where a cgroup holds memory
// (scoped, sealed) it is set only when the manifest declares resources.memory_bytes; in a
// class whose cgroup sets no limits it is the only ceiling there is, so it always applies, at a default
// (manifest.DefaultMemoryBytes) sized for runtimes that reserve far more than they touch.
func Rlimits(class manifest.Class, p *manifest.Policy) []Rlimit {
	r := p.Resources
	out := []Rlimit{
		{Name: "resources.max_open_files", Resource: unix.RLIMIT_NOFILE, Value: uint64(r.MaxOpenFiles.Value)},
		{Name: "resources.max_file_size_bytes", Resource: unix.RLIMIT_FSIZE, Value: uint64(r.MaxFileSizeBytes.Value)},
		{Name: "resources.cpu_seconds", Resource: unix.RLIMIT_CPU, Value: uint64(r.CPUSeconds.Value)},
		{Name: "resources.max_processes", Resource: unix.RLIMIT_NPROC, Value: uint64(r.MaxProcesses.Value)},
	}
	if r.MemoryBytes.Declared != nil || !hasCgroup(class) {
		out = append(out, Rlimit{Name: "resources.memory_bytes", Resource: unix.RLIMIT_AS, Value: uint64(r.MemoryBytes.Value)})
	}
	return out
}

// hasCgroup says whether a class's sessions run in a cgroup that holds limits. Every
// class's sessions have a cgroup of their own (see Cgroups); unconfined and advisory ones
// set none there.
func hasCgroup(class manifest.Class) bool {
	return class == manifest.Scoped || class == manifest.Sealed
}

// memoryBytes is how resources.memory_bytes is held in a class.
func memoryBytes(class manifest.Class, p *manifest.Policy) [2]string {
	switch {
	case p.Resources.MemoryBytes.Declared != nil:
		return [2]string{Enforced, "RLIMIT_AS on every process (address space, which runtimes with a JIT or a garbage collector reserve far beyond what they use)"}
	case hasCgroup(class):
		return [2]string{NotApplicable, "not set: the cgroup's memory limit (resources.cgroup_memory_bytes) holds memory; RLIMIT_AS applies only when declared"}
	}
	return [2]string{Enforced, "RLIMIT_AS on every process, the only memory ceiling in a class whose cgroup sets no limits; the default is sized for Node, the JVM and Go, which reserve far more address space than they use"}
}

// Grants lists every key of the policy with how a session of class holds it on this host;
// asRoot says the operator lets the session run as host root (sessions.allow_root), wasm
// that it runs a WASM module (run.wasm) in roost's runner. A class this build cannot run
// gets values only: nothing is claimed for it.
func Grants(class manifest.Class, p *manifest.Policy, asRoot, wasm bool) []Grant {
	var out []Grant
	switch class {
	case manifest.Unconfined, manifest.Advisory:
		out = plainGrants(class, p, asRoot)
	case manifest.Sealed:
		out = sealedGrants(p)
	case manifest.Scoped:
		out = scopedGrants(p)
	default:
		out = hold{}.grants(p)
	}
	// The first row is the class in force, whatever the manifest asked for.
	out[0].Value = class.String()
	if wasm && class != manifest.ClassNone {
		out = wasmGrants(out, p)
	}
	return out
}

// values is every policy key with its resolved value, in manifest order.
func values(p *manifest.Policy) [][2]string {
	tokens := "none"
	if p.Inference.MaxSessionTokens != nil {
		tokens = strconv.FormatInt(*p.Inference.MaxSessionTokens, 10)
	}
	r := p.Resources
	return [][2]string{
		{"containment", p.Containment.String()},
		{"network.allow", netList(p.Network.Allow)},
		{"network.unix_sockets", strconv.FormatBool(p.Network.UnixSockets)},
		{"filesystem.scope", orWhole(p.Filesystem.Scope)},
		{"filesystem.workdir_exec", strconv.FormatBool(p.Filesystem.WorkdirExec)},
		{"filesystem.read_only", list(p.Filesystem.ReadOnly)},
		{"filesystem.host_read", list(p.Filesystem.HostRead)},
		{"filesystem.system", orDefault(p.Filesystem.System, manifest.SystemAllowlist)},
		{"shell.allow", list(p.Shell.Allow)},
		{"spawn.allow", list(p.Spawn.Allow)},
		{"spawn.workdir_snapshot", list(p.Spawn.WorkdirSnapshot)},
		{"spawn.max_depth", limit(p.Spawn.MaxDepth)},
		{"spawn.max_children", limit(p.Spawn.MaxChildren)},
		{"spawn.max_total_children", limit(p.Spawn.MaxTotalChildren)},
		{"env.allow", list(p.Env.Allow)},
		{"limits.deadline_seconds", limit(p.Limits.DeadlineSeconds)},
		{"limits.memory_bytes", limit(p.Limits.MemoryBytes)},
		{"limits.wasm_fuel", orNoBound(p.Limits.WasmFuel)},
		{"resources.cgroup_memory_bytes", limit(r.CgroupMemoryBytes)},
		{"resources.cgroup_pids_max", limit(r.CgroupPidsMax)},
		{"resources.cgroup_cpu_percent", limit(r.CgroupCPUPercent)},
		{"resources.max_open_files", limit(r.MaxOpenFiles)},
		{"resources.max_file_size_bytes", limit(r.MaxFileSizeBytes)},
		{"resources.cpu_seconds", limit(r.CPUSeconds)},
		{"resources.max_processes", limit(r.MaxProcesses)},
		{"resources.memory_bytes", limit(r.MemoryBytes)},
		{"resources.workdir_max_bytes", limit(r.WorkdirMaxBytes)},
		{"resources.workdir_max_inodes", limit(r.WorkdirMaxInodes)},
		{"resources.log_max_bytes", limit(r.LogMaxBytes)},
		{"resources.endpoint_max_connections", limit(r.EndpointMaxConnections)},
		{"resources.egress_max_bytes", orNoBound(r.EgressMaxBytes)},
		{"resources.egress_bytes_per_sec", limit(r.EgressBytesPerSec)},
		{"inference.upstream", orNone(p.Inference.Upstream)},
		{"inference.model", orNone(p.Inference.Model)},
		{"inference.max_session_tokens", tokens},
		{"inference.on_exhausted", p.Inference.OnExhausted},
	}
}

// hold is how one class holds each key: enforcement and mechanism by key.
type hold map[string][2]string

func (hd hold) grants(p *manifest.Policy) []Grant {
	g := &grantList{}
	for _, kv := range values(p) {
		how := hd[kv[0]]
		g.add(kv[0], kv[1], how[0], how[1])
	}
	return g.out
}

// Held by roost itself, whatever the class.
var common = hold{
	"env.allow":                          {Enforced, "roost builds the environment: the manifest's env, these host variables, and ROOST_*"},
	"limits.deadline_seconds":            {Enforced, "roostd sends SIGTERM at the deadline and SIGKILL 10s later"},
	"limits.memory_bytes":                {NotApplicable, "bounds a WASM guest's memory; this session runs a command"},
	"limits.wasm_fuel":                   {NotApplicable, "bounds a WASM guest's instructions; this session runs a command"},
	"resources.max_open_files":           {Enforced, "RLIMIT_NOFILE on every process"},
	"resources.max_file_size_bytes":      {Enforced, "RLIMIT_FSIZE on every process"},
	"resources.cpu_seconds":              {Enforced, "RLIMIT_CPU on every process"},
	"inference.upstream":                 {Advisory, "the session's gateway forwards only to this upstream, with the operator's key; but this class does not stop the program reaching the network itself"},
	"inference.model":                    {Advisory, "the gateway refuses calls naming another model; but this class does not stop the program reaching the network itself"},
	"inference.max_session_tokens":       {Advisory, "the ledger admits calls through the gateway and /v1/spend only within it and every ancestor's; but this class does not stop the program reaching the network itself"},
	"inference.on_exhausted":             {Enforced, "a gateway call refused at the machine's ceiling waits for budget (wait) or gets 429 (fail)"},
	"resources.workdir_max_inodes":       {Enforced, "roostd counts the files of the workdir, home, TMPDIR and children's workdirs every 2s (by descriptors, hard links once) and stops the session once past it"},
	"resources.log_max_bytes":            {Enforced, "roost-init keeps at most this much of each output stream: its first bytes and its newest, the cut marked; the program never blocks on it"},
	"resources.endpoint_max_connections": {Enforced, "the session's endpoint closes connections past it at once (header, body and idle timeouts too)"},
}

// In a network namespace of its own the session reaches the upstream with the operator's key
// only through its gateway, so what the gateway holds, holds.
var netnsInference = hold{
	"inference.upstream":           {Enforced, "the session's gateway forwards only to this upstream, with the operator's key; the session's network namespace reaches nothing else but what its egress proxy admits"},
	"inference.model":              {Enforced, "the gateway refuses calls naming another model"},
	"inference.max_session_tokens": {Enforced, "the ledger admits each call through the gateway (or /v1/spend) only within it and every ancestor's, durably and strictly"},
}

// egress is how a session in a network namespace of its own reaches the outside: through
// the proxy on its endpoint, which admits only network.allow.
func egress(p *manifest.Policy) hold {
	allow := [2]string{Enforced, "own network namespace with loopback only: nothing outside is reachable, and no proxy is offered"}
	if len(p.Network.Allow) > 0 {
		allow = [2]string{Enforced, "own network namespace with loopback only; the proxy on its endpoint (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY) connects only to these, resolving names in roostd and dialling the address it checked, refusing special-purpose addresses (loopback, private, link-local, metadata, …) unless a rule names the IP or roostd's egress.permit_cidrs opens them; every connection audited in trace.jsonl"}
	}
	max := [2]string{Enforced, "no bound on what the proxy carries (roostd's egress.max_connections_per_session bounds its connections)"}
	if p.Resources.EgressMaxBytes.Declared != nil {
		max = [2]string{Enforced, "the session's proxy refuses new connections and cuts open ones once the bytes it carried up and down together reach it"}
	}
	rate := [2]string{Enforced, "the session's proxy paces what it carries to this many bytes a second each way, one token bucket per direction for all its connections (roostd's egress.max_bytes_per_sec_per_session caps it)"}
	return hold{"network.allow": allow, "resources.egress_max_bytes": max, "resources.egress_bytes_per_sec": rate}
}

var workdirGuard = [2]string{Enforced, "roostd measures the workdir every 2s (allocated blocks, links not followed) and stops the session once past it"}

func with(base hold, more hold) hold {
	out := hold{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

func plainGrants(class manifest.Class, p *manifest.Policy, asRoot bool) []Grant {
	noKernel := "not enforced: the " + class.String() + " class has no kernel sandbox"
	referee := "roost's endpoint (a host loopback port; the credential names the session) referees every spawn it launches, but nothing in this class stops the program from starting programs itself"
	nproc := [2]string{Enforced, "RLIMIT_NPROC, counted against the session's own uid"}
	containment := [2]string{Enforced, "the class this session runs under: a plain process tree as an unprivileged uid of its own (no capabilities, no_new_privs)"}
	if asRoot {
		nproc = [2]string{Advisory, "RLIMIT_NPROC is set, but the kernel does not apply it to root, which this session runs as (sessions.allow_root)"}
		containment = [2]string{Enforced, "the class this session runs under: a plain process tree as host root, which roostd's sessions.allow_root allows for this capsule"}
	}
	return with(with(common, spawnGrants(Advisory, referee)), hold{
		"containment":                    containment,
		"network.allow":                  {Advisory, noKernel + " (no network namespace); the program reaches whatever the host reaches"},
		"resources.egress_max_bytes":     {NotApplicable, "this class has no egress proxy: the program reaches the network directly"},
		"resources.egress_bytes_per_sec": {NotApplicable, "nothing paces the program's traffic: it shares the host's link as any host process does"},
		"network.unix_sockets":           {Advisory, noKernel + " (no seccomp filter)"},
		"filesystem.scope":               {Advisory, noKernel + " (no Landlock, no mount confinement)"},
		"filesystem.workdir_exec":        {Advisory, noKernel},
		"filesystem.read_only":           {Advisory, noKernel},
		"filesystem.host_read":           {NotApplicable, "the host is readable as its uid allows: this class has no Landlock"},
		"filesystem.system":              {NotApplicable, "the host's system trees are readable as its uid allows, and run as its uid may: this class has no exec allowlist"},
		"shell.allow":                    {Advisory, noKernel + " (no exec allowlist)"},
		"resources.cgroup_memory_bytes":  {Advisory, noKernel + " (its cgroup sets no limits)"},
		"resources.cgroup_pids_max":      {Advisory, "not enforced, as cgroup_memory_bytes"},
		"resources.cgroup_cpu_percent":   {Advisory, "not enforced, as cgroup_memory_bytes"},
		"resources.max_processes":        nproc,
		"resources.memory_bytes":         memoryBytes(class, p),
		"resources.workdir_max_bytes":    workdirGuard,
	}).grants(p)
}

func scopedGrants(p *manifest.Policy) []Grant {
	unix := [2]string{Enforced, "seccomp: socket(AF_UNIX) fails with EACCES, and so does a datagram socketpair (a stream or seqpacket socketpair, which connects a process only to itself, is allowed)"}
	spawn := [2]string{Enforced, "roost's endpoint, in the session's own network namespace, referees every spawn; roostd's control socket refuses every session's processes (peer credentials checked), and cannot be reached without AF_UNIX anyway"}
	if p.Network.UnixSockets {
		unix = [2]string{Enforced, "allowed; its uid reaches the host's sockets as DAC lets it, abstract ones only within the session (Landlock scope), and roostd's control socket refuses every session's processes (peer credentials checked)"}
		spawn = [2]string{Enforced, "roost's endpoint, in the session's own network namespace, referees every spawn; roostd's control socket refuses every session's processes (peer credentials checked)"}
	}
	readOnly := [2]string{Enforced, "Landlock: nothing outside the scope is writable"}
	if p.Filesystem.Scope == "" && len(p.Filesystem.ReadOnly) > 0 {
		readOnly = [2]string{Advisory, "Landlock cannot take write access back inside a writable tree: give a scope that leaves these out, or use sealed"}
	}
	return with(with(with(with(common, netnsInference), egress(p)), spawnGrants(spawn[0], spawn[1])), hold{
		"containment":                   {Enforced, "on the host's view, as an unprivileged uid of its own, in a network namespace of its own (loopback and its endpoint only), a pid namespace of its own (roost-init its pid 1; its /proc lists only the session's processes) and an IPC namespace of its own (no SysV object or POSIX message queue of the host's; a private /dev/shm): Landlock (reads only the system trees, its capsule, workdir and TMPDIR), cgroup, seccomp (moby's default profile; no new namespaces, no ptrace), no capabilities, no_new_privs; roostctl exec joins its namespaces"},
		"network.unix_sockets":          unix,
		"filesystem.scope":              {Enforced, "Landlock: only the scope (or the whole workdir) and a private TMPDIR are writable; with a scope, only it and the read_only subtrees of the workdir are readable"},
		"filesystem.workdir_exec":       scopedWorkdirExec(p),
		"filesystem.read_only":          readOnly,
		"filesystem.host_read":          {Enforced, "Landlock: readable, never writable; only trees roostd's sessions.host_paths offers"},
		"filesystem.system":             scopedSystem(p),
		"shell.allow":                   {Enforced, "Landlock EXECUTE: only run.command[0], these (looked up on PATH) and their interpreters, each a regular executable file" + loaderNote(p)},
		"resources.cgroup_memory_bytes": {Enforced, "cgroup memory limit, swap 0; the OOM killer ends the session (crashed, oom)"},
		"resources.cgroup_pids_max":     {Enforced, "cgroup pids.max"},
		"resources.cgroup_cpu_percent":  {Enforced, "cgroup cpu quota per 100ms period"},
		"resources.max_processes":       maxProcesses(p, "uid"),
		"resources.memory_bytes":        memoryBytes(manifest.Scoped, p),
		"resources.workdir_max_bytes":   workdirGuard,
	}).grants(p)
}

func sealedGrants(p *manifest.Policy) []Grant {
	unix := [2]string{Enforced, "seccomp: socket(AF_UNIX) fails with EACCES, and so does a datagram socketpair (a stream or seqpacket socketpair, which connects a process only to itself, is allowed)"}
	if p.Network.UnixSockets {
		unix = [2]string{Enforced, "allowed; in a sealed root, with its own network namespace, the only sockets to reach are the session's own"}
	}
	exec := [2]string{Enforced, "/work, /tmp, /dev/shm and /root are mounted noexec and never on the allowlist: nothing the session writes executes; " + memfdExec("roost, from the host, before the session starts,")}
	if p.Filesystem.WorkdirExec {
		exec = [2]string{Enforced, "/work, /tmp, /dev/shm and /root execute what the session puts there, and so may a memfd (its pid namespace keeps the host's vm.memfd_noexec); the rest of the root only the allowlist; the user namespace, namespaces, seccomp and cgroup hold whatever runs"}
	}
	referee := "the session's endpoint, inside its own network namespace, referees every spawn (spawn.allow, depth, live children, then the child's envelope); roostd's socket is absent from the root"
	return with(with(with(with(common, netnsInference), egress(p)), spawnGrants(Enforced, referee)), hold{
		"containment":                   {Enforced, "libcontainer: a user namespace (root inside is an unprivileged uid range of the session's own on the host), mount, pid, ipc, uts, net and cgroup namespaces; a composed read-only root; no capabilities; no_new_privs; seccomp (moby's default profile; no new namespaces, no ptrace)"},
		"network.unix_sockets":          unix,
		"filesystem.scope":              {Enforced, "mounts: /work is read-only but for the scope"},
		"filesystem.workdir_exec":       exec,
		"filesystem.read_only":          {Enforced, "read-only bind mounts over /work"},
		"filesystem.host_read":          {Enforced, "bound read-only into the root at the same paths; only trees roostd's sessions.host_paths offers"},
		"filesystem.system":             sealedSystem(p),
		"shell.allow":                   {Enforced, "Landlock EXECUTE: only run.command[0], these (looked up on PATH inside the root) and their interpreters, each a regular executable file" + loaderNote(p)},
		"resources.cgroup_memory_bytes": {Enforced, "cgroup memory limit, swap 0; the OOM killer ends the session (crashed, oom)"},
		"resources.cgroup_pids_max":     {Enforced, "cgroup pids.max"},
		"resources.cgroup_cpu_percent":  {Enforced, "cgroup cpu quota per 100ms period"},
		"resources.max_processes":       maxProcesses(p, "uid range"),
		"resources.memory_bytes":        memoryBytes(manifest.Sealed, p),
		"resources.workdir_max_bytes":   {Enforced, workdirGuard[1] + "; /tmp is a tmpfs of at most this size"},
	}).grants(p)
}

// maxProcesses is how resources.max_processes is held where the session's cgroup holds
// limits: undeclared, it is cgroup_pids_max, and pids.max, which counts the whole tree, is
// the one ceiling; declared, RLIMIT_NPROC adds its own against the session's uids.
func maxProcesses(p *manifest.Policy, uids string) [2]string {
	if p.Resources.MaxProcesses.Declared == nil {
		return [2]string{Enforced, "cgroup pids.max (resources.cgroup_pids_max, which it defaults to) holds the session's whole tree; RLIMIT_NPROC is set to the same number against the session's own " + uids + ", no lower ceiling"}
	}
	return [2]string{Enforced, "RLIMIT_NPROC against the session's own " + uids + ", beside cgroup pids.max, which holds the whole tree: the lower binds"}
}

// loaderNote says how far shell.allow holds against the ELF loader, which every dynamic
// program needs executable and which maps the program it is given without an exec.
func loaderNote(p *manifest.Policy) string {
	if p.Filesystem.System == manifest.SystemFull {
		return "; but filesystem.system: full leaves every host program readable, and the ELF loader runs any of them (ld.so /usr/bin/perl): against it the allowlist does not hold"
	}
	return "; the ELF loader can map only what the session's view of the system trees holds (filesystem.system), which is what these need; an interpreter runs whatever script it is given"
}

// SystemHolds says, in words, what a session's view of the system trees holds against.
func SystemHolds(class manifest.Class, p *manifest.Policy) string {
	if class != manifest.Scoped && class != manifest.Sealed {
		return "nothing: this class has no exec allowlist"
	}
	if p.Filesystem.System == manifest.SystemFull {
		return "not the ELF loader: every program of the system trees is readable, and ld.so runs any of them without an exec"
	}
	return "the ELF loader: it maps only files of the allowlist's closure, which its programs run anyway; a program the allowlist does not name is absent (sealed) or unreadable (scoped)"
}

func scopedSystem(p *manifest.Policy) [2]string {
	if p.Filesystem.System == manifest.SystemFull {
		return [2]string{Advisory, "Landlock: all of /usr, /bin, /sbin, /lib* and /opt are readable, as the operator's capsule asked; the ELF loader runs any program there without an exec, so the allowlist does not hold against it"}
	}
	return [2]string{Enforced, "Landlock: of /usr, /bin, /sbin, /lib* and /opt only the allowlist's closure is readable (its programs, their ELF loader and libraries read from PT_INTERP and DT_NEEDED, its presets' trees, the data every program reads; explain lists them); the rest can be listed but not opened (EACCES)"}
}

func sealedSystem(p *manifest.Policy) [2]string {
	if p.Filesystem.System == manifest.SystemFull {
		return [2]string{Advisory, "the host's whole /usr bound read-only, as the operator's capsule asked; the ELF loader runs any program there without an exec, so the allowlist does not hold against it"}
	}
	return [2]string{Enforced, "the root's /usr holds only the allowlist's closure (its programs, their ELF loader and libraries read from PT_INTERP and DT_NEEDED, each #! interpreter), its presets' trees bound read-only and the data every program reads; everything else is absent (ENOENT). Built once per closure and shared by the sessions with the same one"}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// spawnGrants: spawn.allow says how spawns are refereed; the other spawn keys say only what
// that referee does with them, so explain does not print the same sentence five times.
func spawnGrants(enforcement, referee string) hold {
	const same = "the referee of spawn.allow "
	return hold{
		"spawn.allow":              {enforcement, referee},
		"spawn.workdir_snapshot":   {enforcement, same + "gives only these children a copy of the parent's workdir"},
		"spawn.max_depth":          {enforcement, same + "refuses a spawn past this depth (and roostd --max-depth)"},
		"spawn.max_children":       {enforcement, same + "refuses a spawn past this many live children"},
		"spawn.max_total_children": {enforcement, same + "refuses a spawn past this many children over the session's life"},
	}
}

func scopedWorkdirExec(p *manifest.Policy) [2]string {
	if p.Filesystem.WorkdirExec {
		return [2]string{Enforced, "its workdir, TMPDIR, home and /dev/shm execute what the session puts there, and so may a memfd (its pid namespace keeps the host's vm.memfd_noexec); the rest of the host only the allowlist; its uid, Landlock's reads and writes, seccomp and cgroup hold whatever runs"}
	}
	return [2]string{Enforced, "nothing the session writes executes: its workdir, TMPDIR, home and /dev/shm are never on the allowlist and are mounted noexec in its own mount namespace, so not even the dynamic loader maps a program from them; " + memfdExec("roost-exec, before it drops root,")}
}

// memfdExec says how a scoped or sealed session without workdir_exec keeps a memfd, which
// lives on no mount Landlock or noexec reaches, from running a copy of any program; setter
// is who sets the sysctl where the kernel has it.
func memfdExec(setter string) string {
	why := MemfdNoExecWhy()
	if why == "" {
		return "nor does a memfd: " + setter + " sets vm.memfd_noexec=2 in its pid namespace (no namespace below it can lower that), so every memfd is made non-executable and sealed so (running one fails with EACCES, by execveat(AT_EMPTY_PATH) or /proc/self/fd alike) and memfd_create(MFD_EXEC) fails with EACCES"
	}
	return "memfds are held only in part: " + why + ", so seccomp makes memfd_create(MFD_EXEC) and execveat(AT_EMPTY_PATH) fail with EACCES, but a memfd run by its /proc/self/fd path still executes"
}

// Executable lists, in words, what a session's program of class may execute.
func Executable(class manifest.Class, p *manifest.Policy) []string {
	allow := "run.command[0], shell.allow and their interpreters"
	switch class {
	case manifest.Scoped:
		if p.Filesystem.WorkdirExec {
			return []string{allow, "anything in its workdir, TMPDIR, home and /dev/shm (workdir_exec)"}
		}
		return []string{allow}
	case manifest.Sealed:
		if p.Filesystem.WorkdirExec {
			return []string{allow + " (inside the root)", "anything in /work, /tmp, /dev/shm and /root (workdir_exec)"}
		}
		return []string{allow + " (inside the root)"}
	default:
		return []string{"anything its uid may execute (this class has no exec allowlist)"}
	}
}

// Readable lists, in words, what a session's program of class may read: the trees a scoped
// program's Landlock rules name (those this host has), what a sealed root holds, or the
// host as its uid sees it.
func Readable(class manifest.Class, p *manifest.Policy) []string {
	switch class {
	case manifest.Scoped:
		var out []string
		if p.Filesystem.System == manifest.SystemFull {
			for _, d := range SystemTrees() {
				if _, err := os.Lstat(d); err == nil {
					out = append(out, d)
				}
			}
		} else {
			out = append(out, "/etc", "of /usr, /bin, /sbin, /lib* and /opt, only the allowlist's closure (the system view)")
		}
		out = append(out, "/proc (its own: the session's processes only)", strings.Join(DeviceFiles(), " "), "its private /dev/shm", "its capsule")
		if p.Filesystem.Scope != "" {
			out = append(out, "its workdir's scope "+p.Filesystem.Scope)
			for _, ro := range p.Filesystem.ReadOnly {
				out = append(out, "its workdir's "+ro+" (read-only)")
			}
		} else {
			out = append(out, "its workdir")
		}
		out = append(out, "its TMPDIR", "its home", "its task text")
		if len(p.Spawn.Allow) > 0 {
			out = append(out, "its children's workdirs")
		}
		return append(out, p.Filesystem.HostRead...)
	case manifest.Sealed:
		usr := "/usr (the allowlist's closure, read-only)"
		if p.Filesystem.System == manifest.SystemFull {
			usr = "/usr (read-only)"
		}
		root := "only its root: " + usr + ", a generated /etc, /capsule (read-only), /work, /tmp, /root, /dev/shm, /proc (masked), a minimal /dev"
		if len(p.Filesystem.HostRead) > 0 {
			root += ", and " + strings.Join(p.Filesystem.HostRead, ", ") + " (read-only, from the host)"
		}
		return []string{root}
	default:
		return []string{"whatever the host lets its uid read (this class has no Landlock)"}
	}
}

// SystemTrees are the host trees a scoped program may read: what programs are made of and
// configured by. Nothing else of the host is readable (roostd's state, /root, /home, /var,
// /run, /srv, /mnt, /media, /tmp), whatever DAC would allow. The scoped runtime's Landlock
// rules name them, and Readable tells them.
func SystemTrees() []string {
	return []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt"}
}

// DeviceFiles are the devices a scoped program may read and write.
func DeviceFiles() []string {
	return []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}
}

type grantList struct {
	out []Grant
}

func (g *grantList) add(key, value, enforcement, mechanism string) {
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

// orNoBound is a limit whose default is no bound.
func orNoBound(l manifest.Limit) string {
	if l.Declared == nil {
		return "none"
	}
	return limit(l)
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

// wasmGrants is how roost's WASM runner holds what a WASM session's guest may do, inside
// the class's containment: its memory, fuel and deadline, and the only files it can name.
func wasmGrants(out []Grant, p *manifest.Policy) []Grant {
	for i := range out {
		switch out[i].Key {
		case "limits.memory_bytes":
			out[i].Enforcement, out[i].Mechanism = Enforced, "wasmtime's store limiter: the guest's linear memory cannot grow past it (memory.grow fails; the guest decides what follows)"
		case "limits.wasm_fuel":
			out[i].Enforcement, out[i].Mechanism = Enforced, "no bound on the guest's instructions (the deadline still ends it)"
			if p.Limits.WasmFuel.Declared != nil {
				out[i].Mechanism = "wasmtime fuel: the guest traps when it is spent, and the session ends crashed"
			}
		case "limits.deadline_seconds":
			out[i].Mechanism = "roostd sends SIGTERM at the deadline, which the runner turns into an epoch interruption of the guest at once (SIGKILL 10s later); the session ends deadline_reached"
		}
	}
	preopens := "/work: the workdir, read-write; /capsule: the capsule, read-only"
	if p.Filesystem.Scope != "" {
		preopens = "/work: the workdir, read-only, and /work/" + p.Filesystem.Scope + " read-write; /capsule: the capsule, read-only"
	}
	return append(out, Grant{Key: "run.wasm", Value: preopens, Enforcement: Enforced,
		Mechanism: "WASI preview 1 in roost's runner (wasmtime), started by roost-init under this class: the guest names no file outside its preopens and has no sockets; the class holds filesystem.scope and read_only beneath /work as for any program"})
}
