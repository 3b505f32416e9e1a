package fleet_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet"
	"roost.dev/roost/pkg/fleet/etcdstore"
	"roost.dev/roost/pkg/ledger"
)

// BenchmarkEtcdAdmitSettle measures durable admit+settle pairs on one node, from 1 and 64
// clients: the single-host ledger under its machine ceiling, beside the same ledger as a
// fleet node on a 1-member etcd that fsyncs, with blocks plentiful (the store is met only
// to take a block now and then). pairs/s is the figure to compare.
func BenchmarkEtcdAdmitSettle(b *testing.B) {
	for _, mode := range []string{"ledger", "fleet-etcd"} {
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
				if mode == "fleet-etcd" {
					c := etcdtest.Start(b, etcdtest.Options{Fsync: true})
					st := etcdstore.FromClient(c.Client(b))
					if err := fleet.SetCeiling(b.Context(), st, "", time.Now().UTC().Format(time.DateOnly), 1<<39); err != nil {
						b.Fatal(err)
					}
					n, err := fleet.Open(fleet.Config{Store: st, Node: "n1", StateDir: dir, Ledger: l, MinBlock: 1 << 20, MaxBlock: 1 << 30})
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

// BenchmarkEtcdNearCeiling measures fleet-wide admissions/s with 10 nodes of 4 admitters on
// a 1-member etcd that fsyncs, each node with its own client. escrow: the fleet ledger, the
// ceiling b.N calls and a few more, blocks of one to four calls, so the pool is near empty
// throughout and a node takes a block every few admissions; every admission is charged in
// full (one call's worst case), and the run ends when b.N of them settled. txn-per-call:
// the baseline, every admission one compare-and-swap of the day's granted key against the
// ceiling (read it, Txn on its revision, again on a lost race), nothing written locally.
func BenchmarkEtcdNearCeiling(b *testing.B) {
	b.Run("escrow", benchEscrowNearCeiling)
	b.Run("txn-per-call", benchTxnPerCall)
}

const nearNodes, nearAdmitters, nearCall = 10, 4, 1000

func benchEscrowNearCeiling(b *testing.B) {
	const nodes, admitters, call = nearNodes, nearAdmitters, nearCall
	c := etcdtest.Start(b, etcdtest.Options{Fsync: true})
	admin := etcdstore.FromClient(c.Client(b))
	day := time.Now().UTC().Format(time.DateOnly)
	// The fleet's blocks are not multiples of a call: each node may strand under a call.
	if err := fleet.SetCeiling(b.Context(), admin, "", day, int64(b.N+2*nodes)*call); err != nil {
		b.Fatal(err)
	}
	leds := make([]*ledger.Ledger, nodes)
	for i := range nodes {
		dir := b.TempDir()
		l, err := ledger.Open(ledger.Config{Path: filepath.Join(dir, ledger.File), Fleet: true})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		st := etcdstore.FromClient(c.Client(b))
		n, err := fleet.Open(fleet.Config{Store: st, Node: fmt.Sprint("n", i), StateDir: dir, Ledger: l,
			MinBlock: call, MaxBlock: 4 * call, Share: nodes, IdleAfter: time.Hour, Tick: 10 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		defer n.Close()
		for a := range admitters {
			if err := l.Register(ledger.Session{ID: fmt.Sprint("s", a), Capsule: "c"}); err != nil {
				b.Fatal(err)
			}
		}
		leds[i] = l
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	began := time.Now()
	for _, l := range leds {
		for a := range admitters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprint("s", a)
				for ctx.Err() == nil {
					changed := l.Changed()
					r, err := l.Admit(ledger.Admission{SessionID: id, Tokens: call})
					if err != nil {
						refused.Add(1)
						select {
						case <-changed:
						case <-ctx.Done():
						case <-time.After(10 * time.Millisecond):
						}
						continue
					}
					if _, err := l.Settle(id, r.ID, ledger.Usage{Output: call}); err != nil {
						b.Error(err)
						return
					}
					if admitted.Add(1) >= int64(b.N) {
						cancel()
					}
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(began)
	b.StopTimer()
	b.ReportMetric(float64(admitted.Load())/elapsed.Seconds(), "admits/s")
	b.ReportMetric(float64(refused.Load())/float64(admitted.Load()), "refusals/admit")
}

func benchTxnPerCall(b *testing.B) {
	const nodes, admitters, call = nearNodes, nearAdmitters, nearCall
	c := etcdtest.Start(b, etcdtest.Options{Fsync: true})
	key := fleet.DefaultPrefix + "bench/granted"
	ceiling := int64(b.N) * call
	var admitted, contended atomic.Int64
	var wg sync.WaitGroup
	stores := make([]fleet.Store, nodes)
	for i := range stores {
		stores[i] = etcdstore.FromClient(c.Client(b))
	}
	b.ResetTimer()
	began := time.Now()
	for _, st := range stores {
		for range admitters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					kvs, _, err := st.Get(b.Context(), key, false)
					if err != nil {
						b.Error(err)
						return
					}
					var granted, rev int64
					if len(kvs) == 1 {
						rev = kvs[0].ModRevision
						if granted, err = strconv.ParseInt(string(kvs[0].Value), 10, 64); err != nil {
							b.Error(err)
							return
						}
					}
					if granted+call > ceiling {
						return
					}
					ok, err := st.Txn(b.Context(), []fleet.Cmp{{Key: key, ModRevision: rev}},
						[]fleet.Op{{Key: key, Value: []byte(strconv.FormatInt(granted+call, 10))}})
					if err != nil {
						b.Error(err)
						return
					}
					if ok {
						admitted.Add(1)
					} else {
						contended.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(began)
	b.StopTimer()
	b.ReportMetric(float64(admitted.Load())/elapsed.Seconds(), "admits/s")
	b.ReportMetric(float64(contended.Load())/float64(max(admitted.Load(), 1)), "retries/admit")
}
