package ledger

import (
	"sync"

	bolt "go.etcd.io/bbolt"
)

// groupCommit commits writes in batches without waiting on a timer: one goroutine commits
// whatever is queued, and everything that arrives while that commit (and its fsync) is under
// way goes into the next. A lone writer commits at once; a crowd shares each fsync.
//
// bbolt's own Batch cuts a batch every MaxBatchDelay instead, so under load several small
// batches queue behind the write lock and each pays its own fsync (see BenchmarkAdmitSettle).
//
// As with Batch, a function may run more than once: when one function of a batch fails, the
// transaction is rolled back and the others are committed again one by one. The ledger's
// functions only write what they were given, and skip a charge already recorded.
type groupCommit struct {
	db *bolt.DB

	mu      sync.Mutex
	queue   []pending
	running bool
}

type pending struct {
	fn   func(*bolt.Tx) error
	done chan error
}

func (g *groupCommit) commit(fn func(*bolt.Tx) error) error {
	done := make(chan error, 1)
	g.mu.Lock()
	g.queue = append(g.queue, pending{fn, done})
	if !g.running {
		g.running = true
		go g.run()
	}
	g.mu.Unlock()
	return <-done
}

// run commits batches until the queue is empty.
func (g *groupCommit) run() {
	for {
		g.mu.Lock()
		batch := g.queue
		g.queue = nil
		if len(batch) == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		g.commitBatch(batch)
	}
}

func (g *groupCommit) commitBatch(batch []pending) {
	failed := -1
	err := g.db.Update(func(tx *bolt.Tx) error {
		for i, p := range batch {
			if err := p.fn(tx); err != nil {
				failed = i
				return err
			}
		}
		return nil
	})
	if err == nil || failed < 0 || len(batch) == 1 {
		for _, p := range batch {
			p.done <- err
		}
		return
	}
	// One function failed: it alone gets its error; the rest commit on their own.
	batch[failed].done <- err
	for i, p := range batch {
		if i != failed {
			p.done <- g.db.Update(p.fn)
		}
	}
}
