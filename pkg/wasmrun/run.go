package wasmrun

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bytecodealliance/wasmtime-go/v39"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment/roostinit"
)

// Exit codes of `roost-wasm run` besides the guest's own (its proc_exit code; 0 when
// _start returns). They follow timeout(1).
const (
	// ExitDeadline: --deadline-seconds passed and the guest was interrupted.
	ExitDeadline = 124
	// ExitRunner: roost-wasm itself failed (usage, a module it cannot read, compile or
	// instantiate) before the guest ran.
	ExitRunner = 125
	// ExitTrap: the guest trapped (unreachable, out-of-bounds, stack overflow, out of
	// fuel, …).
	ExitTrap = 134
)

// interruptGrace is how long an interrupted guest has to come back from a host call (a
// WASI call blocks outside wasm code, where the epoch does not reach it) before the
// runner exits without it.
const interruptGrace = 100 * time.Millisecond

// maxTableElements bounds each table of the guest: its host memory (8 bytes an element)
// is not linear memory, and no WASI program needs more.
const maxTableElements = 1 << 20

// envPrefix marks the runner's own variables, which --env-from-self keeps from the guest.
const envPrefix = "ROOST_WASM_"

// Preopen is a host directory the guest sees at Guest.
type Preopen struct {
	Host, Guest string
	ReadOnly    bool
}

// ParsePreopen parses HOSTDIR:GUESTDIR[:ro].
func ParsePreopen(s string) (Preopen, error) {
	var p Preopen
	rest := s
	if r, ok := strings.CutSuffix(s, ":ro"); ok {
		rest, p.ReadOnly = r, true
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 || i == len(rest)-1 {
		return Preopen{}, fmt.Errorf("preopen %q: want HOSTDIR:GUESTDIR[:ro]", s)
	}
	p.Host, p.Guest = rest[:i], rest[i+1:]
	return p, nil
}

// Options is one `roost-wasm run`.
type Options struct {
	// Module is the WASI preview 1 command module to run.
	Module string
	// Cache and CacheSHA256 name a compiled module (`roost-wasm compile`) to use instead
	// of compiling Module, and the SHA-256 its contents must have. Anything wrong with it
	// is a miss: Module is compiled (in memory; the cache is never written here).
	Cache, CacheSHA256 string
	// MemoryBytes caps the guest's linear memory (0: no cap): memory.grow beyond it
	// returns -1 to the guest.
	MemoryBytes int64
	// Fuel, when set, is the fuel the guest may burn (a trap when it runs out).
	Fuel *uint64
	// Deadline, when set, interrupts the guest once it has run that long (exit 124).
	Deadline time.Duration
	// Preopens are the directories the guest may reach; nothing else of the host.
	Preopens []Preopen
	// EnvFromSelf passes the runner's environment to the guest, less the runner's own
	// variables (ROOST_WASM_*, and the report pipe's); otherwise the guest has none.
	EnvFromSelf bool
	// StdinJSON documents that stdin carries JSON (a hook's input); stdin is inherited
	// either way.
	StdinJSON bool
	// Args follow the module's base name in the guest's argv.
	Args []string
	// Signals interrupt the guest at once; the runner exits 128+signal.
	Signals <-chan os.Signal
	// Stderr is where the runner speaks (os.Stderr when nil); the guest's stdio is the
	// process's own.
	Stderr io.Writer
	// Report receives the report of an abnormal end; nil takes the descriptor named by
	// roostinit.OutcomeFDEnv, when set.
	Report io.Writer

	// exit ends the process when an interrupted guest does not come back (os.Exit).
	exit func(int)
}

func (o *Options) stderr() io.Writer {
	if o.Stderr == nil {
		return os.Stderr
	}
	return o.Stderr
}

func (o *Options) check() error {
	switch {
	case o.Module == "":
		return errors.New("--module is required")
	case (o.Cache == "") != (o.CacheSHA256 == ""):
		return errors.New("--cache and --cache-sha256 go together")
	case o.Cache != "" && !validSHA256(o.CacheSHA256):
		return fmt.Errorf("--cache-sha256 %q: want 64 hex digits", o.CacheSHA256)
	case o.MemoryBytes < 0:
		return errors.New("--memory-bytes must not be negative")
	case o.Deadline < 0:
		return errors.New("--deadline-seconds must not be negative")
	}
	for _, p := range o.Preopens {
		if info, err := os.Stat(p.Host); err != nil || !info.IsDir() {
			return fmt.Errorf("preopen %s: not a directory", p.Host)
		}
	}
	return nil
}

// Run runs the module as opts say and returns the exit code.
func Run(opts Options) int {
	if opts.exit == nil {
		opts.exit = os.Exit
	}
	r := &runner{opts: &opts, done: make(chan struct{})}
	if opts.Report != nil {
		r.report = opts.Report
	} else if w := reportFromEnv(); w != nil {
		r.report = w
		defer w.Close()
	}
	code := r.run()
	close(r.done)
	return code
}

// Interrupt reasons.
const (
	byDeadline = iota + 1
	bySignal
)

type runner struct {
	opts   *Options
	report io.Writer
	engine *wasmtime.Engine

	mu       sync.Mutex
	reason   int
	signal   syscall.Signal
	finished bool
	code     int
	done     chan struct{}
}

// ending is how a run ended: the exit code, what the runner says on stderr, and the
// report, if any.
type ending struct {
	code   int
	say    string
	report *Report
}

// finish ends the run once: it says why on stderr, writes the report, and returns the exit
// code. A second call (the guest came back after an interrupt was given up on) returns the
// first's code.
func (r *runner) finish(e ending) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished {
		return r.code
	}
	r.finished, r.code = true, e.code
	if e.say != "" {
		fmt.Fprintln(r.opts.stderr(), strings.TrimRight(e.say, "\n"))
	}
	if e.report != nil && r.report != nil {
		_ = writeReport(r.report, *e.report)
	}
	return e.code
}

func (r *runner) fail(format string, args ...any) int {
	return r.finish(ending{code: ExitRunner, say: "roost-wasm: " + fmt.Sprintf(format, args...)})
}

func (r *runner) run() int {
	opts := r.opts
	if err := opts.check(); err != nil {
		return r.fail("%v", err)
	}
	// The guest's environment is the runner's as it was given; wasmtime's own errors must
	// not carry the host's stack (anyhow captures it when RUST_BACKTRACE asks).
	env := guestEnv(opts.EnvFromSelf)
	_ = os.Setenv("RUST_LIB_BACKTRACE", "0")

	r.engine = NewEngine()
	stopSignals := r.watchSignals()
	defer stopSignals()

	module, _, err := loadModule(r.engine, opts)
	if err != nil {
		return r.fail("%v", err)
	}
	defer module.Close()
	if msg := memoryTooSmall(module, opts.MemoryBytes); msg != "" {
		return r.finish(ending{code: ExitRunner, say: "roost-wasm: " + msg,
			report: &Report{Status: StatusMemoryRefused, Detail: msg}})
	}

	store := wasmtime.NewStore(r.engine)
	defer store.Close()
	memLimit := int64(-1)
	if opts.MemoryBytes > 0 {
		memLimit = opts.MemoryBytes
	}
	store.Limiter(memLimit, maxTableElements, -1, -1, -1)
	fuel := uint64(math.MaxUint64)
	if opts.Fuel != nil {
		fuel = *opts.Fuel
	}
	if err := store.SetFuel(fuel); err != nil {
		return r.fail("setting fuel: %v", err)
	}
	// One tick of the epoch interrupts the guest: the runner ticks it only to stop it.
	store.SetEpochDeadline(1)

	wasi := wasmtime.NewWasiConfig()
	defer wasi.Close()
	wasi.SetArgv(append([]string{filepath.Base(opts.Module)}, opts.Args...))
	keys, values := splitEnv(env)
	wasi.SetEnv(keys, values)
	wasi.InheritStdin()
	wasi.InheritStdout()
	wasi.InheritStderr()
	for _, p := range opts.Preopens {
		dirPerms, filePerms := wasmtime.DIR_READ|wasmtime.DIR_WRITE, wasmtime.FILE_READ|wasmtime.FILE_WRITE
		if p.ReadOnly {
			dirPerms, filePerms = wasmtime.DIR_READ, wasmtime.FILE_READ
		}
		if err := wasi.PreopenDir(p.Host, p.Guest, dirPerms, filePerms); err != nil {
			return r.fail("preopen %s as %s: %v", p.Host, p.Guest, err)
		}
	}
	store.SetWasi(wasi)
	linker := wasmtime.NewLinker(r.engine)
	defer linker.Close()
	if err := linker.DefineWasi(); err != nil {
		return r.fail("WASI: %v", err)
	}

	if !r.arm() {
		return r.interrupted()
	}
	inst, err := linker.Instantiate(store, module)
	if err != nil {
		var trap *wasmtime.Trap
		if errors.As(err, &trap) {
			return r.ended(err, nil, store)
		}
		msg := fmt.Sprintf("instantiating %s: %s", opts.Module, oneLine(firstCause(err)))
		if opts.MemoryBytes > 0 && strings.Contains(msg, "exceeds memory limits") {
			// A memory the module does not export, larger than the cap from the start.
			return r.finish(ending{code: ExitRunner, say: "roost-wasm: " + msg,
				report: &Report{Status: StatusMemoryRefused, Detail: msg}})
		}
		return r.fail("%s%s", msg, addressSpaceHint(msg))
	}
	start := inst.GetFunc(store, "_start")
	if start == nil {
		return r.fail("%s: %v", opts.Module, errNoStart)
	}
	_, err = start.Call(store)
	return r.ended(err, inst, store)
}

// ended classifies how the guest's _start ended.
func (r *runner) ended(err error, inst *wasmtime.Instance, store *wasmtime.Store) int {
	if err == nil {
		return r.finish(ending{code: 0})
	}
	var trap *wasmtime.Trap
	if !errors.As(err, &trap) {
		var werr *wasmtime.Error
		if errors.As(err, &werr) {
			if status, ok := werr.ExitStatus(); ok {
				return r.exited(int(status), inst, store)
			}
		}
	}
	code := -1
	if trap != nil {
		if c := trap.Code(); c != nil {
			code = int(*c)
		}
	}
	if code == trapInterrupt {
		return r.interrupted()
	}
	cause, backtrace := trapText(err)
	say := "roost-wasm: trap: " + cause
	if backtrace != "" {
		say += "\nwasm backtrace:\n" + backtrace
	}
	rep := &Report{Status: StatusCrashed, Detail: cause, Backtrace: backtrace}
	switch {
	case code == trapOutOfFuel || strings.Contains(cause, "all fuel consumed"):
		rep.Status = StatusFuelExhausted
		if r.opts.Fuel != nil {
			say += fmt.Sprintf("\nroost-wasm: the guest ran out of fuel (--fuel %d)", *r.opts.Fuel)
		}
	case r.memoryAtCap(inst, store):
		rep.Status = StatusMemoryRefused
		rep.Detail = cause + fmt.Sprintf(" (its memory had reached the cap, --memory-bytes %d: memory.grow was refused)", r.opts.MemoryBytes)
		say += "\n" + r.memorySay()
	}
	return r.finish(ending{code: ExitTrap, say: say, report: rep})
}

// Trap codes, as libwasmtime 39's C API numbers them (wasmtime_trap_code_enum). The
// wasmtime-go constants lag behind it from OutOfFuel on (its OutOfFuel is 11, the C API's
// WASMTIME_TRAP_CODE_ALWAYS_TRAP_ADAPTER), so they are not used.
const (
	trapInterrupt = 10
	trapOutOfFuel = 12
)

// exited is a guest that called proc_exit. A non-zero exit with its memory at the cap is
// reported as memory refused: a Go guest whose memory.grow fails exits 2 ("fatal error:
// out of memory"), with no trap to tell it from any other exit.
func (r *runner) exited(code int, inst *wasmtime.Instance, store *wasmtime.Store) int {
	if code == 0 || !r.memoryAtCap(inst, store) {
		return r.finish(ending{code: code})
	}
	say := r.memorySay()
	detail := fmt.Sprintf("the guest exited %d with its memory at the cap (--memory-bytes %d): memory.grow was refused", code, r.opts.MemoryBytes)
	return r.finish(ending{code: code, say: say, report: &Report{Status: StatusMemoryRefused, Detail: detail}})
}

func (r *runner) memorySay() string {
	return fmt.Sprintf("roost-wasm: the guest's memory reached its cap (--memory-bytes %d); memory.grow was refused", r.opts.MemoryBytes)
}

// interrupted ends a run the deadline or a signal interrupted.
func (r *runner) interrupted() int {
	r.mu.Lock()
	reason, sig := r.reason, r.signal
	r.mu.Unlock()
	switch reason {
	case byDeadline:
		msg := fmt.Sprintf("deadline of %s reached; the guest was interrupted", r.opts.Deadline)
		return r.finish(ending{code: ExitDeadline, say: "roost-wasm: " + msg,
			report: &Report{Status: StatusDeadlineReached, Detail: msg}})
	case bySignal:
		return r.finish(ending{code: 128 + int(sig), say: fmt.Sprintf("roost-wasm: %s (%s); the guest was interrupted", unix.SignalName(sig), sig)})
	}
	// An interrupt nobody asked for.
	return r.finish(ending{code: ExitTrap, say: "roost-wasm: trap: wasm trap: interrupt",
		report: &Report{Status: StatusCrashed, Detail: "wasm trap: interrupt"}})
}

// arm starts the deadline; false when the run was already interrupted.
func (r *runner) arm() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reason != 0 {
		return false
	}
	if d := r.opts.Deadline; d > 0 {
		time.AfterFunc(d, func() { r.interrupt(byDeadline, 0) })
	}
	return true
}

// watchSignals interrupts the run on each signal of opts.Signals.
func (r *runner) watchSignals() (stop func()) {
	quit := make(chan struct{})
	if r.opts.Signals != nil {
		go func() {
			for {
				select {
				case sig := <-r.opts.Signals:
					s, _ := sig.(syscall.Signal)
					r.interrupt(bySignal, s)
				case <-quit:
					return
				}
			}
		}()
	}
	return func() { close(quit) }
}

// interrupt stops the guest: one tick of the epoch traps it in wasm code at once. A guest
// blocked in a host call cannot be reached so; when it is not back within interruptGrace,
// the run ends without it and the process exits.
func (r *runner) interrupt(reason int, sig syscall.Signal) {
	r.mu.Lock()
	if r.reason != 0 || r.finished {
		r.mu.Unlock()
		return
	}
	r.reason, r.signal = reason, sig
	r.mu.Unlock()
	if r.engine != nil {
		r.engine.IncrementEpoch()
	}
	go func() {
		select {
		case <-r.done:
		case <-time.After(interruptGrace):
			r.opts.exit(r.interrupted())
		}
	}()
}

// guestMemory is the guest's exported linear memory, or nil.
func guestMemory(inst *wasmtime.Instance, store *wasmtime.Store) *wasmtime.Memory {
	if inst == nil {
		return nil
	}
	if ext := inst.GetExport(store, "memory"); ext != nil {
		return ext.Memory()
	}
	return nil
}

// memoryAtCap reports whether the guest's memory had reached the cap when it ended: within
// memorySlack of it, less than another grow of the size a Go or Rust allocator asks for.
// The store limiter does not say when it refused a grow; this is the sign of it.
func (r *runner) memoryAtCap(inst *wasmtime.Instance, store *wasmtime.Store) bool {
	limit := r.opts.MemoryBytes
	mem := guestMemory(inst, store)
	if limit <= 0 || mem == nil {
		return false
	}
	return int64(mem.DataSize(store))+memorySlack(limit) > limit
}

// memorySlack is how far below the cap a refused grow can leave the memory: Go's heap
// grows in 4 MiB arenas (and a little more for their metadata), Rust's allocator by what
// it needs, rounded to pages. An eighth of the cap when that is less.
func memorySlack(limit int64) int64 {
	return min(8<<20, max(limit/8, 64<<10))
}

// memoryTooSmall says why the module cannot start under the cap: its exported memory's
// initial size is larger. Empty when it fits, or when there is no cap.
func memoryTooSmall(m *wasmtime.Module, limit int64) string {
	if limit <= 0 {
		return ""
	}
	for _, e := range m.Exports() {
		mt := e.Type().MemoryType()
		if mt == nil {
			continue
		}
		if need := int64(mt.Minimum()) * 65536; need > limit {
			return fmt.Sprintf("the module's memory starts at %d bytes, more than --memory-bytes %d", need, limit)
		}
	}
	return ""
}

// firstCause is an instantiation error's message without wasmtime's host backtrace.
func firstCause(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "\nStack backtrace:"); i >= 0 {
		msg = msg[:i]
	}
	return msg
}

// guestEnv is the guest's environment: the runner's less its own variables, or none.
func guestEnv(fromSelf bool) []string {
	if !fromSelf {
		return nil
	}
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, envPrefix) || strings.HasPrefix(kv, roostinit.OutcomeFDEnv+"=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func splitEnv(env []string) (keys, values []string) {
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		keys, values = append(keys, k), append(values, v)
	}
	return keys, values
}

// addressSpaceHint explains an instantiation that could not reserve its memory's address
// space under an RLIMIT_AS: wasmtime reserves 4 GiB and guard pages for each 32-bit linear
// memory, however little of it the guest uses, and bounds its accesses by that reservation.
func addressSpaceHint(msg string) string {
	var lim unix.Rlimit
	if !strings.Contains(msg, "failed to reserve") || unix.Getrlimit(unix.RLIMIT_AS, &lim) != nil || lim.Cur == unix.RLIM_INFINITY {
		return ""
	}
	return fmt.Sprintf(" (RLIMIT_AS is %d bytes: wasmtime reserves 4 GiB and guard pages of address space for each linear memory, so a WASM program needs RLIMIT_AS unlimited; --memory-bytes caps what it uses)", lim.Cur)
}
