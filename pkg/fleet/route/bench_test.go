package route

import (
	"slices"
	"testing"
	"time"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// BenchmarkGet is one Get about a session on node-b: asked of node-b itself, and asked of
// node-a, which forwards it over its kept connection to node-b. Both go through a remote
// listener (gRPC over TLS 1.3 on loopback); routed adds a second one.
func BenchmarkGet(b *testing.B) {
	c := newCluster(b, "node-a", "node-b")
	c.place("s-b", "node-b")
	for _, bc := range []struct{ name, via string }{{"direct", "node-b"}, {"routed", "node-a"}} {
		b.Run(bc.name, func(b *testing.B) {
			client := c.sessionClient(b, bc.via, "ci-bot")
			ctx := testCtx(b)
			if _, err := client.Get(ctx, &roostv1.GetRequest{Id: "s-b"}); err != nil {
				b.Fatal(err)
			}
			var took []time.Duration
			for b.Loop() {
				start := time.Now()
				if _, err := client.Get(ctx, &roostv1.GetRequest{Id: "s-b"}); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
		})
	}
}
