package fleet

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"roost.dev/roost/pkg/ledger"
)

// BenchmarkAdmitSettle measures durable admit+settle pairs on one node, from 1 and 64
// concurrent clients: the single-host ledger under its machine ceiling, beside the same
// ledger as a fleet node admitting against the blocks it holds (plentiful here, so the
// store is met only to take a block now and then). pairs/s is the figure to compare: the
// fleet's hot path is the ledger's, with one more ceiling.
func BenchmarkAdmitSettle(b *testing.B) {
	for _, mode := range []string{"ledger", "fleet"} {
		for _, clients := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/clients=%d", mode, clients), func(b *testing.B) {
				dir := b.TempDir()
				cfg := ledger.Config{Path: filepath.Join(dir, ledger.File)}
				if mode == "ledger" {
					ceiling := int64(ledger.MaxTokens)
					cfg.MachineCeiling = &ceiling
				} else {
					cfg.Fleet = true
				}
				l, err := ledger.Open(cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				if mode == "fleet" {
					st := newMemStore()
					if err := SetCeiling(b.Context(), st, "", time.Now().UTC().Format(time.DateOnly), 1<<39); err != nil {
						b.Fatal(err)
					}
					n, err := Open(Config{Store: st, Node: "n1", StateDir: dir, Ledger: l, MinBlock: 1 << 20, MaxBlock: 1 << 30})
					if err != nil {
						b.Fatal(err)
					}
					defer n.Close()
					for n.Status().Held == 0 {
						time.Sleep(time.Millisecond)
					}
				}
				for c := range clients {
					if err := l.Register(ledger.Session{ID: fmt.Sprint("s", c), Capsule: "c"}); err != nil {
						b.Fatal(err)
					}
				}
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				began := time.Now()
				for c := range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						id := fmt.Sprint("s", c)
						for next.Add(1) <= int64(b.N) {
							r, err := l.Admit(ledger.Admission{SessionID: id, Tokens: 100})
							if err != nil {
								b.Error(err)
								return
							}
							if _, err := l.Settle(id, r.ID, ledger.Usage{Input: 10, Output: 20}); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "pairs/s")
			})
		}
	}
}
