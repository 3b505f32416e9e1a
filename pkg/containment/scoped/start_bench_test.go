package scoped_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/manifest"
)

// BenchmarkScopedStart is a scoped session of /usr/bin/true from Start to its recorded end
// and its cgroup and TMPDIR released: the class's start, which its namespaces must not slow
// by more than 5%. start-ns/op is Start alone: until roost-init reports the program running.
func BenchmarkScopedStart(b *testing.B) {
	testkit.NeedRoot(b)
	rt, err := kit.NewScopedRuntime(testkit.ReachableDir(b), kit.Init(b), kit.IDs())
	if err != nil {
		b.Fatal(err)
	}
	policy := testkit.Policy(b, "capabilities: {containment: scoped}")
	capsule := testkit.ReachableDir(b)
	i := 0
	var started time.Duration
	for b.Loop() {
		b.StopTimer()
		s := kit.Spec(b, "/usr/bin/true")
		s.SessionID = fmt.Sprintf("ses_bench_%d", i)
		i++
		s.Class = manifest.Scoped
		s.Policy = policy
		s.CapsuleDir = capsule
		b.StartTimer()
		t0 := time.Now()
		p, err := rt.Start(context.Background(), s)
		if err != nil {
			b.Fatal(err)
		}
		started += time.Since(t0)
		<-p.Done()
		if info, err := p.Exit(); err != nil || info.Code != 0 || info.StartError != "" {
			b.Fatalf("exit %+v %v", info, err)
		}
		if err := rt.Release(s.SessionID); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(started.Nanoseconds())/float64(i), "start-ns/op")
}
