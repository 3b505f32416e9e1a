package containment

import (
	"context"
	"math"
	"syscall"
	"testing"

	"roost.dev/roost/pkg/manifest"
)

func TestUsageCeiling(t *testing.T) {
	for in, want := range map[uint64]int64{
		0:                     0,
		77:                    77,
		64 << 20:              64 << 20,
		math.MaxUint64:        0, // v2 "max"
		0x7FFFFFFFFFFFF000:    0, // v1 "unlimited", 4 KiB pages
		0x7FFFFFFFFFFF0000:    0, // v1 "unlimited", 64 KiB pages
		uint64(1) << 61:       1 << 61,
		uint64(math.MaxInt64): 0,
	} {
		if got := ceiling(in); got != want {
			t.Errorf("ceiling(%#x) = %d, want %d", in, got, want)
		}
	}
}

// A scoped or sealed session's usage carries its cgroup's ceilings, the ones its manifest
// declared; an advisory session's cgroup holds none, and says 0.
func TestUsageLimits(t *testing.T) {
	needRoot(t)
	state := reachableDir(t)
	c := testCgroups(t, state)
	scoped, err := NewScopedRuntime(state, staticInit(t), testIDs(), WithCgroups(c))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := NewSealedRuntime(state, staticInit(t), testIDs(), WithCgroups(c))
	if err != nil {
		t.Fatal(err)
	}
	advisory := NewProcessRuntime(SelfInit, WithCgroups(c))
	const mem = 96 << 20
	for _, tc := range []struct {
		class manifest.Class
		rt    interface {
			Start(context.Context, Spec) (Process, error)
		}
		mem, pids int64
	}{{manifest.Scoped, scoped, mem, 77}, {manifest.Sealed, sealed, mem, 77}, {manifest.Advisory, advisory, 0, 0}} {
		t.Run(tc.class.String(), func(t *testing.T) {
			s := spec(t, "/bin/sh", "-c", "echo ready; sleep 30")
			s.SessionID = "ses_usage_" + tc.class.String()
			s.Class = tc.class
			if tc.class != manifest.Advisory {
				s.Policy = sealedPolicy(t, "capabilities: {containment: "+tc.class.String()+", shell: {allow: [sleep]}, resources: {cgroup_pids_max: 77, cgroup_memory_bytes: 100663296}}")
				s.CapsuleDir = t.TempDir()
			}
			if tc.class == manifest.Sealed {
				s.Env = []string{"PATH=/usr/bin:/bin", "HOME=/work"}
			}
			p, err := tc.rt.Start(context.Background(), s)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Signal(syscall.SIGKILL) })
			waitOutput(t, s, "ready")
			u, err := p.(Meter).Usage()
			if err != nil {
				t.Fatal(err)
			}
			if u.MemoryLimitBytes != tc.mem || u.PidsLimit != tc.pids {
				t.Errorf("limits: memory %d, pids %d; want %d, %d", u.MemoryLimitBytes, u.PidsLimit, tc.mem, tc.pids)
			}
			if u.MemoryBytes <= 0 || u.Pids < 1 {
				t.Errorf("counters: %+v", u)
			}
			killAndWait(t, p)
		})
	}
}
