package spawn_test

import (
	"testing"

	"roost.dev/roost/pkg/manifest"
	"roost.dev/roost/pkg/spawn"
)

// BenchmarkReferee is the referee alone on a child that passes every axis (the slowest
// path: every check runs), parent and child both fully declared.
func BenchmarkReferee(b *testing.B) {
	full := `containment: sealed
network:
  allow: [example.com, "api.example.com:443", "https://cdn.example.com"]
  unix_sockets: true
shell:
  allow: [curl, cat, sed, git, make]
spawn:
  allow: [worker, reviewer]
env:
  allow: [LANG, TZ]
filesystem:
  scope: src
  workdir_exec: false
resources:
  cgroup_memory_bytes: 268435456
  max_open_files: 512
limits:
  deadline_seconds: 600
`
	pp := policyOf(b, full)
	cp := policyOf(b, full)
	parent := spawn.Parent{ID: "ses_parent", Policy: pp, Achieved: manifest.Sealed, DepthRemaining: 3}
	child := spawn.Child{Name: "worker", Ref: "worker@0.1.0", Policy: cp, Floor: manifest.Sealed}
	for b.Loop() {
		if err := spawn.Referee(parent, child, 4); err != nil {
			b.Fatal(err)
		}
	}
}
