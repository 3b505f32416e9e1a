package testenv

import (
	"errors"
	"strings"
	"testing"
)

// recorder is a testing.TB that notes how Need stopped it. The embedded TB is nil: Need
// calls nothing but the methods recorder has.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Fatalf(format string, args ...any) { r.fatal = format }
func (r *recorder) Skipf(format string, args ...any)  { r.skip = format }

func TestNeed(t *testing.T) {
	missing := errors.New("no such tool")
	for _, c := range []struct {
		ci          string
		err         error
		fatal, skip bool
	}{
		{"", missing, false, true},
		{"false", missing, false, true},
		{"0", missing, false, true},
		{"true", missing, true, false},
		{"1", missing, true, false},
		{"yes", missing, true, false},
		{"true", nil, false, false},
		{"", nil, false, false},
	} {
		t.Setenv("CI", c.ci)
		r := &recorder{}
		Need(r, "a tool", c.err)
		if (r.fatal != "") != c.fatal || (r.skip != "") != c.skip {
			t.Errorf("CI=%q err=%v: fatal %q, skip %q; want fatal %v, skip %v", c.ci, c.err, r.fatal, r.skip, c.fatal, c.skip)
		}
		if r.skip != "" && !strings.Contains(r.skip, "on CI this fails") {
			t.Errorf("the skip does not say CI would fail: %q", r.skip)
		}
	}
}
