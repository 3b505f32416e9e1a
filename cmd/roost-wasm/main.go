// Command roost-wasm runs a WASI preview 1 module for a roost session or hook, with a
// memory cap, a deadline and optional fuel, and compiles modules ahead of time for the
// cache roostd keeps. See pkg/wasmrun.
//
//	roost-wasm run --module PATH [--cache FILE --cache-sha256 HEX]
//	               [--memory-bytes N] [--fuel N] [--deadline-seconds N]
//	               [--preopen HOSTDIR:GUESTDIR[:ro]]... [--env-from-self] [--stdin-json]
//	               -- [ARGS...]
//	roost-wasm compile --module PATH --out FILE
//	roost-wasm version
//
// run exits with the guest's proc_exit code (0 when _start returns), 124 when
// --deadline-seconds passed, 128+n on signal n (143 for SIGTERM), 134 on a trap (fuel
// exhaustion included; "roost-wasm: trap: <message>" and the wasm backtrace on stderr), and
// 125 when roost-wasm itself failed before the guest ran. With ROOST_REPORT_FD set it writes
// one JSON object there when the guest trapped, ran out of fuel, reached its deadline or was
// refused memory (see records.Outcome). compile prints the compiled module's sha256; version
// prints "wasmtime <version> engine <settings hash>", the second half of the cache key.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"roost.dev/roost/pkg/wasmrun"
)

const usage = `usage:
  roost-wasm run --module PATH [--cache FILE --cache-sha256 HEX]
                 [--memory-bytes N] [--fuel N] [--deadline-seconds N]
                 [--preopen HOSTDIR:GUESTDIR[:ro]]... [--env-from-self] [--stdin-json]
                 -- [ARGS...]
  roost-wasm compile --module PATH --out FILE
  roost-wasm version
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return wasmrun.ExitRunner
	}
	switch args[0] {
	case "run":
		return runCmd(args[1:], stderr)
	case "compile":
		return compileCmd(args[1:], stdout, stderr)
	case "version":
		if len(args) > 1 {
			fmt.Fprint(stderr, usage)
			return wasmrun.ExitRunner
		}
		fmt.Fprintln(stdout, wasmrun.Version())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "roost-wasm: unknown command %q\n%s", args[0], usage)
	return wasmrun.ExitRunner
}

type preopens []wasmrun.Preopen

func (p *preopens) String() string { return fmt.Sprint(*p) }

func (p *preopens) Set(s string) error {
	po, err := wasmrun.ParsePreopen(s)
	if err != nil {
		return err
	}
	*p = append(*p, po)
	return nil
}

func flagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("roost-wasm "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func runCmd(args []string, stderr io.Writer) int {
	fs := flagSet("run", stderr)
	var opts wasmrun.Options
	var pre preopens
	var fuel uint64
	var deadline float64
	fs.StringVar(&opts.Module, "module", "", "the WASI preview 1 module (`PATH`)")
	fs.StringVar(&opts.Cache, "cache", "", "a compiled module (`FILE`) from roost-wasm compile, used when its sha256 and engine match")
	fs.StringVar(&opts.CacheSHA256, "cache-sha256", "", "the sha256 (`HEX`) the cache entry must have")
	fs.Int64Var(&opts.MemoryBytes, "memory-bytes", 0, "cap on the guest's linear memory, in bytes (0: none)")
	fs.Uint64Var(&fuel, "fuel", 0, "fuel the guest may burn; it traps when it runs out (default: unbounded)")
	fs.Float64Var(&deadline, "deadline-seconds", 0, "interrupt the guest after this many seconds and exit 124 (0: none)")
	fs.Var(&pre, "preopen", "a host directory the guest sees, `HOSTDIR:GUESTDIR[:ro]` (repeatable)")
	fs.BoolVar(&opts.EnvFromSelf, "env-from-self", false, "pass this environment, less ROOST_WASM_* variables, to the guest (default: none)")
	fs.BoolVar(&opts.StdinJSON, "stdin-json", false, "stdin carries JSON (a hook's input); it is inherited either way")
	if err := fs.Parse(args); err != nil {
		return wasmrun.ExitRunner
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "fuel" {
			opts.Fuel = &fuel
		}
	})
	if deadline < 0 || deadline > float64(1<<62)/float64(time.Second) {
		fmt.Fprintln(stderr, "roost-wasm: --deadline-seconds out of range")
		return wasmrun.ExitRunner
	}
	opts.Deadline = time.Duration(deadline * float64(time.Second))
	opts.Preopens = pre
	opts.Args = fs.Args()
	opts.Stderr = stderr
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	opts.Signals = sigs
	return wasmrun.Run(opts)
}

func compileCmd(args []string, stdout, stderr io.Writer) int {
	fs := flagSet("compile", stderr)
	module := fs.String("module", "", "the WASI module to compile (`PATH`)")
	out := fs.String("out", "", "where to write the compiled module (`FILE`), atomically")
	if err := fs.Parse(args); err != nil {
		return wasmrun.ExitRunner
	}
	if *module == "" || *out == "" || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "roost-wasm compile: --module and --out are required, and nothing else\n")
		return wasmrun.ExitRunner
	}
	sum, err := wasmrun.Compile(*module, *out)
	if err != nil {
		fmt.Fprintf(stderr, "roost-wasm: %s\n", strings.TrimSpace(err.Error()))
		return wasmrun.ExitRunner
	}
	fmt.Fprintln(stdout, sum)
	return 0
}
