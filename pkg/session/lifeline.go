package session

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"roost.dev/roost/pkg/session/delegate"
	"roost.dev/roost/pkg/session/store"

	"roost.dev/roost/pkg/workdir"
)

// CompletionFile is what a child leaves in its workdir when it ends, for its parent.
const CompletionFile = "completion.json"

// The lifeline: no session outlives its parent. When a session ends, for whatever reason,
// each of its live children is stopped and recorded terminated; their ends stop theirs in
// turn, so a whole subtree goes.

// lifeline stops the children of sessions that have ended.
type lifeline struct {
	reg  registry
	live *liveSet
	// ctx ends with the daemon; wg counts the stops under way.
	ctx context.Context
	wg  *sync.WaitGroup
	log *slog.Logger
	// stop ends a session whose parent ended (the manager's beginStop); the caller holds
	// l.mu.
	stop func(l *liveSession, id, saw string) error
}

// endChildren stops every live child of a session that has ended.
func (m lifeline) endChildren(parentID string) {
	kids, err := m.reg.childrenOf(parentID)
	if err != nil {
		m.log.Error("lifeline", "session", parentID, "err", err)
		return
	}
	for _, c := range kids {
		if !c.State.Live() {
			// A staged child is refused at launch: its parent is no longer live.
			continue
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.stopOrphan(c.ID, parentID)
		}()
	}
}

// stopOrphan stops a session whose parent has ended. A child still launching is stopped as
// soon as it runs.
func (m lifeline) stopOrphan(id, parentID string) {
	rec, err := m.reg.waitFor(m.ctx, id, func(r *store.Record) bool { return r.State != store.Launching })
	if err != nil || !rec.State.Live() {
		return
	}
	l := m.live.lookup(id)
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// No process yet: recovery has not re-attached it, and stops it once it has.
	if m.ctx.Err() != nil || l.proc == nil {
		return
	}
	saw := fmt.Sprintf("its parent %s ended", parentID)
	if err := m.stop(l, id, saw); err != nil {
		m.log.Error("lifeline", "session", id, "parent", parentID, "err", err)
	}
}

// stopOrphans stops, after a restart, live sessions whose parent ended while no daemon watched.
func (m lifeline) stopOrphans() error {
	recs, err := m.reg.all()
	if err != nil {
		return err
	}
	live := map[string]bool{}
	for _, r := range recs {
		live[r.ID] = r.State.Live()
	}
	for _, r := range recs {
		if r.ParentID != "" && r.State.Live() && !live[r.ParentID] {
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				m.stopOrphan(r.ID, r.ParentID)
			}()
		}
	}
	return nil
}

func anyLiveBelow(recs []*store.Record, root string) bool {
	return slices.ContainsFunc(store.Descendants(recs, root), func(r *store.Record) bool { return r.State.Live() })
}

// writeCompletion leaves the child's end in its workdir, written beneath it without
// following any link the child planted.
func writeCompletion(log *slog.Logger, rec *store.Record) {
	data, err := json.MarshalIndent(delegate.Completion(rec), "", "  ")
	if err != nil {
		return
	}
	if err := workdir.WriteFile(rec.Workdir, CompletionFile, append(data, '\n'), 0o644); err != nil {
		log.Warn("writing the completion", "session", rec.ID, "err", err)
	}
}
