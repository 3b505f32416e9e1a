package egress

import (
	"fmt"
	"io"
	"sync"
	"testing"
	"time"
)

// BenchmarkSharesTwoSessions: two sessions, each pulling a CONNECT tunnel as fast as it can
// for a second, at the default share and with the share lifted past what the machine moves
// (so the proxy's copy, the CPU and loopback are what they contend for). It reports each
// session's MB/s and the smaller over the larger: the issue asks for shares within 20 %.
func BenchmarkSharesTwoSessions(b *testing.B) {
	for _, c := range []struct {
		name  string
		share int64
	}{{"default", 0}, {"lifted", 1 << 40}} {
		b.Run(c.name, func(b *testing.B) {
			stream := streamServer(b)
			envs := []*env{
				newEnvLimits(b, permitLoopback(), []string{"web.test"}, Limits{BytesPerSec: c.share}),
				newEnvLimits(b, permitLoopback(), []string{"web.test"}, Limits{BytesPerSec: c.share}),
			}
			var worst float64 = 1
			var rates [2]float64
			for range b.N {
				var wg sync.WaitGroup
				var got [2]int64
				start := time.Now()
				for i, e := range envs {
					conn, br, res := e.connect(fmt.Sprintf("web.test:%d", stream))
					if res.StatusCode != 200 {
						b.Fatal(res.Status)
					}
					_, _ = conn.Write([]byte("g"))
					wg.Add(1)
					go func() {
						defer wg.Done()
						_ = conn.SetReadDeadline(start.Add(time.Second))
						got[i], _ = io.Copy(io.Discard, br)
						conn.Close()
					}()
				}
				wg.Wait()
				for i := range got {
					rates[i] = float64(got[i]) / 1e6
				}
				worst = min(worst, min(rates[0], rates[1])/max(rates[0], rates[1]))
			}
			b.ReportMetric(rates[0], "MB/s-a")
			b.ReportMetric(rates[1], "MB/s-b")
			b.ReportMetric(worst, "share-ratio")
		})
	}
}
