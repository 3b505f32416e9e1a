package ledger

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkAdmitSettle measures durable admit+settle pairs (each fsynced before it returns)
// from 1, 8 and 64 concurrent clients: committed as roostd does (group), through bbolt's
// Batch, and with one transaction per operation, for comparison. pairs/s is the figure docs/performance.md quotes.
func BenchmarkAdmitSettle(b *testing.B) {
	for _, mode := range []CommitMode{CommitGroup, CommitBoltBatch, CommitTxPerOp} {
		name := string(mode)
		if mode == CommitGroup {
			name = "group"
		}
		for _, clients := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("%s/clients=%d", name, clients), func(b *testing.B) {
				l, err := Open(Config{Path: filepath.Join(b.TempDir(), File), Commit: mode, MachineCeiling: ptr(MaxTokens)})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				for c := range clients {
					register(b, l, fmt.Sprint("s", c), "", 0)
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
							r, err := l.Admit(Admission{SessionID: id, Tokens: 100})
							if err != nil {
								b.Error(err)
								return
							}
							if _, err := l.Settle(id, r.ID, Usage{Input: 10, Output: 20}); err != nil {
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
