// Package store is the session record: the bbolt registry's buckets and their migrations,
// the Record and its states, the one transition table that moves a record between them,
// session names and ids, the event log and its compaction, and the host id ranges sessions
// hold. Nothing else touches the registry's buckets. It knows no process: it imports no
// containment, endpoint or gateway package, and it never starts, signals or waits for
// anything (pkg/session does, and writes here what it saw).
package store

import (
	"time"

	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/toolchain"
)

// State is where a session is in its life.
type State string

// The states, in the order a session normally passes through them.
const (
	Staged    State = "staged"
	Launching State = "launching"
	Running   State = "running"
	Paused    State = "paused"
	Stopping  State = "stopping"
	Exited    State = "exited"
)

// States lists every state.
var States = []State{Staged, Launching, Running, Paused, Stopping, Exited}

// Live reports whether a process may exist for a session in this state.
func (s State) Live() bool {
	return s == Launching || s == Running || s == Paused || s == Stopping
}

// ExitStatus is how a session ended.
type ExitStatus string

// The exit statuses.
const (
	StatusOK              ExitStatus = "ok"
	StatusError           ExitStatus = "error"
	StatusCrashed         ExitStatus = "crashed"
	StatusTerminated      ExitStatus = "terminated"
	StatusDeadlineReached ExitStatus = "deadline_reached"
	StatusStartFailed     ExitStatus = "start_failed"
	StatusLost            ExitStatus = "lost"
)

// EndRequest is why roost itself was ending a session, recorded before it signals so an end
// observed later (even by a restarted daemon) is classified by its cause.
type EndRequest string

// The end requests.
const (
	EndNone     EndRequest = ""
	EndStop     EndRequest = "stop"
	EndKill     EndRequest = "kill"
	EndDeadline EndRequest = "deadline"
	// EndWorkdir: the workdir grew past resources.workdir_max_bytes.
	EndWorkdir EndRequest = "workdir"
	// EndParent: the session's parent ended (the lifeline).
	EndParent EndRequest = "parent"
)

// Record is a session as the registry keeps it.
type Record struct {
	ID string `json:"id"`
	// Name is what the operator named the session at stage (run|stage --name); empty for
	// none. Unique among the sessions the registry holds (see names.go).
	Name    string     `json:"name,omitempty"`
	Capsule CapsuleRef `json:"capsule"`
	// State is kept under its own key in the session's bucket (see buckets.go), not in the
	// JSON, so state scans read a few bytes per session.
	State      State      `json:"-"`
	ExitStatus ExitStatus `json:"exit_status,omitempty"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Detail     string     `json:"detail,omitempty"`
	// Declared is the containment floor, Achieved the class it runs under.
	Declared string `json:"declared"`
	Achieved string `json:"achieved"`
	ParentID string `json:"parent_id,omitempty"`
	Workdir  string `json:"workdir"`
	// OwnsWorkdir is true when roost made the workdir under its state dir; removing the
	// session removes it. A workdir the operator named is never removed.
	OwnsWorkdir bool   `json:"owns_workdir,omitempty"`
	RecordsDir  string `json:"records_dir"`
	// Command is the program's command line as staged.
	Command []string `json:"command"`
	// Deadline is the session's wall-clock budget, from the moment it runs.
	Deadline time.Duration `json:"deadline"`
	// MemoryLimit is resources.cgroup_memory_bytes as staged, lowered by stage's memory
	// option: the manifest alone does not say it (see registry.manifest). 0 for a session
	// staged before it was kept.
	MemoryLimit int64 `json:"memory_limit,omitempty"`
	// WorkdirLimit is resources.workdir_max_bytes: how large the workdir may grow.
	WorkdirLimit int64     `json:"workdir_limit,omitempty"`
	DeadlineAt   time.Time `json:"deadline_at,omitzero"`
	CreatedAt    time.Time `json:"created_at"`
	StartedAt    time.Time `json:"started_at,omitzero"`
	EndedAt      time.Time `json:"ended_at,omitzero"`
	// Process names the running processes, for signals and for re-attaching after a restart.
	Process    *records.ProcessRef `json:"process,omitempty"`
	EndRequest EndRequest          `json:"end_request,omitempty"`
	// EndSignal is the signal roost sent for an EndKill request.
	EndSignal int `json:"end_signal,omitempty"`
	// KillAt is when a stop under way escalates to SIGKILL; kept so a restarted daemon
	// escalates on time.
	KillAt time.Time `json:"kill_at,omitzero"`
	// DepthRemaining is how many levels of children may still be started below the
	// session: the least of roostd --max-depth and every ancestor's spawn.max_depth, one
	// less at each level.
	DepthRemaining int `json:"depth_remaining"`
	// EndpointPort is the host loopback port of the session's endpoint when it has no
	// network namespace of its own; kept so a restarted daemon listens on it again.
	EndpointPort int `json:"endpoint_port,omitempty"`
	// HasTask says the launch carried a task text (the registry's task key).
	HasTask bool `json:"has_task,omitempty"`
	// PausedAt is when a paused session was frozen: the deadline does not run while paused.
	PausedAt time.Time `json:"paused_at,omitzero"`
	// EndDetail is what roost saw when it decided to end the session (e.g. the workdir's
	// size), for the detail of its end.
	EndDetail string `json:"end_detail,omitempty"`
	// IDs is the host uid/gid range the session's processes run as, held from stage until
	// the session is removed; nil for a session that runs as host root (HostRoot) and for
	// one staged by a roostd from before ranges.
	IDs *IDs `json:"ids,omitempty"`
	// HostRoot: the operator's sessions.allow_root names the capsule, and the session is
	// not sealed, so its program runs as host root.
	HostRoot bool `json:"host_root,omitempty"`
	// Shell is what each shell.allow entry resolved to when the session was staged: what
	// it may exec (nil for a session staged before; its names are looked up at launch).
	Shell []toolchain.Entry `json:"shell,omitempty"`
	// WorkdirOwner is who owned an operator's --workdir before the session was given it;
	// removing the session hands the tree back.
	WorkdirOwner *Owner `json:"workdir_owner,omitempty"`
	// Tokens is what the session was charged; InputTokens and OutputTokens what the calls it
	// settled reported (reservations charged in full count in Tokens only).
	Tokens       int64 `json:"tokens,omitempty"`
	InputTokens  int64 `json:"input_tokens,omitempty"`
	OutputTokens int64 `json:"output_tokens,omitempty"`
	// Wasm is what a run.wasm session runs: its module and compiled entry; nil for a command.
	Wasm *WasmRun `json:"wasm,omitempty"`
	// Egress is what the session's egress proxy carried, kept at its end.
	Egress *EgressTotals `json:"egress,omitempty"`
	// Warm says the session started in a sandbox made ahead of it (roostd --warm-pool).
	Warm bool `json:"warm,omitempty"`
	// Labels are what the client labelled the session with at stage (labels.go); nil for
	// none. Kept under their own key in the session's bucket (see buckets.go), so a listing
	// by label reads a few bytes of each session it passes over; written with the record's
	// creation and never again.
	Labels map[string]string `json:"-"`
	// Placement is how the fleet chose this node for the session, as the entry node that
	// placed it said; nil for a session staged where it was asked to be.
	Placement *Placement `json:"placement,omitempty"`
}

// Placement is where the fleet placed a session, and why (pkg/fleet/placement).
type Placement struct {
	Node       string               `json:"node"`
	Entry      string               `json:"entry"`
	At         time.Time            `json:"at"`
	Reason     string               `json:"reason"`
	Candidates []PlacementCandidate `json:"candidates,omitempty"`
}

// PlacementCandidate is one node as placement read it.
type PlacementCandidate struct {
	Node     string  `json:"node"`
	Running  int     `json:"running"`
	InFlight int     `json:"in_flight,omitempty"`
	Max      int     `json:"max,omitempty"`
	CPUs     int     `json:"cpus,omitempty"`
	Warm     bool    `json:"warm,omitempty"`
	Score    float64 `json:"score"`
	Drawn    bool    `json:"drawn,omitempty"`
	Refused  string  `json:"refused,omitempty"`
}

// CapsuleRef names what a session runs.
type CapsuleRef struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
	// Source is where the capsule was read from (a directory, or a pushed capsule's
	// stored tree); Dir is the copy in the content store the session runs, named by SHA256
	// (empty for a session staged before there was one: it runs Source).
	Source string `json:"source"`
	Dir    string `json:"dir,omitempty"`
}

// Root is where the session reads its capsule.
func (c CapsuleRef) Root() string {
	if c.Dir != "" {
		return c.Dir
	}
	return c.Source
}

// IDs is a host uid/gid range: a sealed session's user namespace maps 0..Size-1 onto
// First..First+Size-1; the program of a session of another class runs as First. It is
// containment.IDs as the record keeps it.
type IDs struct {
	First uint32 `json:"first"`
	Size  uint32 `json:"size"`
}

// Owner is a file's owner on the host.
type Owner struct {
	UID int `json:"uid"`
	GID int `json:"gid"`
}

// EgressTotals is what a session's proxy carried over its whole life.
type EgressTotals struct {
	// Connections counts allowed connections and requests, Denied refused ones.
	Connections int64 `json:"connections,omitempty"`
	Denied      int64 `json:"denied,omitempty"`
	// BytesUp and BytesDown are payload bytes to and from the destinations.
	BytesUp   int64 `json:"bytes_up,omitempty"`
	BytesDown int64 `json:"bytes_down,omitempty"`
	// Used is what counted against resources.egress_max_bytes.
	Used int64 `json:"used,omitempty"`
	// Refused are the refusals by (host, port, reason), the most frequent first; at most
	// MaxEgressRefusals of them.
	Refused []EgressRefusal `json:"refused,omitempty"`
}

// MaxEgressRefusals bounds the refusal keys a record keeps.
const MaxEgressRefusals = 20

// EgressRefusal counts a session's refused connections to one host and port for one reason.
type EgressRefusal struct {
	Proto  string    `json:"proto,omitempty"`
	Host   string    `json:"host"`
	Port   int       `json:"port,omitempty"`
	Reason string    `json:"reason"`
	Count  int64     `json:"count"`
	First  time.Time `json:"first"`
	Last   time.Time `json:"last"`
	Detail string    `json:"detail,omitempty"`
}

// IsZero says whether the totals hold nothing.
func (t EgressTotals) IsZero() bool {
	return t.Connections == 0 && t.Denied == 0 && t.BytesUp == 0 && t.BytesDown == 0 && t.Used == 0 && len(t.Refused) == 0
}

// Add is t and o's counts together (Refused is not added: it is a ranking, kept whole by
// whoever holds the counters).
func (t EgressTotals) Add(o EgressTotals) EgressTotals {
	return EgressTotals{Connections: t.Connections + o.Connections, Denied: t.Denied + o.Denied,
		BytesUp: t.BytesUp + o.BytesUp, BytesDown: t.BytesDown + o.BytesDown, Used: t.Used + o.Used}
}

// WasmRun is what a WASM session runs: its module and the compiled entry made at stage.
type WasmRun struct {
	// Module is run.wasm, relative to the capsule directory.
	Module string `json:"module"`
	// SHA256 is the module's digest (hex).
	SHA256 string `json:"sha256"`
	// Cache is the compiled entry's name in the state's wasm/ directory, CacheSHA256 the
	// digest of its bytes: the runner uses it only when both hold.
	Cache       string `json:"cache"`
	CacheSHA256 string `json:"cache_sha256"`
	// Runtime is what compiled it: the runner's `version` line.
	Runtime string `json:"runtime"`
}
