package spawn

import (
	"context"
	"time"
)

// Request is a session's ask to start a child: a pushed capsule's name and version, the
// task text the child finds at /run/roost/task.md, and whether to wait for its end.
type Request struct {
	Capsule string `json:"capsule"`
	Version string `json:"version"`
	Task    string `json:"task,omitempty"`
	Wait    bool   `json:"wait,omitempty"`
}

// ChildInfo is a child as its parent sees it.
type ChildInfo struct {
	SessionID  string `json:"session_id"`
	Capsule    string `json:"capsule"`
	State      string `json:"state"`
	ExitStatus string `json:"exit_status,omitempty"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	Detail     string `json:"detail,omitempty"`
	// Workdir is where the child works, relative to the parent's own workdir.
	Workdir string `json:"workdir"`
}

// Completion is how a child ended. roostd also writes it, as completion.json, into the
// child's workdir, where the parent can read it.
type Completion struct {
	SessionID  string    `json:"session_id"`
	Capsule    string    `json:"capsule"`
	Status     string    `json:"status"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	DurationMS int64     `json:"duration_ms"`
	Detail     string    `json:"detail,omitempty"`
	EndedAt    time.Time `json:"ended_at"`
}

// SpawnResult is what POST /v1/spawn answers: the child, and its completion when the
// request waited for it.
type SpawnResult struct {
	ChildInfo
	Completion *Completion `json:"completion,omitempty"`
}

// Self is what a session sees of itself.
type Self struct {
	SessionID      string    `json:"session_id"`
	Capsule        string    `json:"capsule"`
	ParentID       string    `json:"parent_id,omitempty"`
	Containment    string    `json:"containment"`
	DepthRemaining int       `json:"depth_remaining"`
	LiveChildren   int       `json:"live_children"`
	DeadlineAt     time.Time `json:"deadline_at,omitzero"`
}

// Delegator serves what a session asks through its endpoint; the session manager is one.
// Every method acts for the session sessionID and sees only it and its own children.
type Delegator interface {
	// Live says whether the session runs: its credential is honoured only then.
	Live(sessionID string) bool
	Self(sessionID string) (Self, error)
	Spawn(ctx context.Context, sessionID string, req Request) (SpawnResult, error)
	Children(sessionID string) ([]ChildInfo, error)
	Child(sessionID, childID string) (ChildInfo, error)
	WaitChild(ctx context.Context, sessionID, childID string) (Completion, error)
	StopChild(ctx context.Context, sessionID, childID string) (Completion, error)
}

// Endpoint is one session's listener, as the session manager holds it.
type Endpoint interface {
	// URL is what the session's ROOST_ENDPOINT says.
	URL() string
	// NetNS is the pinned network namespace the session joins; empty when it has none.
	NetNS() string
	// Port is the host loopback port of an endpoint without a namespace.
	Port() int
	Close()
}
