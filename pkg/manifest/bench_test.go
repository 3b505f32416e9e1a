package manifest

import (
	"os"
	"testing"
)

// BenchmarkParseAndLower reads the manifest reference example: parse, validate and lower.
func BenchmarkParseAndLower(b *testing.B) {
	data, err := os.ReadFile("testdata/full.yaml")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		m, err := Parse(data, "full.yaml")
		if err != nil {
			b.Fatal(err)
		}
		_ = Lower(m)
	}
}
