package session

import (
	"context"

	"roost.dev/roost/pkg/session/store"
)

// eventPage bounds how many events one registry read returns while replaying.
const eventPage = 512

// Events sends every event with a sequence number above since, in order, each exactly once;
// with follow it then keeps sending events as they commit, until ctx ends. Events come from
// the registry, not from memory, so a client that reconnects with the last sequence it saw
// (even across a daemon restart) misses nothing and sees nothing twice. Events compaction
// has deleted (retention, prune) are never skipped in silence: a since before the log's
// window, or a reader the window has moved past, fails with a *CompactedError
// (FailedPrecondition) naming the oldest event kept.
// OldestKeptEvent is the sequence number just before the oldest event the log keeps: what
// Events takes to replay everything there is.
func (m *Manager) OldestKeptEvent() uint64 {
	var through uint64
	_ = m.reg.View(func(tx *store.Tx) error {
		through = tx.Compaction().Through
		return nil
	})
	return through
}

func (m *Manager) Events(ctx context.Context, since uint64, follow bool, send func(store.Event) error) error {
	last := since
	for {
		changed := m.reg.changed.wait()
		var page []store.Event
		if err := m.reg.View(func(tx *store.Tx) (err error) {
			page, err = tx.EventsSince(last, eventPage)
			return err
		}); err != nil {
			return err
		}
		for _, ev := range page {
			if err := send(ev); err != nil {
				return err
			}
			last = ev.Seq
		}
		if len(page) == eventPage {
			continue
		}
		if !follow {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
