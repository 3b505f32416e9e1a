package cli

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseEventsSince(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	rows := []struct {
		in  string
		seq uint64
		at  time.Time
		err string
	}{
		{in: "2026-04-30T10:00:00Z", at: time.Date(2026, 4, 30, 10, 0, 0, 0, time.UTC)},
		{in: "2026-04-30T10:00:00.25+02:00", at: time.Date(2026, 4, 30, 8, 0, 0, 250_000_000, time.UTC)},
		{in: "2026-04-30", at: time.Date(2026, 4, 30, 0, 0, 0, 0, time.Local)},
		{in: "1700000000.5", at: time.Unix(1700000000, 500_000_000)},
		{in: "1700000000.123456789", at: time.Unix(1700000000, 123456789)},
		{in: "1700000000.0", at: time.Unix(1700000000, 0)},
		{in: "10m", at: now.Add(-10 * time.Minute)},
		{in: "1h30m", at: now.Add(-90 * time.Minute)},
		{in: "0", seq: 0},
		{in: "1700000000", seq: 1700000000},
		{in: "42", seq: 42},
		{in: "18446744073709551616", err: "a sequence number is at most 18446744073709551615"},
		{in: "-10m", err: `--since "-10m": give a sequence number`},
		{in: "yesterday", err: `--since "yesterday": give a sequence number (a plain integer, as --after-seq), a time`},
		{in: "1700000000.", err: "Unix seconds with a fraction (1700000000.0)"},
		{in: "99999999999999999999.5", err: "--since"},
		{in: "", err: `--since "": give`},
	}
	for _, r := range rows {
		seq, at, err := parseEventsSince(r.in, now)
		if r.err != "" {
			if err == nil || !strings.Contains(err.Error(), r.err) || !isUsage(err) {
				t.Errorf("%q: err %v; want a usage error with %q", r.in, err, r.err)
			}
			continue
		}
		if err != nil || seq != r.seq || !at.Equal(r.at) {
			t.Errorf("%q: seq %d, time %v, err %v; want seq %d, time %v", r.in, seq, at, err, r.seq, r.at)
		}
	}
}

// TestTimeFlagUnixSeconds: logs --since and events --until take whole Unix seconds too.
func TestTimeFlagUnixSeconds(t *testing.T) {
	got, err := parseTimeFlag("--until", "1700000000", time.Now(), true)
	if err != nil || !got.Equal(time.Unix(1700000000, 0)) {
		t.Fatalf("--until 1700000000: %v, %v", got, err)
	}
	got, err = parseTimeFlag("--until", "-10m", time.Unix(1700000000, 0), true)
	if err != nil || !got.Equal(time.Unix(1700000600, 0)) {
		t.Fatalf("--until -10m: %v, %v", got, err)
	}
	if _, err := parseTimeFlag("--since", "-10m", time.Now(), false); err == nil || !strings.Contains(err.Error(), "--since") {
		t.Fatalf("logs --since -10m: %v", err)
	}
}

// FuzzSince: every --since is a sequence number exactly when it is all digits, a time that
// says the seconds it was given when it is Unix seconds, or a usage error naming the flag.
func FuzzSince(f *testing.F) {
	for _, s := range []string{"0", "42", "10m", "1h30m", "1700000000.5", "2026-04-30T10:00:00Z", "2026-04-30", "yesterday", "-1s", "9223372036854775807.9"} {
		f.Add(s)
	}
	now := time.Now()
	f.Fuzz(func(t *testing.T, s string) {
		seq, at, err := parseEventsSince(s, now)
		if err != nil {
			if !isUsage(err) || !strings.HasPrefix(err.Error(), "--since ") {
				t.Fatalf("%q: %v is not a usage error naming --since", s, err)
			}
			return
		}
		if plainInteger.MatchString(s) {
			if !at.IsZero() || strconv.FormatUint(seq, 10) != strings.TrimLeft(s, "0") && seq != 0 {
				t.Fatalf("%q: seq %d, time %v", s, seq, at)
			}
			return
		}
		if at.IsZero() || seq != 0 {
			t.Fatalf("%q: seq %d, time %v", s, seq, at)
		}
		if m := unixSeconds.FindStringSubmatch(s); m != nil {
			if secs, _ := strconv.ParseInt(m[1], 10, 64); at.Unix() != secs {
				t.Fatalf("%q: %v is %d Unix seconds", s, at, at.Unix())
			}
		}
	})
}
