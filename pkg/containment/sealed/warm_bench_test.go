package sealed

import "testing"

// BenchmarkFits is what a launch pays to learn whether its session fits a warm sandbox: a
// verdict kept for its policy.
func BenchmarkFits(b *testing.B) {
	rt := &Runtime{root: "/nonexistent", init: "/nonexistent"}
	shape := DefaultWarmShape()
	for b.Loop() {
		if err := rt.Fits(shape, shape.Policy, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFitsAfresh is the first launch of a policy: both specs built and compared.
func BenchmarkFitsAfresh(b *testing.B) {
	rt := &Runtime{root: "/nonexistent", init: "/nonexistent"}
	shape := DefaultWarmShape()
	for b.Loop() {
		if err := rt.fitsAfresh(shape, shape.Policy, false); err != nil {
			b.Fatal(err)
		}
	}
}
