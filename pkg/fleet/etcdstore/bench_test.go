package etcdstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"roost.dev/roost/internal/etcdtest"
	"roost.dev/roost/pkg/fleet"
)

// BenchmarkCASPerCall is the fleet ledger's baseline: every admission one compare-and-swap on
// the day's hot granted key (read it, Txn on its revision, again on a lost race), against
// real members that fsync. It reports the Txn's latency (p50, p99) and admissions/s with 1 and
// 16 admitters, on 1 and 3 members; the escrow's blocks are measured against it.
func BenchmarkCASPerCall(b *testing.B) {
	for _, members := range []int{1, 3} {
		for _, admitters := range []int{1, 16} {
			b.Run(fmt.Sprintf("members=%d/admitters=%d", members, admitters), func(b *testing.B) {
				benchCAS(b, members, admitters)
			})
		}
	}
}

func benchCAS(b *testing.B, members, admitters int) {
	c := etcdtest.Start(b, etcdtest.Options{Members: members, Fsync: true})
	s := open(b, c.Endpoints())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const key = "bench/granted"
	var mu sync.Mutex
	var lat []time.Duration
	retries := 0
	admit := func() error {
		for {
			kvs, _, err := s.Get(ctx, key, false)
			if err != nil {
				return err
			}
			var rev int64
			n := 0
			if len(kvs) == 1 {
				rev, n = kvs[0].ModRevision, atoi(kvs[0].Value)
			}
			start := time.Now()
			ok, err := s.Txn(ctx, []fleet.Cmp{{Key: key, ModRevision: rev}}, []fleet.Op{{Key: key, Value: []byte(strconv.Itoa(n + 1))}})
			d := time.Since(start)
			if err != nil {
				return err
			}
			mu.Lock()
			lat = append(lat, d)
			if !ok {
				retries++
			}
			mu.Unlock()
			if ok {
				return nil
			}
		}
	}
	work := make(chan struct{})
	errc := make(chan error, admitters)
	b.ResetTimer()
	start := time.Now()
	for range admitters {
		go func() {
			for range work {
				if err := admit(); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range b.N {
		work <- struct{}{}
	}
	close(work)
	for range admitters {
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "admits/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "txn-p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "txn-p99-µs")
	b.ReportMetric(float64(retries)/float64(b.N), "lost-races/admit")
}

func atoi(b []byte) int {
	n, _ := strconv.Atoi(string(b))
	return n
}
