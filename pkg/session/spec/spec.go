// Package spec makes a session's record, and the manifest it was staged with, into the
// containment.Spec its runtime starts: the command line, the environment, what it may
// run, and where the program finds its workdir, its capsule's files and its home (on the
// host's paths, or inside a sealed root). It only computes (it reads no more than where a
// login shell's links lead): it opens nothing and starts nothing, so launch and exec build
// the same start from the same record.
package spec

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/toolchain"
	"roost.dev/roost/pkg/wasmcache"
)

// TaskFile is the task text's name in the session's records directory.
const TaskFile = "task.md"

// Input is what a session's start is made of besides its record.
type Input struct {
	Record   *store.Record
	Class    manifest.Class
	Manifest *manifest.Manifest
	Policy   *manifest.Policy
	// Home is the session's home on the host; Children the children's trees it may read.
	Home     string
	Children []string
	// HostEnv is what of roostd's environment reaches the session (plan.HostVariables);
	// Roost are roost's own variables for it (ROOST_ENDPOINT, the inference and delegation
	// variables), which nothing overrides.
	HostEnv map[string]string
	Roost   map[string]string
	// NetNS is the network namespace its endpoint made, if any.
	NetNS string
	// Wasm is the compiled-module cache a WASM session's runner reads.
	Wasm *wasmcache.Cache
}

// Build is the program's start.
func Build(in Input) containment.Spec {
	rec, class, policy := in.Record, in.Class, in.Policy
	view := hostView(rec, in.Home)
	if class == manifest.Sealed {
		view = sealedView
	}
	roost := map[string]string{}
	for k, v := range in.Roost {
		roost[k] = v
	}
	var task string
	if rec.HasTask {
		task = filepath.Join(rec.RecordsDir, TaskFile)
		roost["ROOST_TASK_FILE"] = task
		if class == manifest.Sealed {
			roost["ROOST_TASK_FILE"] = sealed.TaskPath
		}
	}
	var ids containment.IDs
	if rec.IDs != nil {
		ids = containment.IDs(*rec.IDs)
	}
	exec, trees := view.paths(execFiles(rec)), view.paths(execTrees(rec))
	shell := LoginShell(in.Manifest.Env["SHELL"], exec, trees)
	argv := view.command(rec)
	var runner, module string
	if rec.Wasm != nil {
		runner, module = wasmFiles(in.Wasm, rec)
		inRunner, inModule := wasmView(in.Wasm, class, rec)
		argv = wasmArgv(rec, policy, view, inRunner, inModule)
	}
	return containment.Spec{
		SessionID:  rec.ID,
		Class:      class,
		IDs:        ids,
		Root:       rec.HostRoot,
		Children:   in.Children,
		Home:       in.Home,
		Exec:       exec,
		ExecTrees:  trees,
		Argv:       argv,
		Env:        environment(rec, in.Manifest, in.HostEnv, view, shell, roost),
		NetNS:      in.NetNS,
		Task:       task,
		Dir:        rec.Workdir,
		RecordsDir: rec.RecordsDir,
		CapsuleDir: rec.Capsule.Root(),
		Rlimits:    containment.Rlimits(class, policy),
		Policy:     policy,
		Runner:     runner,
		WasmModule: module,
		Shell:      shell,
		// roost-init keeps each output stream within it.
		LogMaxBytes: policy.Resources.LogMaxBytes.Value,
	}
}

// execFiles is what the session may exec besides its program: the files its shell.allow
// resolved to at stage (nil for a session staged before that: its runtime looks the names
// up at launch).
func execFiles(rec *store.Record) []string {
	if rec.Shell == nil {
		return nil
	}
	out := []string{}
	for _, e := range rec.Shell {
		out = append(out, e.Files...)
	}
	return out
}

// execTrees are the directories its shell.allow resolved to: every file beneath may run.
func execTrees(rec *store.Record) []string {
	var out []string
	for _, e := range rec.Shell {
		out = append(out, e.Trees...)
	}
	return out
}

// view is where the program finds its workdir, its capsule's files and its home: on the
// host's paths, or at /work, /capsule and /root inside a sealed root.
type view struct {
	work, capsule, home string
}

var sealedView = view{work: "/work", capsule: "/capsule", home: sealed.Home}

// Workdir is the workdir's path as the session's own processes see it: /work in a sealed
// root, the host's path otherwise. A staged session, not yet launched, has only its floor,
// and a sealed floor launches sealed or not at all.
func Workdir(rec *store.Record) string {
	class := rec.Achieved
	if class == "" {
		class = rec.Declared
	}
	if class == manifest.Sealed.String() {
		return sealedView.work
	}
	return rec.Workdir
}

func hostView(rec *store.Record, home string) view {
	return view{work: rec.Workdir, capsule: rec.Capsule.Root(), home: home}
}

// paths places what shell.allow names in the capsule (recorded as /capsule/...) in the
// program's view.
func (v view) paths(list []string) []string {
	if list == nil {
		return nil
	}
	out := make([]string, len(list))
	for i, p := range list {
		if rest, ok := strings.CutPrefix(p, toolchain.CapsuleView+"/"); ok {
			p = v.capsule + "/" + rest
		}
		out[i] = p
	}
	return out
}

// command is the staged command line as the program's view names it: a program from the
// capsule directory moves with it.
func (v view) command(rec *store.Record) []string {
	argv := slices.Clone(rec.Command)
	// The program and the arguments staging found in the capsule (plan.Command) are where
	// the session sees the capsule.
	for i, arg := range argv {
		if rest, ok := strings.CutPrefix(arg, rec.Capsule.Root()+"/"); ok {
			argv[i] = v.capsule + "/" + rest
		}
	}
	return argv
}

// environment is the program's whole environment: PATH (with its presets' directories)
// and HOME defaults, the host
// variables that pass (see hostVariables), the manifest's literal env (which wins over
// both), then roost's own ROOST_* variables, which nothing overrides. Sorted, so it is
// reproducible.
func environment(rec *store.Record, man *manifest.Manifest, host map[string]string, v view, shell string, roost map[string]string) []string {
	env := map[string]string{"PATH": toolchain.SessionPath("", rec.Shell), "HOME": v.home, "SHELL": shell}
	for k, v := range host {
		env[k] = v
	}
	for k, v := range man.Env {
		env[k] = v
	}
	env["ROOST_SESSION_ID"] = rec.ID
	env["ROOST_CAPSULE"] = rec.Capsule.Name + "@" + rec.Capsule.Version
	env["ROOST_CAPSULE_DIR"] = v.capsule
	for k, val := range roost {
		env[k] = val
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// bash is the login shell a session gets where it may run it: agents' tools write commands
// for bash ([[ ]], arrays, pipefail) and run them with the passwd shell.
const bash = "/bin/bash"

// LoginShell is the login shell of a session that may exec exec (files) and what lies in
// trees: a declared SHELL (env.SHELL) it may run, else bash where it may, else /bin/sh. A
// declared shell is the capsule's word on what its commands are written for, so the passwd
// agrees with it; one the session cannot run would fail every command run with it (127),
// so it is left to SHELL alone.
func LoginShell(declared string, exec, trees []string) string {
	for _, sh := range []string{declared, bash} {
		if filepath.IsAbs(sh) && mayRun(sh, exec, trees) {
			return sh
		}
	}
	return "/bin/sh"
}

// mayRun says whether path, resolved on the host, is one of exec or lies in one of trees:
// what the session's allowlist lets it run, which its view holds.
func mayRun(path string, exec, trees []string) bool {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false
	}
	for _, f := range exec {
		if f == path || f == real {
			return true
		}
		if r, err := filepath.EvalSymlinks(f); err == nil && r == real {
			return true
		}
	}
	for _, t := range trees {
		if toolchain.Beneath(real, t) {
			return true
		}
	}
	return false
}

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
