package session

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/session/exec"
	"roost.dev/roost/pkg/session/store"
)

// registry is the manager's hold on the record (pkg/session/store): the reads the lifecycle
// shares, and writes that wake whoever waits for a change.
type registry struct {
	*store.Registry
	changed *notifier
}

var _ exec.Journal = registry{}

// update runs one registry transaction and wakes everyone waiting for a change once it has
// committed.
func (r registry) update(fn func(*store.Tx) error) error {
	events, err := r.Update(fn)
	if len(events) > 0 {
		r.changed.broadcast()
	}
	return err
}

// childrenOf lists a session's children.
func (r registry) childrenOf(parentID string) ([]*store.Record, error) {
	all, err := r.all()
	var out []*store.Record
	for _, rec := range all {
		if rec.ParentID == parentID {
			out = append(out, rec)
		}
	}
	return out, err
}

// manifest is the manifest the session was staged with, and its policy: the manifest's, with
// what stage lowered it to.
func (r registry) manifest(rec *store.Record) (*manifest.Manifest, *manifest.Policy, error) {
	var raw []byte
	if err := r.View(func(tx *store.Tx) (err error) {
		raw, err = tx.Manifest(rec.ID)
		return err
	}); err != nil {
		return nil, nil, err
	}
	man, err := manifest.Parse(raw, rec.Capsule.Source+"/"+manifest.FileName)
	if err != nil {
		return nil, nil, fmt.Errorf("session %s: its recorded manifest no longer parses: %w", rec.ID, err)
	}
	p := manifest.Lower(man)
	p.LowerCgroupMemory(rec.MemoryLimit)
	return man, &p, nil
}

// all lists every session the registry holds.
func (r registry) all() ([]*store.Record, error) {
	var recs []*store.Record
	err := r.View(func(tx *store.Tx) (err error) {
		recs, err = tx.List(nil)
		return err
	})
	return recs, err
}

// get reads a session by its exact id (never a name or a prefix).
func (r registry) get(id string) (*store.Record, error) {
	var rec *store.Record
	err := r.View(func(tx *store.Tx) (err error) {
		rec, err = tx.Get(id)
		return err
	})
	return rec, err
}

// Note adds an event about a session to the registry's log (exec.Journal).
func (r registry) Note(sessionID, eventType, detail string) error {
	return r.update(func(tx *store.Tx) error {
		rec, err := tx.Get(sessionID)
		if err != nil {
			return err
		}
		return tx.Note(rec, eventType, detail)
	})
}

// recordExited commits the session's end. An end is what roostd must not lose: when the
// state directory's disk is full it retries, with a growing pause, until space returns (or
// ctx ends: the next daemon records the end from exit.json).
func (r registry) recordExited(ctx context.Context, rec *store.Record, log *slog.Logger) error {
	was := rec.State
	pause := 100 * time.Millisecond
	for {
		err := r.update(func(tx *store.Tx) error { return tx.Transition(rec, store.Exited) })
		if err == nil || !store.IsNoSpace(err) {
			return err
		}
		// The transaction rolled back; the record in hand must say so again.
		rec.State = was
		log.Warn("recording an end: the state directory is full; retrying", "session", rec.ID, "in", pause)
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return err
		}
		pause = min(2*pause, 5*time.Second)
	}
}

// tree is the session id, as the registry has it now, and every session below it, each parent before
// its children.
func (r registry) tree(id string) ([]*store.Record, error) {
	recs, err := r.all()
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		if rec.ID == id {
			return append([]*store.Record{rec}, store.Descendants(recs, id)...), nil
		}
	}
	return nil, fmt.Errorf("no session %q: %w", id, errdefs.ErrNotFound)
}

// waitFor re-reads the session after every committed change until done accepts it.
func (r registry) waitFor(ctx context.Context, id string, done func(*store.Record) bool) (*store.Record, error) {
	for {
		changed := r.changed.wait()
		rec, err := r.get(id)
		if err != nil {
			return nil, err
		}
		if done(rec) {
			return rec, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// waitSubtree blocks until no descendant of the session is live.
func (r registry) waitSubtree(ctx context.Context, id string) error {
	for {
		changed := r.changed.wait()
		recs, err := r.all()
		if err != nil {
			return err
		}
		if !anyLiveBelow(recs, id) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// countByState counts sessions in each state.
func (r registry) countByState() map[store.State]int {
	var counts map[store.State]int
	_ = r.View(func(tx *store.Tx) error {
		counts = tx.CountByState()
		return nil
	})
	return counts
}

// parentGroup is the gid a child's workdir is given, so its parent can read it.
func (r registry) parentGroup(parentID string) (int, error) {
	parent, err := r.get(parentID)
	if err != nil {
		return 0, err
	}
	if parent.IDs == nil {
		return 0, nil
	}
	return int(parent.IDs.First), nil
}

// notifier wakes every waiter when the registry has changed. Waiters re-read what they need
// from the registry, so a wake-up carries no data and none can be lost or reordered.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func newNotifier() *notifier { return &notifier{ch: make(chan struct{})} }

// wait returns a channel closed by the next broadcast. Take it before reading the state it
// guards, so a change between the read and the wait is not missed.
func (n *notifier) wait() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ch
}

func (n *notifier) broadcast() {
	n.mu.Lock()
	close(n.ch)
	n.ch = make(chan struct{})
	n.mu.Unlock()
}
