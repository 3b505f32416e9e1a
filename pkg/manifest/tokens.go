package manifest

import (
	"errors"
	"fmt"
	"strings"
)

// Token counts are written as whole numbers or with an SI multiplier: k is 1000, M 10^6, G
// 10^9 (2M is 2,000,000). A token is not a byte, so the binary units sizes take (Ki, Mi,
// Gi) are refused saying so, rather than read as a count 2.4 % or 7 % off what was meant.
var tokenUnits = []unit{{"k", 1e3}, {"M", 1e6}, {"G", 1e9}}

// ErrTokens is a token count that does not read.
var ErrTokens = errors.New("expected a token count: a whole number, or one with k (10^3), M (10^6) or G (10^9), as in 500k or 2M")

// ParseTokens reads a token count (see tokenUnits); it must be 0 or more and fit in 64 bits.
// Its errors do not repeat s: the caller names where it was written, and it.
func ParseTokens(s string) (int64, error) {
	for _, b := range []string{"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"} {
		if strings.HasSuffix(s, b) {
			return 0, fmt.Errorf("%w: %s is a power of 1024, for sizes in bytes; tokens are counted in powers of 1000", ErrTokens, b)
		}
	}
	v, err := scaled(s, tokenUnits)
	if errors.Is(err, errNotANumber) {
		return 0, ErrTokens
	}
	return v, err
}
