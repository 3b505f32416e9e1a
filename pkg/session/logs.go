package session

import (
	"context"
	"fmt"
	"time"

	"roost.dev/roost/pkg/fdbudget"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"
)

// Logs sends the session's output as opts select. Without Follow it sends what
// exists and returns; with Follow it returns once the session has ended and all of its
// output has been sent. Each stream is its head, then its newest bytes; where
// resources.log_max_bytes dropped bytes between them a marker line says how many.
func (m *Manager) Logs(ctx context.Context, id string, opts records.LogOptions, send func(records.LogChunk) error) error {
	if err := opts.Check(); err != nil {
		return err
	}
	rec, err := m.Get(id)
	if err != nil {
		return err
	}
	// A reader holds a file of each stream open; a crowd of followers must not take the
	// descriptors sessions and the operator need.
	if b := m.cfg.Descriptors; b != nil {
		for range logFiles {
			slot, err := b.Acquire(fdbudget.Followers, fdbudget.Follower)
			if err != nil {
				return fmt.Errorf("the logs of %s: %w", id, err)
			}
			defer slot.Release()
		}
	}
	r, err := records.NewLogReader(rec.RecordsDir, opts, send)
	if err != nil {
		return err
	}
	defer r.Close()
	ticker := time.NewTicker(logPoll)
	defer ticker.Stop()
	for {
		changed := m.reg.changed.wait()
		// Read the state before draining: once a session is exited its files are complete,
		// so the drain after that read is the last one needed.
		cur, err := m.Get(rec.ID)
		if err != nil {
			return err
		}
		sent, err := r.Drain(send)
		if err != nil {
			return err
		}
		if !opts.Follow || cur.State == store.Exited {
			return nil
		}
		if sent {
			continue
		}
		select {
		case <-changed:
		case <-ticker.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// logFiles is how many files a log reader holds open at once: one per stream.
const logFiles = 2

// logPoll is how often a follower looks for new output while the session runs: output goes
// from roost-init straight to files, so there is nothing to be woken by.
const logPoll = 50 * time.Millisecond
