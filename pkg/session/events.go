package session

import "context"

// eventPage bounds how many events one registry read returns while replaying.
const eventPage = 512

// Events sends every event with a sequence number above since, in order, each exactly once;
// with follow it then keeps sending events as they commit, until ctx ends. Events come from
// the registry, not from memory, so a client that reconnects with the last sequence it saw
// (even across a daemon restart) misses nothing and sees nothing twice.
func (m *Manager) Events(ctx context.Context, since uint64, follow bool, send func(Event) error) error {
	last := since
	for {
		changed := m.changed.wait()
		var page []Event
		if err := m.reg.View(func(tx *Tx) (err error) {
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
