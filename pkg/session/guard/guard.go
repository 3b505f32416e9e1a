// Package guard measures, on a tick, what a running session holds on disk — its workdir,
// home and TMPDIR, and those of every child below it — and says when that is past
// resources.workdir_max_bytes or resources.workdir_max_inodes. It walks trees and reads
// the record; it stops nothing: the manager ends a session the guard reports.
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"roost.dev/roost/pkg/session/store"
	"roost.dev/roost/pkg/workdir"
)

// tries is how often one tick measures again a tree that changed deep down while it was
// being counted (workdir.ErrMoved) before it takes the change for an attack.
const tries = 3

// Trees says where a session's trees are.
type Trees struct {
	Home     func(id string) string
	Tmp      func(rec *store.Record) string // "" when the session has no TMPDIR of its own
	Children func(parentID string) string
	// List is every session the registry holds, for the descendants.
	List func() ([]*store.Record, error)
}

// Guard measures sessions' trees.
type Guard struct {
	Trees    Trees
	Interval time.Duration
	Logger   *slog.Logger
}

// Breach is the bound a session passed: Limit names it (store.LimitWorkdirBytes or
// store.LimitWorkdirInodes), Saw says what the guard saw, for the session's detail.
type Breach struct {
	Limit, Saw string
}

// Watch measures rec's trees (see Roots) every Interval until done closes or ctx ends (it
// then returns nil), and returns the first breach of lim. Each measurement's bytes go to
// measured. rec must not change while Watch reads it.
//
// The walk is workdir.Measure's: by descriptors, never following a link, allocated blocks
// and every inode, hard links once, each tree counted once however they nest, stopping as
// soon as either limit is passed. No path length, depth or link hides anything from it. A
// sealed session's /tmp is a tmpfs in its own mount namespace, bounded by size when it is
// mounted, so it needs no measuring here.
func (g Guard) Watch(ctx context.Context, done <-chan struct{}, rec *store.Record, lim workdir.Limits, canSpawn bool, measured func(bytes int64)) *Breach {
	ticker := time.NewTicker(g.Interval)
	defer ticker.Stop()
	warned := false
	for {
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		roots, what := g.Roots(rec, canSpawn)
		var used workdir.Usage
		var err error
		for try := 0; try < tries; try++ {
			if used, err = workdir.Measure(roots, lim); !errors.Is(err, workdir.ErrMoved) {
				break
			}
		}
		if err == nil || used.Bytes > 0 {
			measured(used.Bytes)
		}
		switch {
		case lim.Bytes > 0 && used.Bytes > lim.Bytes:
			return &Breach{store.LimitWorkdirBytes, fmt.Sprintf("%s grew to %d bytes, past resources.workdir_max_bytes (%d)", what, used.Bytes, lim.Bytes)}
		case lim.Inodes > 0 && used.Inodes > lim.Inodes:
			return &Breach{store.LimitWorkdirInodes, fmt.Sprintf("%s hold %d files and directories, past resources.workdir_max_inodes (%d)", what, used.Inodes, lim.Inodes)}
		case errors.Is(err, workdir.ErrMoved):
			// Only directories more than workdir.OpenLevels deep, moved again and again while
			// they are counted, do this: a tree that cannot be measured is not let grow.
			return &Breach{store.LimitWorkdirInodes, fmt.Sprintf("%s could not be measured: directories more than %d levels deep kept moving while roost counted them (%d tries), so resources.workdir_max_inodes (%d) cannot be held",
				what, workdir.OpenLevels, tries, lim.Inodes)}
		}
		if err != nil && !warned {
			// What could not be looked at (roostd, as root, can look at everything a
			// session can make); said once per session.
			warned = true
			g.Logger.Warn("workdir guard: part of the session's trees could not be measured", "session", rec.ID, "err", err)
		}
	}
}

// Roots lists the trees charged to the session and says, for its detail, what they are.
func (g Guard) Roots(rec *store.Record, canSpawn bool) ([]string, string) {
	t := g.Trees
	roots := []string{rec.Workdir, t.Home(rec.ID)}
	parts := []string{"workdir", "home"}
	if tmp := t.Tmp(rec); tmp != "" {
		roots = append(roots, tmp)
		parts = append(parts, "TMPDIR")
	}
	if canSpawn {
		// Where the children of a parent without a sealed root work (a sealed parent's work
		// beneath its workdir, and are counted there once: a root inside another is counted
		// as itself only).
		roots = append(roots, t.Children(rec.ID))
		recs, err := t.List()
		if err != nil {
			g.Logger.Warn("workdir guard: listing the session's children", "session", rec.ID, "err", err)
		}
		below := store.Descendants(recs, rec.ID)
		for _, d := range below {
			roots = append(roots, d.Workdir, t.Home(d.ID), t.Children(d.ID))
			if tmp := t.Tmp(d); tmp != "" {
				roots = append(roots, tmp)
			}
		}
		if len(below) > 0 {
			parts = append(parts, "children's workdirs")
		}
	}
	return roots, "the " + joinAnd(parts)
}

// joinAnd is "a", "a and b", "a, b and c".
func joinAnd(parts []string) string {
	if len(parts) < 2 {
		return strings.Join(parts, "")
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}
