// Package manifest reads capsule.yaml: it parses strictly (an unknown key, a wrong type or a
// bad value is an error naming its path and line), validates, and lowers the capabilities
// block to one fully resolved Policy in which every shape of "not declared" is a deny.
//
// The types in this file are the declared form: what the file said, with nil for what it
// left out. Policy (policy.go) is the resolved form the rest of roost works from.
package manifest

// FileName is the manifest's name inside a capsule directory.
const FileName = "capsule.yaml"

// MaxSize bounds the manifest file; anything larger is refused before parsing.
const MaxSize = 1 << 20

// Manifest is a parsed and validated capsule.yaml in its declared form.
type Manifest struct {
	Name    string
	Version string
	Run     Run
	// Env holds literal variables for the program.
	Env          map[string]string
	Inference    *Inference
	Capabilities *Capabilities
}

// Run says what the capsule runs: exactly one of Command and Wasm is set.
type Run struct {
	Command []string
	Wasm    string
	Args    []string
}

// Inference is the manifest's inference block.
type Inference struct {
	Upstream         string
	Model            string
	MaxSessionTokens *int64
	OnExhausted      string
}

// Capabilities is the declared capabilities block. A nil sub-block was absent.
type Capabilities struct {
	Containment *Class
	Network     *Network
	Filesystem  *Filesystem
	Shell       *Shell
	Spawn       *Spawn
	Env         *EnvGrant
	Limits      *Limits
	Resources   *Resources
}

// Network is capabilities.network.
type Network struct {
	Allow       []string
	UnixSockets *bool
}

// Filesystem is capabilities.filesystem.
type Filesystem struct {
	Scope       *string
	WorkdirExec *bool
	ReadOnly    []string
	HostRead    []string
	System      string
}

// Shell is capabilities.shell.
type Shell struct {
	Allow []string
}

// Spawn is capabilities.spawn.
type Spawn struct {
	Allow            []string
	WorkdirSnapshot  []string
	MaxDepth         *int64
	MaxChildren      *int64
	MaxTotalChildren *int64
}

// EnvGrant is capabilities.env.
type EnvGrant struct {
	Allow []string
}

// Limits is capabilities.limits.
type Limits struct {
	DeadlineSeconds *int64
	MemoryBytes     *int64
	// WasmFuel bounds the instructions a WASM guest may run (wasmtime's fuel).
	WasmFuel *int64
}

// Resources is capabilities.resources.
type Resources struct {
	CgroupMemoryBytes *int64
	CgroupPidsMax     *int64
	CgroupCPUPercent  *int64
	MaxOpenFiles      *int64
	MaxFileSizeBytes  *int64
	CPUSeconds        *int64
	MaxProcesses      *int64
	MemoryBytes       *int64
	WorkdirMaxBytes   *int64
	WorkdirMaxInodes  *int64
	LogMaxBytes       *int64
	// EndpointMaxConnections bounds the session's concurrent connections to its endpoint.
	EndpointMaxConnections *int64
	// EgressMaxBytes bounds what the session's egress proxy carries, up and down together.
	EgressMaxBytes *int64
	// EgressBytesPerSec is the session's bandwidth share through its egress proxy, each way.
	EgressBytesPerSec *int64
}

// Ref is the capsule's name@version.
func (m *Manifest) Ref() string { return m.Name + "@" + m.Version }
