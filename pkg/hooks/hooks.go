// Package hooks runs the operator's WASM hooks (roostd --config, hooks:): WASI preview 1
// modules roost-wasm runs with an event's JSON on their stdin, no files and no environment.
//
// A stage hook is asked before a capsule is staged: it allows by exiting 0 and refuses
// with any other exit, its stdout's first line saying why. It fails closed: a hook that
// traps, runs past its deadline, runs out of memory or cannot run refuses too. Stage hooks
// run in the caller's goroutine, one after another in the configuration's order; the first
// refusal wins and the rest do not run.
//
// A session_end hook is told after a session ended and refuses nothing: SessionEnd queues
// the input and returns, and a worker per hook runs its queue in order. Its result (its
// stdout among it) reaches the EventSink.
//
// Each run is reported to the Observer as (hook, result, time) and to the EventSink with
// its subject. Results of stage hooks: allowed, vetoed, trap, timeout, out_of_memory,
// failed. Results of session_end hooks: ok (exit 0), failed (another exit of its own, or it
// could not run, or roostd stopped it), trap, timeout, out_of_memory, and dropped for an
// input that never ran (its queue was full, or roostd stopped first).
package hooks

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/config"
)

// Hook is one configured hook.
type Hook = config.Hook

// Outcomes of a run, and the result label of an input that never ran.
const (
	OutcomeAllowed     = "allowed"
	OutcomeVetoed      = "vetoed"
	OutcomeOK          = "ok"
	OutcomeTrap        = "trap"
	OutcomeTimeout     = "timeout"
	OutcomeOutOfMemory = "out_of_memory"
	OutcomeFailed      = "failed"
	OutcomeDropped     = "dropped"
)

// QueueLength is how many inputs wait for each session_end hook besides the one it runs.
const QueueLength = 256

// Result is one run of a hook.
type Result struct {
	// Outcome is one of the Outcome constants: what the run means for the hook's event.
	Outcome string
	// ExitCode is roost-wasm's exit code, -1 when it did not start or was killed.
	ExitCode int
	// Reason says why a run did not allow (or, for a session_end hook, did not succeed):
	// a vetoing hook's first line of stdout (trimmed, at most ReasonLimit bytes), or "it
	// trapped: …", "it ran past its deadline of 30s", "it ran out of memory (64 MiB)",
	// "it could not run: …", "it did not finish: …". Empty when it allowed.
	Reason string
	// Stdout and Stderr are what the run wrote, each bounded by OutputLimit.
	Stdout, Stderr []byte
	// Took is the run's time from the runner's start to its end.
	Took time.Duration
}

// Runner runs a hook once. ExecRunner is the default. Run must return soon after ctx ends,
// having stopped the run.
type Runner interface {
	Run(ctx context.Context, h Hook, stdin []byte) Result
}

// Observer hears every run and every dropped input; *metrics.Metrics is one.
type Observer interface {
	HookRan(hook, result string, took time.Duration)
}

// EventSink hears every run with its subject: the capsule reference a stage hook judged,
// or the id of the session a session_end hook was told of. The integrator records it as a
// registry event. It is called from Stage's caller and from the session_end workers,
// concurrently, and is not called for dropped inputs (they are counted and logged).
type EventSink interface {
	HookEvent(hook string, r Result, subject string)
}

// RefusedError is Stage's refusal. Its message is exactly `hook "policy" refused: <reason>`
// and it is an errdefs.ErrFailedPrecondition.
type RefusedError struct {
	Hook   string
	Result Result
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("hook %q refused: %s", e.Hook, e.Result.Reason)
}

// Unwrap makes the refusal a failed precondition (errdefs.IsFailedPrecondition).
func (e *RefusedError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// Hooks runs the configured hooks.
type Hooks struct {
	stage  []Hook
	ends   []*worker
	runner Runner
	obs    Observer
	sink   EventSink
	log    *slog.Logger

	// ctx is the session_end runs'; Close cancels it when it gives up waiting.
	ctx    context.Context
	cancel context.CancelFunc
	// closing is closed when Close begins: workers take no more inputs and blocked
	// SessionEnd calls return. closed, under mu, refuses inputs once Close has begun;
	// SessionEnd holds mu's read lock while it queues, so none is queued after Close drains.
	closing   chan struct{}
	closeOnce sync.Once
	mu        sync.RWMutex
	closed    bool
	workers   sync.WaitGroup
}

type worker struct {
	hook  Hook
	queue chan job
	mu    sync.Mutex
	// burst counts inputs dropped since the queue last had room: the first is logged, and
	// the count when the worker next takes an input.
	burst int
}

type job struct {
	subject string
	input   []byte
}

// New starts a worker per session_end hook of cfg (as config.Parse leaves it: zero bounds
// take their defaults). runner must not be nil when cfg has hooks; obs, sink and log may be.
func New(cfg []config.Hook, runner Runner, obs Observer, sink EventSink, log *slog.Logger) *Hooks {
	if obs == nil {
		obs = nopObserver{}
	}
	if sink == nil {
		sink = nopSink{}
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	h := &Hooks{runner: runner, obs: obs, sink: sink, log: log, closing: make(chan struct{})}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	for _, c := range cfg {
		c = withDefaults(c)
		switch c.On {
		case config.HookStage:
			h.stage = append(h.stage, c)
		case config.HookSessionEnd:
			w := &worker{hook: c, queue: make(chan job, QueueLength)}
			h.ends = append(h.ends, w)
			h.workers.Add(1)
			go h.work(w)
		}
	}
	return h
}

// withDefaults fills what config.Parse fills, for hooks built without it.
func withDefaults(h Hook) Hook {
	if h.DeadlineSeconds <= 0 {
		h.DeadlineSeconds = config.DefaultHookDeadlineSeconds
	}
	if h.MemoryBytes <= 0 {
		h.MemoryBytes = config.DefaultHookMemoryBytes
	}
	if h.On == config.HookSessionEnd && h.OnOverflow == "" {
		h.OnOverflow = config.HookOverflowDrop
	}
	return h
}

// Stage asks every stage hook in configuration order about input (the JSON the caller
// builds; subject names the capsule in events). It returns nil when every one allows, a
// *RefusedError (errdefs.ErrFailedPrecondition) for the first that does not, whatever the
// reason: a veto, a trap, a timeout, running out of memory, or not running at all. When
// ctx ends first, Stage fails with an error wrapping ctx's (not a refusal: the hook was
// stopped, it did not refuse). Stage calls run concurrently with each other, and after
// Close.
func (h *Hooks) Stage(ctx context.Context, subject string, input []byte) error {
	for _, hk := range h.stage {
		r := h.run(ctx, hk, subject, input)
		if r.Outcome == OutcomeAllowed {
			continue
		}
		if r.Outcome == OutcomeFailed && ctx.Err() != nil {
			return fmt.Errorf("hook %q did not finish: %w", hk.Name, context.Cause(ctx))
		}
		return &RefusedError{Hook: hk.Name, Result: r}
	}
	return nil
}

// SessionEnd queues input (the JSON the caller builds; subject is the session's id) for
// every session_end hook and returns; it keeps its own copy of input.
//
// A hook's queue holds QueueLength inputs besides the one it runs. When it is full, a hook
// with on_overflow: drop drops this input (the newest): it is counted as "dropped" and the
// first drop of a burst is logged. A hook with on_overflow: block makes SessionEnd wait
// until its worker takes an input: the caller is roostd's end path, so while such a hook
// lags, every session end waits in it — each is recorded only after its input is queued —
// for as long as it takes the hook to work through a full queue (at worst QueueLength runs
// of its deadline). Close releases a waiting call, dropping its input.
func (h *Hooks) SessionEnd(subject string, input []byte) {
	if len(h.ends) == 0 {
		return
	}
	j := job{subject: subject, input: bytes.Clone(input)}
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, w := range h.ends {
		if h.closed {
			h.drop(w, j, false)
			continue
		}
		if w.hook.OnOverflow == config.HookOverflowBlock {
			select {
			case w.queue <- j:
			case <-h.closing:
				h.drop(w, j, false)
			}
			continue
		}
		select {
		case w.queue <- j:
		default:
			h.drop(w, j, true)
		}
	}
}

// drop counts an input that will not run; full says its queue was full, else roostd stops.
func (h *Hooks) drop(w *worker, j job, full bool) {
	h.obs.HookRan(w.hook.Name, OutcomeDropped, 0)
	if !full {
		h.log.Warn("hook input dropped: roostd is stopping", "hook", w.hook.Name, "subject", j.subject)
		return
	}
	w.mu.Lock()
	w.burst++
	first := w.burst == 1
	w.mu.Unlock()
	if first {
		h.log.Warn("hook queue full: dropping session_end inputs until it has room (on_overflow: drop)",
			"hook", w.hook.Name, "queue", QueueLength, "first_dropped", j.subject)
	}
}

func (h *Hooks) work(w *worker) {
	defer h.workers.Done()
	for {
		// Closing first: select picks at random among ready cases, and a worker must not
		// go on taking queued inputs once Close has begun (Close drops them).
		select {
		case <-h.closing:
			return
		default:
		}
		select {
		case <-h.closing:
			return
		case j := <-w.queue:
			// Taken before Close began: it is in flight, and Close waits for it.
			w.mu.Lock()
			n := w.burst
			w.burst = 0
			w.mu.Unlock()
			if n > 0 {
				h.log.Warn("hook queue has room again", "hook", w.hook.Name, "dropped", n)
			}
			h.run(h.ctx, w.hook, j.subject, j.input)
		}
	}
}

// run runs hk once and reports it.
func (h *Hooks) run(ctx context.Context, hk Hook, subject string, input []byte) Result {
	var r Result
	if h.runner == nil {
		r = Result{Outcome: OutcomeFailed, ExitCode: -1, Reason: "it could not run: roostd has no hook runner"}
	} else {
		r = h.runner.Run(ctx, hk, input)
	}
	r.Outcome = normalize(hk, r.Outcome)
	h.obs.HookRan(hk.Name, r.Outcome, r.Took)
	h.sink.HookEvent(hk.Name, r, subject)
	attrs := []any{"hook", hk.Name, "on", hk.On, "subject", subject, "result", r.Outcome, "took", r.Took}
	switch r.Outcome {
	case OutcomeAllowed, OutcomeOK:
		h.log.Debug("hook ran", attrs...)
	case OutcomeVetoed:
		h.log.Info("hook refused", append(attrs, "reason", r.Reason)...)
	default:
		h.log.Warn("hook failed", append(attrs, "reason", r.Reason, "exit_code", r.ExitCode)...)
	}
	return r
}

// normalize maps a runner's outcome to the hook's results: a session_end hook is told,
// not asked, so its exit 0 is "ok" and another exit of its own "failed"; an outcome a
// Runner should not give is "failed" (which refuses).
func normalize(hk Hook, outcome string) string {
	switch outcome {
	case OutcomeTrap, OutcomeTimeout, OutcomeOutOfMemory, OutcomeFailed:
		return outcome
	}
	if hk.On == config.HookSessionEnd {
		switch outcome {
		case OutcomeAllowed, OutcomeOK:
			return OutcomeOK
		}
		return OutcomeFailed
	}
	switch outcome {
	case OutcomeAllowed, OutcomeVetoed:
		return outcome
	}
	return OutcomeFailed
}

// Close stops the session_end workers: they take no more inputs, and the inputs still
// queued, and SessionEnd calls waiting or made from now on, are dropped (counted and
// logged). It waits for the runs in flight until ctx ends, then stops them (their result
// is failed: "it did not finish") and returns ctx's error. Stage still works after Close.
func (h *Hooks) Close(ctx context.Context) error {
	h.closeOnce.Do(func() { close(h.closing) })
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	done := make(chan struct{})
	go func() { h.workers.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		h.cancel()
		<-done
		err = fmt.Errorf("hooks: runs in flight were stopped: %w", context.Cause(ctx))
	}
	h.cancel()
	for _, w := range h.ends {
		n := 0
	drain:
		for {
			select {
			case <-w.queue:
				h.obs.HookRan(w.hook.Name, OutcomeDropped, 0)
				n++
			default:
				break drain
			}
		}
		if n > 0 {
			h.log.Warn("hook inputs dropped: roostd is stopping", "hook", w.hook.Name, "dropped", n)
		}
	}
	return err
}

type nopObserver struct{}

func (nopObserver) HookRan(string, string, time.Duration) {}

type nopSink struct{}

func (nopSink) HookEvent(string, Result, string) {}
