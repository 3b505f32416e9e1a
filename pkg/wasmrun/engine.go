// Package wasmrun is roost-wasm: it runs a WASI preview 1 module under wasmtime with a
// memory cap, a deadline and optional fuel, reports how a guest ended abnormally, and
// compiles modules ahead of time into a cache roostd keeps.
//
// The engine's settings are fixed and hashed (Version): a compiled module (cwasm) is only
// ever used by an engine of the same settings, and wasmtime itself refuses one that is not
// (Module.Deserialize checks its version and settings). Fuel consumption and epoch
// interruption are always on, so that one compiled artifact serves every run of a module,
// with or without --fuel or --deadline-seconds.
package wasmrun

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/bytecodealliance/wasmtime-go/v39"
	"golang.org/x/sys/cpu"
)

// wasmtimeModule is the Go module that links libwasmtime; its version is the engine's.
const wasmtimeModule = "github.com/bytecodealliance/wasmtime-go/v39"

// fallbackVersion is used when the binary carries no build information (it always does
// when built by the go command).
const fallbackVersion = "39.0.1"

// Settings is the engine configuration every roost-wasm engine has. It is part of the
// cache key: change a field, and every cached module becomes a miss.
type Settings struct {
	// ConsumeFuel is always on, even without --fuel (the store then gets all the fuel
	// there is): a module compiled with fuel checks cannot run on an engine without them
	// and the other way round, and the CLI has one compiled artifact per module.
	ConsumeFuel bool
	// EpochInterruption is how a deadline or SIGTERM stops a guest in wasm code.
	EpochInterruption bool
	// MultiMemory is off: the memory cap (a store limit per linear memory) is then the
	// guest's whole linear memory.
	MultiMemory bool
	// Threads is off: WASI preview 1 has no threads, and no shared memory is needed.
	Threads bool
	// MaxWasmStack bounds the guest's native stack: deeper recursion traps (stack
	// overflow) instead of taking the runner's.
	MaxWasmStack int
	// Cranelift at OptLevel speed; no debug info; no NaN canonicalization.
	Strategy string
	OptLevel string
}

// settings are the engine's fixed settings.
var settings = Settings{
	ConsumeFuel:       true,
	EpochInterruption: true,
	MaxWasmStack:      1 << 20,
	Strategy:          "cranelift",
	OptLevel:          "speed",
}

// NewEngine returns an engine with the fixed settings.
func NewEngine() *wasmtime.Engine {
	return newEngine(settings)
}

func newEngine(s Settings) *wasmtime.Engine {
	cfg := wasmtime.NewConfig()
	cfg.SetConsumeFuel(s.ConsumeFuel)
	cfg.SetEpochInterruption(s.EpochInterruption)
	cfg.SetWasmMultiMemory(s.MultiMemory)
	cfg.SetWasmThreads(s.Threads)
	cfg.SetMaxWasmStack(s.MaxWasmStack)
	cfg.SetStrategy(wasmtime.StrategyCranelift)
	cfg.SetCraneliftOptLevel(wasmtime.OptLevelSpeed)
	cfg.SetDebugInfo(false)
	cfg.SetCraneliftNanCanonicalization(false)
	return wasmtime.NewEngineWithConfig(cfg)
}

// WasmtimeVersion is the version of the wasmtime this binary links ("39.0.1").
func WasmtimeVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path != wasmtimeModule {
				continue
			}
			if dep.Replace != nil && dep.Replace.Version != "" {
				dep = dep.Replace
			}
			if dep.Version != "" && dep.Version != "(devel)" {
				return strings.TrimPrefix(dep.Version, "v")
			}
		}
	}
	return fallbackVersion
}

// EngineHash identifies what a compiled module depends on: the wasmtime version, the
// engine settings, and the target, CPU features included (Cranelift compiles for the
// features of the host it runs on, and wasmtime refuses a module compiled for features
// this host lacks). 16 hex digits of a SHA-256.
func EngineHash() string {
	return engineHash(settings)
}

func engineHash(s Settings) string {
	h := sha256.New()
	fmt.Fprintf(h, "wasmtime %s\n%s/%s\n%+v\n", WasmtimeVersion(), runtime.GOOS, runtime.GOARCH, s)
	switch runtime.GOARCH {
	case "amd64":
		fmt.Fprintf(h, "%+v\n", cpu.X86)
	case "arm64":
		fmt.Fprintf(h, "%+v\n", cpu.ARM64)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Version is the line `roost-wasm version` prints: "wasmtime 39.0.1 engine 3f2a…". A
// compiled module is cached under sha256(module) and this line.
func Version() string {
	return "wasmtime " + WasmtimeVersion() + " engine " + EngineHash()
}
