package session

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"roost.dev/roost/pkg/containment/sealed"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/delegate"
	"roost.dev/roost/pkg/session/plan"
	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/session/warmpool"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/egress"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/spawn"
	"roost.dev/roost/pkg/toolchain"
)

// defaultPath is the PATH a program gets unless its manifest sets one.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Launch starts a staged session and returns once its program runs, or once it has failed
// to start (the session is then exited with start_failed, and that is not an error of
// Launch).
//
// It takes two transactions on purpose: launching is written before the process exists, so
// a daemon that dies in between leaves a record recovery can resolve, never a process
// nobody knows of.
func (m *Manager) Launch(ctx context.Context, id string) (*store.Record, error) {
	rec, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	sid := rec.ID
	l := m.live.hold(sid)
	l.mu.Lock()
	defer l.mu.Unlock()
	// Every way out before the program is supervised lets go of the live entry (release
	// keeps an entry that has a process).
	defer m.live.release(sid, l)
	if rec, err = m.Get(sid); err != nil {
		return nil, err
	}
	if rec.State != store.Staged {
		return nil, fmt.Errorf("session %s is %s; only a staged session can be launched: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	class, err := manifest.ParseClass(rec.Achieved)
	if err != nil {
		return nil, fmt.Errorf("session %s: %v: %w", rec.ID, err, errdefs.ErrDataLoss)
	}
	runtime := m.cfg.Runtimes[class]
	if runtime == nil {
		return nil, fmt.Errorf("session %s needs a %s runtime, which this daemon does not have: %w", rec.ID, class, errdefs.ErrFailedPrecondition)
	}
	// A sealed session that fits takes a sandbox made ahead, and with it the sandbox's uid
	// range, in the same transaction that records it launching.
	var sb *sealed.Sandbox
	var cold error
	if m.pool != nil && class == manifest.Sealed {
		if _, policy, err := m.reg.manifest(rec); err == nil {
			sb, cold = m.pool.Take(policy, rec.Wasm != nil)
		}
	}
	began := time.Now()
	if err := m.reg.update(func(tx *store.Tx) error {
		// Checked in the launch's own transaction: a parent that ends after it commits
		// sees this child launching and stops it; one that ended before refuses it here.
		if rec.ParentID != "" {
			parent, err := tx.Get(rec.ParentID)
			if err != nil || !parent.State.Live() {
				return fmt.Errorf("session %s: its parent %s has ended: %w", rec.ID, rec.ParentID, errdefs.ErrFailedPrecondition)
			}
		}
		if sb != nil {
			if err := tx.TakeIDs(rec, sb.ID, store.IDs(sb.IDs)); err != nil {
				return err
			}
			rec.Warm = true
			return tx.Transition(rec, store.Launching)
		}
		// Staged by a roostd from before id ranges: it gets one now.
		if rec.IDs == nil && !rec.HostRoot {
			if err := tx.AllocateIDs(rec, m.cfg.IDs); err != nil {
				return err
			}
		}
		return tx.Transition(rec, store.Launching)
	}); err != nil {
		if sb != nil {
			m.pool.Discard(sb)
		}
		return nil, err
	}
	proc, err := m.start(ctx, l, rec, class, runtime, sb)
	if err != nil {
		if m.cfg.Observer != nil {
			m.cfg.Observer.SessionStartFailed(class)
		}
		var se *containment.StartError
		detail := err.Error()
		if !errors.As(err, &se) {
			detail = "roost could not start the program: " + detail
		}
		m.endWithoutProcess(l, rec, store.StatusStartFailed, detail)
		return m.Get(rec.ID)
	}

	ref := proc.Ref()
	rec.Process = &ref
	if l.ep != nil {
		rec.EndpointPort = l.ep.Port()
	}
	rec.StartedAt = ref.StartedAt
	rec.DeadlineAt = ref.StartedAt.Add(deadlineOf(rec))
	if err := m.reg.update(func(tx *store.Tx) error { return tx.Transition(rec, store.Running) }); err != nil {
		// The program runs but the registry refused the record: end it rather than leave
		// a process nobody can see, and let go of what the launch took (the live entry
		// goes with the deferred release). The record stays launching: the next start
		// finds the process gone and records the session lost.
		_ = proc.Signal(sigKill)
		select {
		case <-proc.Done():
		case <-time.After(m.cfg.StopGrace):
		}
		l.stopTimers()
		m.egress.Close(rec)
		if l.ep != nil {
			l.ep.Close()
		}
		m.releaseRuntime(rec)
		return nil, err
	}
	if m.cfg.Observer != nil {
		m.cfg.Observer.SessionStarted(class, time.Since(began))
	}
	m.cfg.Logger.Info("session launched", "session", rec.ID, "capsule", rec.Capsule.Name+"@"+rec.Capsule.Version, "class", rec.Achieved,
		"pid", ref.PID, "took", time.Since(began).Round(time.Microsecond).String(), "start", warmpool.StartNote(sb != nil, cold))
	m.supervise(l, rec, proc)
	return rec, nil
}

// start makes the session's directories, writes the start of its trace, opens its endpoint
// and starts the program: in sb, a sandbox made ahead, when it is not nil. The launch
// outlives the RPC that asked for it: a client going away mid-launch must not leave a
// half-started session. The caller holds l.mu.
func (m *Manager) start(ctx context.Context, l *liveSession, rec *store.Record, class manifest.Class, runtime Runtime, sb *sealed.Sandbox) (containment.Process, error) {
	if sb != nil {
		defer func() {
			// Not handed to the runtime: nothing else will end it.
			if sb != nil {
				m.pool.Discard(sb)
			}
		}()
		// roost-init holds the sandbox's records directory open: it becomes the session's.
		if err := os.Remove(rec.RecordsDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("records directory: %w", err)
		}
		if err := os.Rename(sb.Records, rec.RecordsDir); err != nil {
			return nil, fmt.Errorf("records directory: %w", err)
		}
		if sb.NetNS != "" {
			if err := m.cfg.Endpoints.Move(sb.ID, rec.ID); err != nil {
				return nil, err
			}
		}
	} else if err := os.MkdirAll(rec.RecordsDir, 0o711); err != nil {
		// Root's: the session may pass through to its task text, never list or read the rest.
		return nil, fmt.Errorf("records directory: %w", err)
	}
	if err := m.trees.prepareWorkdir(rec); err != nil {
		return nil, fmt.Errorf("workdir: %w", err)
	}
	if err := m.trees.prepareHome(rec); err != nil {
		return nil, fmt.Errorf("home: %w", err)
	}
	if rec.HasTask {
		var task []byte
		if err := m.reg.View(func(tx *store.Tx) (err error) {
			task, err = tx.Task(rec.ID)
			return err
		}); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(rec.RecordsDir, TaskFile), task, 0o444); err != nil {
			return nil, fmt.Errorf("task: %w", err)
		}
	}
	man, policy, err := m.reg.manifest(rec)
	if err != nil {
		return nil, err
	}
	l.policyMu.Lock()
	l.policy = policy
	l.policyMu.Unlock()
	if len(m.trees.childrenDirs(rec, class, policy)) > 0 {
		if err := m.trees.prepareChildrenDir(rec); err != nil {
			return nil, err
		}
	}
	if err := m.accounts.open(rec, policy); err != nil {
		return nil, fmt.Errorf("the session's ledger account: %w", err)
	}
	if m.cfg.Endpoints != nil {
		var proxy *egress.Session
		if hasNetNS(class) {
			proxy = m.egress.Open(rec.ID, policy, store.EgressTotals{}, 0)
		}
		ep, err := m.cfg.Endpoints.Open(rec.ID, hasNetNS(class), 0, int(policy.Resources.EndpointMaxConnections.Value), m.backend, proxy)
		if err != nil {
			if proxy != nil {
				proxy.Close()
			}
			return nil, err
		}
		l.ep = ep
	}
	spec := m.launchSpec(rec, class, man, policy, l.ep)
	var explanation []byte
	_ = m.reg.View(func(tx *store.Tx) (err error) {
		explanation, err = tx.Explanation(rec.ID)
		return err
	})
	if err := records.AppendTrace(rec.RecordsDir, traceStart(rec, explanation)); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	if sb != nil {
		claimed := sb
		sb = nil
		return m.pool.Start(context.WithoutCancel(ctx), claimed, spec)
	}
	return runtime.Start(context.WithoutCancel(ctx), spec)
}

// TaskFile is the task text's name in the session's records directory.
const TaskFile = "task.md"

// launchSpec builds the program's start from the manifest recorded at staging.
func (m *Manager) launchSpec(rec *store.Record, class manifest.Class, man *manifest.Manifest, policy *manifest.Policy, ep spawn.Endpoint) containment.Spec {
	// What of roostd's environment reaches the session (see plan.HostVariables).
	hostEnv, _ := plan.HostVariables(policy.Env.Allow, m.cfg.EnvPassthrough, m.cfg.HostEnv)
	view := hostView(rec, m.trees.home(rec.ID))
	if class == manifest.Sealed {
		view = sealedView
	}
	extra := map[string]string{}
	var netns, task string
	if ep != nil {
		netns = ep.NetNS()
		extra["ROOST_ENDPOINT"] = ep.URL()
		extra["ROOST_CREDENTIAL"] = m.cfg.Endpoints.Credential(rec.ID)
	}
	m.accounts.inferenceEnv(policy, ep, extra["ROOST_CREDENTIAL"], extra)
	delegate.Env(policy, ep, extra)
	if rec.HasTask {
		task = filepath.Join(rec.RecordsDir, TaskFile)
		extra["ROOST_TASK_FILE"] = task
		if class == manifest.Sealed {
			extra["ROOST_TASK_FILE"] = sealed.TaskPath
		}
	}
	var ids containment.IDs
	if rec.IDs != nil {
		ids = containment.IDs(*rec.IDs)
	}
	argv := view.command(rec)
	var runner, module string
	if rec.Wasm != nil {
		runner, module = wasmFiles(m.cfg.Wasm, rec)
		inRunner, inModule := wasmView(m.cfg.Wasm, class, rec)
		argv = wasmArgv(rec, policy, view, inRunner, inModule)
	}
	return containment.Spec{
		SessionID:  rec.ID,
		Class:      class,
		IDs:        ids,
		Root:       rec.HostRoot,
		Children:   m.trees.childrenDirs(rec, class, policy),
		Home:       m.trees.home(rec.ID),
		Exec:       view.paths(execFiles(rec)),
		ExecTrees:  view.paths(execTrees(rec)),
		Argv:       argv,
		Env:        environment(rec, man, hostEnv, view, extra),
		NetNS:      netns,
		Task:       task,
		Dir:        rec.Workdir,
		RecordsDir: rec.RecordsDir,
		CapsuleDir: rec.Capsule.Root(),
		Rlimits:    containment.Rlimits(class, policy),
		Policy:     policy,
		Runner:     runner,
		WasmModule: module,
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
	if rest, ok := strings.CutPrefix(argv[0], rec.Capsule.Root()+"/"); ok {
		argv[0] = v.capsule + "/" + rest
	}
	return argv
}

// environment is the program's whole environment: PATH and HOME defaults, the host
// variables that pass (see hostVariables), the manifest's literal env (which wins over
// both), then roost's own ROOST_* variables, which nothing overrides. Sorted, so it is
// reproducible.
func environment(rec *store.Record, man *manifest.Manifest, host map[string]string, v view, roost map[string]string) []string {
	env := map[string]string{"PATH": defaultPath, "HOME": v.home}
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
