package sealed

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/opencontainers/runc/libcontainer"

	"roost.dev/roost/pkg/containment"
)

// lazyContainer is a session's libcontainer container, read from its state the first time
// something needs it (a signal, a pause, its cgroup's figures, an exec, its destruction
// while it runs). roost-sealer writes that state when it starts the container; reading it
// back decodes tens of kilobytes of JSON (the seccomp filter), a few milliseconds of CPU
// per session here, and a session of a short program ends and is released without it.
type lazyContainer struct {
	containers, id string
	// The init libcontainer started, by pid and start time: Release tells from them that
	// it has ended.
	initPID   int
	initStart uint64

	mu  sync.Mutex
	c   *libcontainer.Container
	err error
}

// get is the container, read from its state the first time.
func (l *lazyContainer) get() (*libcontainer.Container, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil && l.err == nil {
		if l.c, l.err = libcontainer.Load(l.containers, l.id); l.err != nil {
			l.err = fmt.Errorf("loading the container %s: %w", l.id, l.err)
		}
	}
	return l.c, l.err
}

// orLoad is l's container, or with no l the one libcontainer's state under containers says.
func (l *lazyContainer) orLoad(containers, id string) (*libcontainer.Container, error) {
	if l != nil {
		return l.get()
	}
	return libcontainer.Load(containers, id)
}

// signal sends sig to the container's init; an error reading the container leaves it be
// (Release finds it still).
func (l *lazyContainer) signal(sig syscall.Signal) {
	if c, err := l.get(); err == nil {
		_ = c.Signal(sig)
	}
}

// loaded is the container when it has been read (or made here), else nil.
func (l *lazyContainer) loaded() *libcontainer.Container {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c
}

// ended says whether the container's init is gone (reaped: its pid is free or another
// process's).
func (l *lazyContainer) ended() bool {
	st, err := containment.StartTime(l.initPID)
	return err != nil || st != l.initStart
}

// hold keeps l for Release.
func (r *Runtime) hold(l *lazyContainer) {
	r.heldMu.Lock()
	r.held[l.id] = l
	r.heldMu.Unlock()
}

// unhold takes the session's container from those held, nil when none is.
func (r *Runtime) unhold(id string) *lazyContainer {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	l := r.held[id]
	delete(r.held, id)
	return l
}
