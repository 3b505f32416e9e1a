package session

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

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

// logPoll is how often a follower looks for new output while the session runs: output goes
// from roost-init straight to files, so there is nothing to be woken by.
const logPoll = 50 * time.Millisecond

// logCutsFile is where roostd notes the cuts it has reported, so each is reported once
// across restarts.
const logCutsFile = "logs.reported"

// CheckLogCuts reports, once per stream, a session's output first cut by
// resources.log_max_bytes (limit log_bytes) and first lost to a failed write (disk_full),
// as roost-init's logs.json counts them. Call it on the session's periodic guard tick
// while it runs, and once more when its end is recorded; it reads two small files.
func (m *Manager) CheckLogCuts(id, recordsDir string) {
	st, err := records.ReadLogStats(recordsDir)
	if err != nil {
		return
	}
	m.logCutsMu.Lock()
	defer m.logCutsMu.Unlock()
	path := filepath.Join(recordsDir, logCutsFile)
	reported := map[string]bool{}
	if data, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(data, &reported)
	}
	changed := false
	for _, name := range []string{records.Stdout, records.Stderr} {
		ss := st.Stream(name)
		if cut := ss.DroppedBytes - ss.FailedBytes; cut > 0 && !reported[name+" "+store.LimitLogBytes] {
			m.LimitHit(id, store.LimitLogBytes, fmt.Sprintf("%s past resources.log_max_bytes (%d): its first bytes and its newest are kept, %d of %d bytes dropped so far",
				name, st.MaxBytes, ss.DroppedBytes, ss.WrittenBytes))
			reported[name+" "+store.LimitLogBytes], changed = true, true
		}
		if ss.FailedBytes > 0 && !reported[name+" "+store.LimitDiskFull] {
			m.LimitHit(id, store.LimitDiskFull, fmt.Sprintf("%s: %d bytes of output lost to failed writes in the records directory: %s", name, ss.FailedBytes, ss.WriteError))
			reported[name+" "+store.LimitDiskFull], changed = true, true
		}
	}
	if !changed {
		return
	}
	data, _ := json.Marshal(reported)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err == nil {
		if err := os.Rename(tmp, path); err != nil {
			m.cfg.Logger.Warn("noting a reported log cut", "session", id, "err", err)
		}
	}
}
