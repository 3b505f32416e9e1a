package manifest

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestParseTokens(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "1": 1, "2000000": 2e6, "500k": 500e3, "2M": 2e6, "10M": 10e6, "3G": 3e9, "0k": 0,
		"9223372036G": 9223372036e9,
	} {
		if got, err := ParseTokens(in); err != nil || got != want {
			t.Errorf("ParseTokens(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for in, msg := range map[string]string{
		"": "expected a token count", "2m": "expected a token count", "2K": "expected a token count", "1.5M": "expected a token count",
		"-5": "expected a token count", "M": "expected a token count", " 2M": "expected a token count", "2 M": "expected a token count",
		"2T": "expected a token count", "2Mi": "Mi is a power of 1024", "64Ki": "Ki is a power of 1024", "1Gi": "Gi is a power of 1024",
		"9223372037G": "does not fit", "99999999999999999999": "does not fit",
	} {
		if _, err := ParseTokens(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseTokens(%q): %v, want an error saying %q", in, err, msg)
		}
	}
}

func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{"2M", "500k", "0", "1Gi", "1.5M", "", "9223372037G", "99999999999999999999k", "+5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseTokens(s)
		if err == nil && v < 0 {
			t.Fatalf("ParseTokens(%q) = %d with no error", s, v)
		}
		if err != nil && !errors.Is(err, ErrTokens) && !strings.Contains(err.Error(), "does not fit") {
			t.Fatalf("ParseTokens(%q): %v names neither the units nor the range", s, err)
		}
		// ParseInt also reads "+5", which is no count an operator writes: digits only.
		if n, perr := strconv.ParseInt(s, 10, 64); perr == nil && strings.TrimLeft(s, "0123456789") == "" && (err != nil || v != n) {
			t.Fatalf("ParseTokens(%q) = %d, %v; a plain number is itself", s, v, err)
		}
		// A count that reads is what its digits times its multiplier say.
		if err == nil && len(s) > 0 {
			for _, u := range tokenUnits {
				if n, ok := strings.CutSuffix(s, u.suffix); ok {
					if d, _ := strconv.ParseInt(n, 10, 64); d*u.factor != v {
						t.Fatalf("ParseTokens(%q) = %d, want %d×%d", s, v, d, u.factor)
					}
				}
			}
		}
	})
}
