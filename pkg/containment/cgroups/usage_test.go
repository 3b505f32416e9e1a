package cgroups

import (
	"math"
	"testing"
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
