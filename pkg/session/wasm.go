package session

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/manifest"
)

// How a WASM capsule runs. run.wasm names a WASI preview 1 module in the capsule; the
// session's program is roost's runner (roost-wasm, next to roostd), started by roost-init
// like any program and held by the session's class, so nothing of a guest runs inside
// roostd. The module is compiled once per module, wasmtime version and engine settings, by
// `roost-wasm compile` run as root, into the state directory's wasm/ (root's, never
// writable by a session); the runner checks the entry's digest and deserializes it, or
// compiles from the module when it is unusable.

// wasmDir is where compiled modules are kept, under the state directory.
const wasmDir = "wasm"

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

// WasmCache compiles modules with the runner and keeps the results: WASM capsules' at stage,
// the operator's hooks' at start.
type WasmCache struct {
	runner string
	dir    string
	// mu orders compiles, so two stages of one module compile it once.
	mu sync.Mutex
	// version is the runner's `version` line, read once.
	version string
}

// NewWasmCache keeps modules runner compiles under stateDir; nil without a runner.
func NewWasmCache(runner, stateDir string) *WasmCache {
	if runner == "" {
		return nil
	}
	return &WasmCache{runner: runner, dir: filepath.Join(stateDir, wasmDir)}
}

// Runner is roost-wasm's path.
func (c *WasmCache) Runner() string { return c.runner }

// Compiled compiles the module at path unless its entry exists, and returns the entry's
// path and the digest the runner checks it against.
func (c *WasmCache) Compiled(path string) (entry, sha256 string, err error) {
	w, err := c.prepare(filepath.Dir(path), filepath.Base(path), path)
	if err != nil {
		return "", "", err
	}
	return filepath.Join(c.dir, w.Cache), w.CacheSHA256, nil
}

// Cached is the module's entry when it has been compiled already; it never compiles (a
// caller that must not wait lets the runner compile instead).
func (c *WasmCache) Cached(path string) (entry, sha256 string, ok bool) {
	sum, err := moduleDigest(path)
	if err != nil {
		return "", "", false
	}
	c.mu.Lock()
	runtime := c.version
	c.mu.Unlock()
	if runtime == "" {
		return "", "", false
	}
	entry = filepath.Join(c.dir, entryName(sum, runtime))
	digest, err := os.ReadFile(entry + ".sha256")
	if d := strings.TrimSpace(string(digest)); err == nil && len(d) == 64 {
		return entry, d, true
	}
	return "", "", false
}

// entryName is a compiled module's name: one per module and runner (wasmtime's version and
// engine settings).
func entryName(moduleSHA256, runtime string) string {
	h := sha256.Sum256([]byte(moduleSHA256 + "\n" + runtime))
	return hex.EncodeToString(h[:]) + ".cwasm"
}

// runtime is the runner's version line: wasmtime's version and the engine settings' hash.
func (c *WasmCache) runtime() (string, error) {
	if c.version != "" {
		return c.version, nil
	}
	out, err := runRunner(c.runner, 10*time.Second, "version")
	if err != nil {
		return "", err
	}
	c.version = strings.TrimSpace(out)
	return c.version, nil
}

// prepare checks the module run.wasm names in the capsule at root and compiles it unless an
// entry for it exists. Errors name the manifest's key.
func (c *WasmCache) prepare(root, module, where string) (*WasmRun, error) {
	if c == nil {
		return nil, errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf("%s: run.wasm: roostd has no WASM runner (roost-wasm must sit next to roostd; make build puts it in ./bin)", where))
	}
	path := filepath.Join(root, module)
	sum, err := moduleDigest(path)
	if err != nil {
		return nil, fmt.Errorf("%s: run.wasm: %v: %w", where, err, errdefs.ErrInvalidArgument)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	runtime, err := c.runtime()
	if err != nil {
		return nil, fmt.Errorf("the WASM runner %s: %w", c.runner, err)
	}
	name := entryName(sum, runtime)
	entry := filepath.Join(c.dir, name)
	digest, err := os.ReadFile(entry + ".sha256")
	if err != nil || len(bytes.TrimSpace(digest)) != 64 {
		if err := os.MkdirAll(c.dir, 0o711); err != nil {
			return nil, err
		}
		out, err := runRunner(c.runner, 5*time.Minute, "compile", "--module", path, "--out", entry)
		if err != nil {
			return nil, fmt.Errorf("%s: run.wasm: %s does not compile: %v: %w", where, module, err, errdefs.ErrInvalidArgument)
		}
		digest = []byte(strings.TrimSpace(out))
		if err := writeFileAtomic(entry+".sha256", digest, 0o644); err != nil {
			return nil, err
		}
	}
	return &WasmRun{Module: module, SHA256: sum, Cache: name, CacheSHA256: strings.TrimSpace(string(digest)), Runtime: runtime}, nil
}

// moduleDigest is the sha256 of a WASM module, checked to be one (a regular file starting
// with WASM's magic).
func moduleDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err != nil || string(magic) != "\x00asm" {
		return "", fmt.Errorf("%s is not a WASM module (no \\0asm magic)", path)
	}
	h := sha256.New()
	h.Write(magic)
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// runRunner runs the WASM runner with args as root, within timeout, and returns its stdout;
// a failure carries the first line of its stderr.
func runRunner(runner string, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, runner, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		line, _, _ := strings.Cut(strings.TrimSpace(stderr.String()), "\n")
		if line == "" {
			line = err.Error()
		}
		return "", errors.New(line)
	}
	return stdout.String(), nil
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp" + strconv.Itoa(os.Getpid())
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// wasmArgv is the runner's command line for a WASM session, in the program's view: the
// module and its compiled entry, the guest's limits and preopens, its environment (the
// session's own), then run.args.
func wasmArgv(rec *Record, p *manifest.Policy, v view, runner, cache string) []string {
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
func (r *Record) deadline() time.Duration {
	if r.Wasm != nil {
		return r.Deadline + wasmDeadlineGrace
	}
	return r.Deadline
}

// wasmFiles are the runner and the session's compiled module on the host.
func (m *Manager) wasmFiles(rec *Record) (runner, cache string) {
	if m.cfg.Wasm == nil {
		return "", ""
	}
	return m.cfg.Wasm.runner, filepath.Join(m.cfg.Wasm.dir, rec.Wasm.Cache)
}

// wasmView is where the runner and the session's compiled module are in its view: bound
// into a sealed root under /.roost (that one entry, not the others), the host's paths
// otherwise.
func (m *Manager) wasmView(class manifest.Class, rec *Record) (runner, cache string) {
	if class == manifest.Sealed {
		return sealed.RunnerPath, sealed.WasmModule
	}
	return m.wasmFiles(rec)
}
