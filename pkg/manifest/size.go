package manifest

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Sizes in bytes are written as whole numbers or, as Kubernetes writes quantities, with a
// unit: Ki, Mi, Gi, Ti, Pi, Ei are powers of 1024 (64Mi is 67,108,864), k, M, G, T, P, E
// powers of 1000 (4G is 4,000,000,000). Nothing else is guessed at: 64mb, 4g or 1.5Gi are
// refused naming the units there are, since docker's 4g (GiB) and a 4G (10^9) differ by 7 %.
var sizeUnits = []unit{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50}, {"Ei", 1 << 60},
	{"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"E", 1e18},
}

// ErrSize is a size that does not read.
var ErrSize = errors.New("expected a size in bytes: a whole number, or one with a unit (64Mi, 4Gi: powers of 1024; 64M, 4G: powers of 1000)")

// errZeroSize is a size of 0, which bounds nothing; where it is written says what to do
// instead.
var errZeroSize = errors.New("must be greater than 0")

// ParseSize reads a size in bytes (see sizeUnits); it must be above 0 and fit in 64 bits.
func ParseSize(s string) (int64, error) {
	v, err := scaled(s, sizeUnits)
	switch {
	case errors.Is(err, errNotANumber):
		return 0, fmt.Errorf("%w, got %q", ErrSize, s)
	case err != nil:
		return 0, fmt.Errorf("%q %w", s, err)
	}
	if v == 0 {
		return 0, fmt.Errorf("%w, got %q", errZeroSize, s)
	}
	return v, nil
}

// unit is a suffix and what it multiplies by.
type unit struct {
	suffix string
	factor int64
}

var (
	errNotANumber = errors.New("not a whole number with one of the units")
	errOverflow   = errors.New("does not fit in 64 bits")
)

// scaled reads digits followed by at most one of units' suffixes (the first that matches).
func scaled(s string, units []unit) (int64, error) {
	num, factor := s, int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, factor = n, u.factor
			break
		}
	}
	if num == "" || strings.TrimLeft(num, "0123456789") != "" {
		return 0, errNotANumber
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v > math.MaxInt64/factor {
		return 0, errOverflow
	}
	return v * factor, nil
}

// FormatSize writes a size as ParseSize reads it, in the largest unit that holds it exactly
// (1073741824 is 1Gi, 4000000000 is 4G, 1000 is 1k), so a refusal shows the figure as an
// operator would have typed it.
func FormatSize(n int64) string {
	suffix, factor := "", int64(1)
	for _, u := range sizeUnits {
		if n != 0 && n%u.factor == 0 && u.factor > factor {
			suffix, factor = u.suffix, u.factor
		}
	}
	return strconv.FormatInt(n/factor, 10) + suffix
}

// size reads a size in bytes: a whole number as positive reads it, or a string with a unit.
func (d *decoder) size(n *yaml.Node, path string) *int64 {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return d.positive(n, path)
	}
	v, err := ParseSize(n.Value)
	if errors.Is(err, errZeroSize) {
		d.fail(n, path, "%v (leave the key out for the default), got %q", errZeroSize, n.Value)
		return nil
	}
	if err != nil {
		d.fail(n, path, "%v", err)
		return nil
	}
	return &v
}
