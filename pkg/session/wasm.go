package session

import (
	"strconv"
	"time"

	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/wasmcache"

	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/manifest"
)

// wasmArgv is the runner's command line for a WASM session, in the program's view: the
// module and its compiled entry, the guest's limits and preopens, its environment (the
// session's own), then run.args.
func wasmArgv(rec *store.Record, p *manifest.Policy, v view, runner, cache string) []string {
	w := rec.Wasm
	argv := []string{runner, "run",
		"--module", v.capsule + "/" + w.Module,
		"--cache", cache, "--cache-sha256", w.CacheSHA256,
		"--memory-bytes", strconv.FormatInt(p.Limits.MemoryBytes.Value, 10),
		// The staged deadline: limits.deadline_seconds, or run --deadline's lower one.
		"--deadline-seconds", strconv.FormatInt(int64(rec.Deadline/time.Second), 10),
	}
	if fuel := p.Limits.WasmFuel.Value; fuel > 0 {
		argv = append(argv, "--fuel", strconv.FormatInt(fuel, 10))
	}
	if scope := p.Filesystem.Scope; scope != "" {
		argv = append(argv, "--preopen", v.work+":/work:ro", "--preopen", v.work+"/"+scope+":/work/"+scope)
	} else {
		argv = append(argv, "--preopen", v.work+":/work")
	}
	argv = append(argv, "--preopen", v.capsule+":/capsule:ro", "--env-from-self", "--")
	return append(argv, rec.Command[1:]...)
}

// wasmDeadlineGrace is how long after a WASM session's deadline roostd ends it: the runner
// interrupts its guest at the deadline itself (exit 124, deadline_reached), and roostd's
// SIGTERM is the backstop for a runner that did not.
const wasmDeadlineGrace = time.Second

// deadline is how long after its start roostd ends the session.
func deadlineOf(r *store.Record) time.Duration {
	if r.Wasm != nil {
		return r.Deadline + wasmDeadlineGrace
	}
	return r.Deadline
}

// wasmFiles are the runner and the session's compiled module on the host.
func wasmFiles(c *wasmcache.Cache, rec *store.Record) (runner, cache string) {
	if c == nil {
		return "", ""
	}
	return c.Runner(), c.Entry(rec.Wasm.Cache)
}

// wasmView is where the runner and the session's compiled module are in its view: bound
// into a sealed root under /.roost (that one entry, not the others), the host's paths
// otherwise.
func wasmView(c *wasmcache.Cache, class manifest.Class, rec *store.Record) (runner, cache string) {
	if class == manifest.Sealed {
		return sealed.RunnerPath, sealed.WasmModule
	}
	return wasmFiles(c, rec)
}
