package wasmrun

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/internal/testenv"
)

func jsonUnmarshalStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("more than one JSON value")
	}
	return nil
}

func expectNoReport(t *testing.T, res result) {
	t.Helper()
	if res.report != "" {
		t.Errorf("a report for a normal end: %s", res.report)
	}
}

func TestVersion(t *testing.T) {
	out, err := exec.Command(runnerBin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(out))
	if !regexp.MustCompile(`^wasmtime 39\.\d+\.\d+ engine [0-9a-f]{16}$`).MatchString(line) {
		t.Fatalf("version %q", line)
	}
	if line != Version() {
		t.Fatalf("the binary says %q, the package %q", line, Version())
	}
	other := settings
	other.ConsumeFuel = false
	if engineHash(other) == EngineHash() {
		t.Fatal("the engine hash does not cover the settings")
	}
}

func TestHelloAndArgv(t *testing.T) {
	res := guest(t, runSpec{}, nil, "hello", "a b", "c")
	if res.code != 0 || res.stdout != `hello from wasm: argv=["guest.wasm" "hello" "a b" "c"]`+"\n" {
		t.Fatalf("code %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
	}
	expectNoReport(t, res)
}

func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"exit", "0"}, 0},
		{[]string{"exit", "3"}, 3},
		{[]string{"exit", "125"}, 125},
		// The guest's own failure: Go prints the error and exits 1.
		{[]string{"no-such-mode"}, 1},
	} {
		res := guest(t, runSpec{}, nil, c.args...)
		if res.code != c.code {
			t.Errorf("%v: exit %d, want %d (stderr %q)", c.args, res.code, c.code, res.stderr)
		}
		expectNoReport(t, res)
	}
	// WASI leaves codes from 126 on to the host: wasmtime refuses them as a trap.
	res := guest(t, runSpec{}, nil, "exit", "200")
	if rep, _ := res.reportOf(t); res.code != ExitTrap || rep.Status != StatusCrashed || !strings.Contains(rep.Detail, "invalid exit status") {
		t.Fatalf("exit 200: code %d, report %q", res.code, res.report)
	}
}

func TestEnv(t *testing.T) {
	env := []string{"PATH=/usr/bin:/bin", "FOO=bar baz", "ROOST_WASM_SECRET=1", "EMPTY="}
	res := guest(t, runSpec{env: env}, nil, "env")
	if res.code != 0 || res.stdout != "" {
		t.Fatalf("without --env-from-self the guest sees %q (exit %d)", res.stdout, res.code)
	}
	res = guest(t, runSpec{env: env}, []string{"--env-from-self"}, "env")
	if want := "EMPTY=\nFOO=bar baz\nPATH=/usr/bin:/bin\n"; res.code != 0 || res.stdout != want {
		t.Fatalf("with --env-from-self the guest sees %q, want %q (no ROOST_WASM_*, no ROOST_REPORT_FD)", res.stdout, want)
	}
}

func TestStdinJSON(t *testing.T) {
	res := guest(t, runSpec{stdin: `{"event":"pre_tool","tool":"bash"}`}, []string{"--stdin-json", "--memory-bytes", "67108864", "--deadline-seconds", "30"}, "stdin")
	if res.code != 0 || res.stdout != `stdin: {"event":"pre_tool","tool":"bash"}`+"\n" {
		t.Fatalf("code %d stdout %q stderr %q", res.code, res.stdout, res.stderr)
	}
}

func TestPreopens(t *testing.T) {
	host := t.TempDir()
	rw, ro, outside := filepath.Join(host, "rw"), filepath.Join(host, "ro"), filepath.Join(host, "outside")
	for _, d := range []string{rw, ro, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(ro, "in.txt"), []byte("read me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(rw, "link")); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--preopen", rw + ":/rw", "--preopen", ro + ":/ro:ro"}

	res := guest(t, runSpec{}, flags, "write", "/rw/out.txt", "written")
	if data, err := os.ReadFile(filepath.Join(rw, "out.txt")); res.code != 0 || err != nil || string(data) != "written" {
		t.Fatalf("write to the rw preopen: exit %d, %q (%v), stderr %q", res.code, data, err, res.stderr)
	}
	res = guest(t, runSpec{}, flags, "read", "/ro/in.txt")
	if res.code != 0 || !strings.Contains(res.stdout, "read me") {
		t.Fatalf("read from the ro preopen: exit %d, %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	// Each refusal is the one the runner's wasmtime gives there, by the guest's os package:
	// a path no preopen holds has no directory to be opened from (EBADF); one a preopen
	// holds but may not be used so (a write in a read-only preopen, a link leading out of
	// one) is EPERM. Any other failure (the guest mistaking its own arguments, say) is not
	// the boundary holding.
	const ebadf, eperm = "Bad file number", "Operation not permitted"
	for _, c := range []struct {
		name  string
		args  []string
		errno string
	}{
		{"write to the ro preopen", []string{"write", "/ro/new.txt", "x"}, eperm},
		{"overwrite in the ro preopen", []string{"write", "/ro/in.txt", "x"}, eperm},
		{"read outside the preopens", []string{"read", "/etc/passwd"}, ebadf},
		{"climb out of a preopen", []string{"read", "/rw/../../" + strings.TrimPrefix(outside, "/") + "/secret.txt"}, ebadf},
		{"follow a symlink out", []string{"read", "/rw/link"}, eperm},
		{"list the root", []string{"ls", "/"}, ebadf},
	} {
		res := guest(t, runSpec{}, flags, c.args...)
		want := fmt.Sprintf("guest: %s: open %s: %s\n", c.args[0], c.args[1], c.errno)
		if res.code != 1 || res.stderr != want || strings.Contains(res.stdout, "secret") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1 and %q", c.name, res.code, res.stdout, res.stderr, want)
		}
	}
	if data, err := os.ReadFile(filepath.Join(ro, "in.txt")); err != nil || string(data) != "read me" {
		t.Fatalf("the ro preopen changed: %q %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(ro, "new.txt")); !os.IsNotExist(err) {
		t.Fatalf("a file was made in the ro preopen (%v)", err)
	}
	// A writable tree inside a read-only one (a session's scope in its workdir): the guest
	// resolves a path through the longest preopen that holds it.
	scope := filepath.Join(ro, "scope")
	if err := os.Mkdir(scope, 0o755); err != nil {
		t.Fatal(err)
	}
	nested := []string{"--preopen", ro + ":/work:ro", "--preopen", scope + ":/work/scope"}
	if res := guest(t, runSpec{}, nested, "write", "/work/scope/x.txt", "in scope"); res.code != 0 {
		t.Fatalf("write in the nested rw preopen: exit %d, stderr %q", res.code, res.stderr)
	}
	if res := guest(t, runSpec{}, nested, "write", "/work/y.txt", "outside scope"); res.code != 1 {
		t.Fatalf("write in the ro preopen around it: exit %d", res.code)
	}
	if _, err := os.Stat(filepath.Join(ro, "y.txt")); !os.IsNotExist(err) {
		t.Fatalf("the ro preopen around the scope was written (%v)", err)
	}
	// Without preopens the guest has no file system at all.
	if res := guest(t, runSpec{}, nil, "read", "/rw/out.txt"); res.code != 1 {
		t.Fatalf("read without preopens: exit %d", res.code)
	}
}

// A raw WASI path_open of "../" from a preopen, below Go's own path cleaning: the exit code
// is the errno.
func TestPreopenDotDotRaw(t *testing.T) {
	const tmpl = `(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) %q)
  (func (export "_start")
    (call $exit (call $path_open (i32.const 3) (i32.const 0) (i32.const 16) (i32.const %d)
      (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 0)))))`
	dir := t.TempDir()
	pre := filepath.Join(dir, "pre")
	if err := os.Mkdir(pre, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pre, "ok.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "secret.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	const errnoPerm = 63 // WASI's EPERM: wasmtime refuses any path that leaves the preopen
	for path, want := range map[string]int{"ok.txt": 0, "../secret.txt": errnoPerm, "../../../../etc/passwd": errnoPerm, "/etc/passwd": errnoPerm} {
		m := watModule(t, fmt.Sprintf(tmpl, path, len(path)))
		res := run(t, runSpec{}, "run", "--module", m, "--preopen", pre+":/pre:ro")
		if res.code != want {
			t.Errorf("path_open(%q): errno %d, want %d (stderr %q)", path, res.code, want, res.stderr)
		}
	}
}

func TestDeadline(t *testing.T) {
	res := guest(t, runSpec{}, []string{"--deadline-seconds", "0.5"}, "loop")
	rep, ok := res.reportOf(t)
	if res.code != ExitDeadline || !ok || rep.Status != StatusDeadlineReached || !strings.Contains(res.stdout, "looping") {
		t.Fatalf("exit %d, report %q, stdout %q, stderr %q", res.code, res.report, res.stdout, res.stderr)
	}
	if res.elapsed > 5*time.Second {
		t.Fatalf("a 0.5 s deadline took %s", res.elapsed)
	}
	t.Logf("a 0.5 s deadline ended the run after %s: %s", res.elapsed.Round(time.Millisecond), strings.TrimSpace(res.stderr))
}

// A guest blocked in a host call (a sleep: poll_oneoff) is out of the epoch's reach; the
// runner exits without it.
func TestDeadlineInHostCall(t *testing.T) {
	res := guest(t, runSpec{}, []string{"--deadline-seconds", "0.5"}, "sleep", "60")
	if rep, ok := res.reportOf(t); res.code != ExitDeadline || !ok || rep.Status != StatusDeadlineReached {
		t.Fatalf("exit %d, report %q, stderr %q", res.code, res.report, res.stderr)
	}
	if res.elapsed > 5*time.Second || strings.Contains(res.stdout, "woke") {
		t.Fatalf("took %s; stdout %q", res.elapsed, res.stdout)
	}
}

func TestSIGTERM(t *testing.T) {
	for _, c := range []struct {
		args  []string
		after string
	}{
		{[]string{"loop"}, "looping"},
		{[]string{"sleep", "60"}, "sleeping"},
	} {
		res := guest(t, runSpec{signal: syscall.SIGTERM, signalAfter: c.after}, []string{"--deadline-seconds", "60"}, c.args...)
		if res.code != 143 || !strings.Contains(res.stderr, "SIGTERM") {
			t.Errorf("%v: exit %d, stderr %q", c.args, res.code, res.stderr)
		}
		if res.elapsed > 2*time.Second {
			t.Errorf("%v: exited %s after SIGTERM", c.args, res.elapsed)
		}
		expectNoReport(t, res)
		t.Logf("%v: exit %d %s after SIGTERM", c.args, res.code, res.elapsed.Round(time.Millisecond))
	}
}

// A Go guest whose memory.grow is refused: the Go runtime says "fatal error: out of
// memory" and exits 2. Its memory stays under the cap.
func TestMemoryCapGoGuest(t *testing.T) {
	const limit = 64 << 20
	res := guest(t, runSpec{}, []string{"--memory-bytes", fmt.Sprint(limit)}, "hog", fmt.Sprint(1<<20))
	rep, ok := res.reportOf(t)
	if res.code != 2 || !strings.Contains(res.stderr, "fatal error: out of memory") || !ok || rep.Status != StatusMemoryRefused {
		t.Fatalf("exit %d, report %q, stderr %.300q", res.code, res.report, res.stderr)
	}
	var held int
	for line := range strings.Lines(res.stdout) {
		fmt.Sscanf(line, "holding %d MiB", &held)
	}
	if held < 32 || held >= limit>>20 {
		t.Fatalf("the guest held %d MiB under a %d MiB cap", held, limit>>20)
	}
	t.Logf("held %d MiB of %d; report %s", held, limit>>20, strings.TrimSpace(res.report))

	// One allocation far larger than what is left: refused all the same, but its memory
	// is not near the cap, and a plain exit 2 is not reported as memory refused.
	res = guest(t, runSpec{}, []string{"--memory-bytes", fmt.Sprint(limit)}, "hog", fmt.Sprint(40<<20))
	if res.code != 2 || !strings.Contains(res.stderr, "out of memory") {
		t.Fatalf("exit %d, stderr %.300q", res.code, res.stderr)
	}
	t.Logf("a 40 MiB allocation over 40 MiB held: exit %d, report %q", res.code, res.report)
}

// The Rust guest, built by Debian's rustc with its WASI target (rustc,
// libstd-rust-dev-wasm32 and lld; .ci/run and make unit install them): its allocator's
// failure aborts, a trap. /usr/bin/rustc and not the one on PATH: a rustup toolchain there
// seldom has the wasm target installed.
func TestMemoryCapRustGuest(t *testing.T) {
	rustc := "/usr/bin/rustc"
	_, err := os.Stat(rustc)
	testenv.Need(t, rustc+" (apt-get install rustc libstd-rust-dev-wasm32 lld)", err)
	target, err := rustWASITarget(rustc)
	testenv.Need(t, "a WASI target for "+rustc+" (apt-get install libstd-rust-dev-wasm32)", err)
	out := filepath.Join(t.TempDir(), "rusthog.wasm")
	if msg, err := exec.Command(rustc, "--target", target, "-O", "-o", out, "testdata/rusthog/main.rs").CombinedOutput(); err != nil {
		testenv.Need(t, rustc+" building for "+target+" (libstd-rust-dev-wasm32 and lld)", fmt.Errorf("%v\n%s", err, msg))
	}
	res := run(t, runSpec{}, "run", "--module", out, "--memory-bytes", fmt.Sprint(64<<20))
	rep, ok := res.reportOf(t)
	if res.code != ExitTrap || !strings.Contains(res.stderr, "memory allocation of 1048576 bytes failed") || !ok ||
		rep.Status != StatusMemoryRefused || !strings.Contains(rep.Detail, "unreachable") {
		t.Fatalf("exit %d, report %q, stderr %.600q", res.code, res.report, res.stderr)
	}
}

// rustWASITarget is the name rustc gives WASI preview 1: wasm32-wasip1 since Rust 1.78,
// wasm32-wasi before it (and no longer since 1.84).
func rustWASITarget(rustc string) (string, error) {
	out, err := exec.Command(rustc, "--print", "target-list").Output()
	if err != nil {
		return "", fmt.Errorf("%s --print target-list: %w", rustc, err)
	}
	targets := strings.Fields(string(out))
	for _, name := range []string{"wasm32-wasip1", "wasm32-wasi"} {
		if slices.Contains(targets, name) {
			return name, nil
		}
	}
	return "", fmt.Errorf("%s knows neither wasm32-wasip1 nor wasm32-wasi", rustc)
}

func TestMemoryCapAtStart(t *testing.T) {
	for name, wat := range map[string]string{
		"exported": `(module (memory (export "memory") 100) (func (export "_start")))`,
		"internal": `(module (memory 100) (func (export "_start")))`,
	} {
		m := watModule(t, wat)
		res := run(t, runSpec{}, "run", "--module", m, "--memory-bytes", fmt.Sprint(1<<20))
		if rep, ok := res.reportOf(t); res.code != ExitRunner || !ok || rep.Status != StatusMemoryRefused {
			t.Errorf("%s: exit %d, report %q, stderr %q", name, res.code, res.report, res.stderr)
		}
		if res := run(t, runSpec{}, "run", "--module", m, "--memory-bytes", fmt.Sprint(100<<16)); res.code != 0 {
			t.Errorf("%s at exactly its size: exit %d, stderr %q", name, res.code, res.stderr)
		}
	}
}

const trapWAT = `(module
  (memory (export "memory") 1)
  (func $inner unreachable)
  (func $outer (call $inner))
  (func (export "_start") (call $outer)))`

func TestTraps(t *testing.T) {
	for _, c := range []struct {
		name, wat, detail, frame string
	}{
		{"unreachable", trapWAT, "wasm trap: wasm `unreachable` instruction executed", "!inner"},
		{"out of bounds", `(module (memory (export "memory") 1)
			(func (export "_start") (drop (i32.load (i32.const 1000000)))))`, "wasm trap: out of bounds memory access", ""},
		{"stack overflow", `(module (memory (export "memory") 1)
			(func $r (call $r)) (func (export "_start") (call $r)))`, "wasm trap: call stack exhausted", "!r"},
		{"division by zero", `(module (memory (export "memory") 1)
			(func (export "_start") (drop (i32.div_u (i32.const 1) (i32.const 0)))))`, "wasm trap: integer divide by zero", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := run(t, runSpec{}, "run", "--module", watModule(t, c.wat), "--memory-bytes", "1048576")
			first, _, _ := strings.Cut(res.stderr, "\n")
			if res.code != ExitTrap || !strings.HasPrefix(first, "roost-wasm: trap: "+c.detail) {
				t.Fatalf("exit %d, stderr %.500q", res.code, res.stderr)
			}
			rep, ok := res.reportOf(t)
			if !ok || rep.Status != StatusCrashed || !strings.HasPrefix(rep.Detail, c.detail) || !strings.Contains(rep.Backtrace, c.frame) {
				t.Fatalf("report %.500q", res.report)
			}
			if len(rep.Detail) > maxDetail || strings.Contains(rep.Detail, "\n") || len(rep.Backtrace) > maxBacktrace {
				t.Fatalf("report fields out of bounds: detail %d bytes, backtrace %d", len(rep.Detail), len(rep.Backtrace))
			}
			if strings.Contains(res.stderr, "Stack backtrace") || strings.Count(res.stderr, "\n") > maxFramesHead+maxFramesTail+5 {
				t.Fatalf("stderr carries the host's stack, or every frame: %d lines", strings.Count(res.stderr, "\n"))
			}
		})
	}
}

func TestFuel(t *testing.T) {
	loop := watModule(t, `(module (memory (export "memory") 1) (func (export "_start") (loop $l (br $l))))`)
	res := run(t, runSpec{}, "run", "--module", loop, "--fuel", "1000000")
	rep, ok := res.reportOf(t)
	if res.code != ExitTrap || !ok || rep.Status != StatusFuelExhausted || rep.Detail != "wasm trap: all fuel consumed by WebAssembly" {
		t.Fatalf("exit %d, report %q, stderr %q", res.code, res.report, res.stderr)
	}
	if !strings.Contains(res.stderr, "ran out of fuel (--fuel 1000000)") {
		t.Fatalf("stderr %q", res.stderr)
	}
	// --fuel 0 is no fuel at all.
	if res := run(t, runSpec{}, "run", "--module", loop, "--fuel", "0"); res.code != ExitTrap || !strings.Contains(res.report, StatusFuelExhausted) {
		t.Fatalf("--fuel 0: exit %d, report %q", res.code, res.report)
	}
	res = guest(t, runSpec{}, []string{"--fuel", "5000000"}, "burn", "100000000")
	if rep, ok := res.reportOf(t); res.code != ExitTrap || !ok || rep.Status != StatusFuelExhausted {
		t.Fatalf("Go guest: exit %d, report %q", res.code, res.report)
	}
	res = guest(t, runSpec{}, []string{"--fuel", "1000000000"}, "burn", "1000000")
	if res.code != 0 || !strings.HasPrefix(res.stdout, "burned ") {
		t.Fatalf("Go guest with enough fuel: exit %d, stderr %q", res.code, res.stderr)
	}
	expectNoReport(t, res)
}

func TestCompile(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "hello.cwasm")
	if err := os.WriteFile(out, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	res := run(t, runSpec{}, "compile", "--module", helloWasm, "--out", out)
	data, err := os.ReadFile(out)
	if res.code != 0 || err != nil {
		t.Fatalf("exit %d, stderr %q, %v", res.code, res.stderr, err)
	}
	sum := sha256.Sum256(data)
	if strings.TrimSpace(res.stdout) != hex.EncodeToString(sum[:]) {
		t.Fatalf("compile printed %q, the file's sha256 is %x", res.stdout, sum)
	}
	if info, _ := os.Stat(out); info.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v", info.Mode())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("compile left %v", entries)
	}
	// A module that does not compile leaves nothing.
	bad := filepath.Join(dir, "bad.wasm")
	if err := os.WriteFile(bad, []byte("\x00asm garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := run(t, runSpec{}, "compile", "--module", bad, "--out", filepath.Join(dir, "bad.cwasm")); res.code != ExitRunner {
		t.Fatalf("compiling garbage: exit %d", res.code)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Fatalf("a failed compile left %v", entries)
	}
}

// The cache saves the compile: measured on the Go guest.
func TestCacheHitIsFaster(t *testing.T) {
	uncached := run(t, runSpec{}, "run", "--module", guestWasm, "--", "hello")
	hit := guest(t, runSpec{}, nil, "hello")
	if uncached.code != 0 || hit.code != 0 || uncached.stdout != hit.stdout {
		t.Fatalf("exits %d %d, outputs %q %q", uncached.code, hit.code, uncached.stdout, hit.stdout)
	}
	t.Logf("Go guest (%d KiB): compiled %s, from the cache %s", fileSize(t, guestWasm)>>10,
		uncached.elapsed.Round(time.Millisecond), hit.elapsed.Round(time.Millisecond))
	if hit.elapsed >= uncached.elapsed {
		t.Fatalf("a cache hit (%s) is no faster than compiling (%s)", hit.elapsed, uncached.elapsed)
	}
}

func sha256File(t *testing.T, path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func fileSize(t *testing.T, path string) int64 {
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}

// helloWAT prints "hello from wat" through WASI: a module that compiles in milliseconds.
const helloWAT = `(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 8) "\10\00\00\00\0f\00\00\00")
  (data (i32.const 16) "hello from wat\n")
  (func (export "_start") (drop (call $fd_write (i32.const 1) (i32.const 8) (i32.const 1) (i32.const 0)))))`

// An entry that is not exactly what roostd compiled, or not for this engine, is never
// used: the module is compiled instead, and runs all the same. The Go guest's entry for a
// flipped byte and another engine; a small module's for the rest.
func TestCacheUnusable(t *testing.T) {
	good, err := os.ReadFile(guestCwasm)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	small := watModule(t, helloWAT)
	smallOut := filepath.Join(dir, "small.cwasm")
	smallSHA, err := Compile(small, smallOut)
	if err != nil {
		t.Fatal(err)
	}
	smallGood, err := os.ReadFile(smallOut)
	if err != nil {
		t.Fatal(err)
	}
	if res := run(t, runSpec{}, "run", "--module", small, "--cache", smallOut, "--cache-sha256", smallSHA); res.code != 0 || res.stdout != "hello from wat\n" || res.stderr != "" {
		t.Fatalf("the small module from its entry: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x40
	// An entry compiled by an engine with other settings (no fuel checks), handed over
	// with its own, right, sha256: only wasmtime can tell.
	otherOut := filepath.Join(dir, "other.cwasm")
	otherSHA, err := compileWith(newEngine(Settings{EpochInterruption: true, MaxWasmStack: 1 << 20}), guestWasm, otherOut)
	if err != nil {
		t.Fatal(err)
	}
	notWasm := write("garbage.cwasm", []byte("not a compiled module"))
	notWasmSHA := sha256.Sum256([]byte("not a compiled module"))
	smallFlipped := bytes.Clone(smallGood)
	smallFlipped[len(smallFlipped)-100] ^= 0x01
	for _, c := range []struct {
		name, module, file, sha, why string
	}{
		{"a flipped byte", guestWasm, write("flipped.cwasm", flipped), guestSHA, "its sha256 is"},
		{"another engine", guestWasm, otherOut, otherSHA, "wasmtime refused it"},
		{"a flipped byte, small", small, write("small-flipped.cwasm", smallFlipped), smallSHA, "its sha256 is"},
		{"truncated", small, write("truncated.cwasm", smallGood[:len(smallGood)/3]), smallSHA, "its sha256 is"},
		{"empty", small, write("empty.cwasm", nil), smallSHA, "its sha256 is"},
		{"another sha256", small, smallOut, strings.Repeat("ab", 32), "its sha256 is"},
		{"missing", small, filepath.Join(dir, "missing.cwasm"), smallSHA, "no such file"},
		{"a directory", small, dir, smallSHA, "not a regular file"},
		{"not a compiled module", small, notWasm, hex.EncodeToString(notWasmSHA[:]), "wasmtime refused it"},
		{"the module itself", small, small, sha256File(t, small), "wasmtime refused it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var before []byte
			if c.file != dir {
				before, _ = os.ReadFile(c.file)
			}
			res := run(t, runSpec{}, "run", "--module", c.module, "--cache", c.file, "--cache-sha256", c.sha, "--", "hello")
			if res.code != 0 || !strings.HasPrefix(res.stdout, "hello from wa") {
				t.Fatalf("exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
			}
			want := "roost-wasm: cache entry " + c.file + " unusable ("
			if strings.Count(res.stderr, "unusable") != 1 || !strings.HasPrefix(res.stderr, want) ||
				!strings.Contains(res.stderr, c.why) || !strings.HasSuffix(res.stderr, "); compiled from the module\n") {
				t.Fatalf("stderr %q, want %q…%s…", res.stderr, want, c.why)
			}
			if c.file != dir {
				if after, _ := os.ReadFile(c.file); !bytes.Equal(before, after) {
					t.Fatal("the runner changed the cache entry")
				}
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"run"},
		{"run", "--module", guestWasm, "--cache", guestCwasm},
		{"run", "--module", guestWasm, "--cache-sha256", guestSHA},
		{"run", "--module", guestWasm, "--cache", guestCwasm, "--cache-sha256", "xyz"},
		{"run", "--module", guestWasm, "--preopen", "nocolon"},
		{"run", "--module", guestWasm, "--preopen", filepath.Join(dir, "missing") + ":/x"},
		{"run", "--module", guestWasm, "--memory-bytes", "-1"},
		{"run", "--module", filepath.Join(dir, "missing.wasm")},
		{"run", "--module", watModule(t, `(module (func (export "main")))`)},
		{"run", "--module", watModule(t, `(module (import "env" "f" (func)) (func (export "_start")))`)},
		{"compile", "--module", guestWasm},
		{"version", "extra"},
	} {
		res := run(t, runSpec{}, args...)
		if res.code != ExitRunner || res.stderr == "" {
			t.Errorf("%q: exit %d, stderr %q", args, res.code, res.stderr)
		}
		expectNoReport(t, res)
	}
}

func TestParsePreopen(t *testing.T) {
	for in, want := range map[string]Preopen{
		"/a:/b":       {Host: "/a", Guest: "/b"},
		"/a:/b:ro":    {Host: "/a", Guest: "/b", ReadOnly: true},
		"/a:b:c:/d":   {Host: "/a:b:c", Guest: "/d"},
		"/srv/x:.:ro": {Host: "/srv/x", Guest: ".", ReadOnly: true},
	} {
		if got, err := ParsePreopen(in); err != nil || got != want {
			t.Errorf("ParsePreopen(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/a", "/a:", ":/b", "/a:ro", ":ro"} {
		if got, err := ParsePreopen(in); err == nil {
			t.Errorf("ParsePreopen(%q) = %+v, want an error", in, got)
		}
	}
}

// Under an RLIMIT_AS below what wasmtime reserves for a linear memory, nothing can run; the
// runner says why.
func TestAddressSpaceLimit(t *testing.T) {
	m := watModule(t, trapWAT)
	cmd := exec.Command("/bin/sh", "-c", `ulimit -v 2000000 && exec "$0" run --module "$1"`, runnerBin, m)
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != ExitRunner || !strings.Contains(string(out), "RLIMIT_AS is 2048000000 bytes") {
		t.Fatalf("%v: %s", err, out)
	}
}
