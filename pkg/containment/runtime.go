package containment

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"roost.dev/roost/pkg/containment/seccomp"
	"roost.dev/roost/pkg/manifest"
)

// Runtime starts and re-attaches the programs of one containment class: the core's
// ProcessRuntime (unconfined, advisory), scoped.Runtime and sealed.Runtime.
type Runtime interface {
	Start(ctx context.Context, spec Spec) (Process, error)
	// Attach re-attaches to a session a previous daemon started; ref is nil when that
	// daemon died before recording the process.
	Attach(sessionID, recordsDir string, ref *ProcessRef) (Process, error)
	// Release frees what the runtime holds for an ended session. It is safe to call more
	// than once, and for a session it never started.
	Release(sessionID string) error
}

var _ Runtime = (*ProcessRuntime)(nil)

// ErrNoRuntime is why a daemon without a runtime for a class cannot run sessions of it.
var ErrNoRuntime = errors.New("no runtime for the class")

// Rehearse runs /usr/bin/true as a throwaway session of class in r, keeping what it makes
// under scratch and running as ids (a range no session is given): the runtime's real
// ability on this host, not a guess from versions. Each runtime's Rehearse calls it with its
// own runtime, class and scratch directory.
func Rehearse(ctx context.Context, r Runtime, class manifest.Class, scratch string, ids IDs) error {
	switch {
	case os.Geteuid() != 0:
		return errors.New("roostd does not run as root; run it as root (deploy/systemd/roostd.service)")
	case !seccomp.Built:
		return errors.New("roostd was built without seccomp support; build it with -tags seccomp and libseccomp-dev (make build does)")
	}
	dir, err := os.MkdirTemp(scratch, ".rehearsal-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	id := "rehearsal-" + filepath.Base(dir)[len(".rehearsal-"):]
	spec := Spec{
		SessionID:  id,
		Class:      class,
		Argv:       []string{"/usr/bin/true"},
		Env:        []string{"PATH=" + DefaultPath},
		Dir:        filepath.Join(dir, "work"),
		RecordsDir: filepath.Join(dir, "records"),
		CapsuleDir: filepath.Join(dir, "capsule"),
		Policy:     rehearsalPolicy(class),
		IDs:        ids,
	}
	// As roostd prepares a session: the workdir is the session's ids', the capsule
	// readable by them, the way there passable.
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	for _, d := range []string{spec.Dir, spec.RecordsDir, spec.CapsuleDir} {
		if err := os.Mkdir(d, 0o711); err != nil {
			return err
		}
	}
	if err := os.Chown(spec.Dir, int(ids.First), int(ids.First)); err != nil {
		return err
	}
	defer r.Release(id)
	p, err := r.Start(ctx, spec)
	if err != nil {
		return err
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		_ = p.Signal(syscall.SIGKILL)
		return ctx.Err()
	}
	info, err := p.Exit()
	if err != nil {
		return err
	}
	if info.Code != 0 {
		return fmt.Errorf("/usr/bin/true exited %d in the rehearsal", info.Code)
	}
	return nil
}

func rehearsalPolicy(class manifest.Class) *manifest.Policy {
	p := manifest.Lower(&manifest.Manifest{Name: "rehearsal", Version: "0.0.0", Run: manifest.Run{Command: []string{"/usr/bin/true"}}})
	p.Containment = class
	return &p
}
