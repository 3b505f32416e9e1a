package session

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
	"time"
)

// guardWorkdir measures the session's workdir and home every GuardInterval and ends the
// session once together they have grown past its limit. The walk never follows a symlink and
// counts allocated blocks, so neither a link to a large tree nor a sparse file fools it.
func (m *Manager) guardWorkdir(l *liveSession, id string, dirs []string, limit int64, done <-chan struct{}) {
	defer m.wg.Done()
	ticker := time.NewTicker(m.cfg.GuardInterval)
	defer ticker.Stop()
	for {
		select {
		case <-done:
			return
		case <-m.ctx.Done():
			return
		case <-ticker.C:
		}
		var used int64
		for _, dir := range dirs {
			used += diskUsage(dir, limit-used)
		}
		if used <= limit {
			continue
		}
		saw := fmt.Sprintf("the workdir and home grew to %d bytes, past resources.workdir_max_bytes (%d)", used, limit)
		l.mu.Lock()
		err := m.beginStopSaying(l, id, EndWorkdir, saw, m.cfg.StopGrace)
		l.mu.Unlock()
		if err != nil {
			m.cfg.Logger.Error("workdir guard", "session", id, "err", err)
		}
		return
	}
}

// diskUsage adds up the blocks allocated under dir, stopping early once past stopAt.
func diskUsage(dir string, stopAt int64) int64 {
	var total int64
	errStop := fmt.Errorf("past the limit")
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		if total > stopAt {
			return errStop
		}
		return nil
	})
	return total
}
