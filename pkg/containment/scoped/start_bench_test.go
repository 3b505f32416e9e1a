package scoped_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/containment/sysview"
	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/toolchain"
)

// BenchmarkScopedStart is a scoped session of /usr/bin/true from Start to its recorded end
// and its cgroup and TMPDIR released: the class's start, which its namespaces must not slow
// by more than 5%. start-ns/op is Start alone: until roost-init reports the program running.
// The sub-benchmarks give it all of the system trees (filesystem.system: full), its own
// closure, and the closure of @shell @python @git: one Landlock read rule per file of it.
func BenchmarkScopedStart(b *testing.B) {
	testkit.NeedRoot(b)
	for _, c := range []struct {
		name  string
		allow []string
		full  bool
	}{{"system=full", nil, true}, {"system=allowlist", nil, false}, {"system=allowlist_shell_python_git", []string{"@shell", "@python", "@git"}, false}} {
		b.Run(c.name, func(b *testing.B) { benchScopedStart(b, c.allow, c.full) })
	}
}

func benchScopedStart(b *testing.B, allow []string, full bool) {
	rt, err := kit.NewScopedRuntime(testkit.ReachableDir(b), kit.Init(b), kit.IDs())
	if err != nil {
		b.Fatal(err)
	}
	policy := testkit.Policy(b, "capabilities: {containment: scoped}")
	var view *containment.SystemView
	var exec, trees []string
	if !full {
		entries, err := toolchain.NewResolver().Resolve(allow, "", "")
		if err != nil {
			b.Fatal(err)
		}
		w := sysview.Want{Files: []string{"/usr/bin/true"}}
		exec = []string{}
		for _, e := range entries {
			w.Files = append(w.Files, e.Files...)
			w.ExecTrees = append(w.ExecTrees, e.Trees...)
			w.ReadTrees = append(w.ReadTrees, e.ReadTrees...)
			exec = append(exec, e.Files...)
			trees = append(trees, e.Trees...)
		}
		c, err := sysview.Resolve(w, sysview.Options{})
		if err != nil {
			b.Fatal(err)
		}
		view = &containment.SystemView{Files: c.Files, Trees: c.Trees, Digest: c.Digest}
	}
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
		s.System, s.Exec, s.ExecTrees = view, exec, trees
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
	if view != nil {
		b.ReportMetric(float64(len(view.Files)), "files")
	}
}
