package resolver_test

import (
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/time/rate"

	"roost.dev/roost/pkg/resolver"
)

// BenchmarkQuery is one query and its reply over a real loopback UDP socket, one at a time
// as a program's lookups go: ns/op is the latency per query, queries/s what one client
// gets answered. The bucket is lifted, so this measures the resolver, not its bound.
func BenchmarkQuery(b *testing.B) {
	for _, bc := range []struct {
		name, qname string
		typ         dnsmessage.Type
	}{
		{"covered", "api.example.test.", dnsmessage.TypeA},
		{"nxdomain", "elsewhere.test.", dnsmessage.TypeAAAA},
	} {
		b.Run(bc.name, func(b *testing.B) {
			_, c := serve(b, resolver.Config{Covers: coversOf(b, "api.example.test", "*.more.test"), Rate: rate.Inf})
			msg := query(b, 1, 0, bc.qname, bc.typ, dnsmessage.ClassINET)
			buf := make([]byte, 512)
			c.SetDeadline(time.Now().Add(time.Minute))
			start := time.Now()
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := c.Read(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "queries/s")
		})
	}
}
