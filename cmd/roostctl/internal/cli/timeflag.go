package cli

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"
)

// Time flags (logs --since, events --since and --until) read times as docker does: an RFC
// 3339 time (or its date forms, in local time), Unix seconds, or a duration counted back
// from now.

// unixSeconds is a time given as seconds since the epoch, with a fraction or without.
var unixSeconds = regexp.MustCompile(`^([0-9]+)(?:\.([0-9]+))?$`)

// plainInteger is an events --since that is a sequence number.
var plainInteger = regexp.MustCompile(`^[0-9]+$`)

// maxUnixSeconds is the end of year 9999, the last second RFC 3339 can write: past it
// time.Unix would overflow into the distant past.
var maxUnixSeconds = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC).Unix()

// timeFlagForms says what parseTimeFlag takes, for its errors.
const timeFlagForms = "a time (2006-01-02T15:04:05Z07:00, or 2006-01-02 in local time), Unix seconds, or a duration before now (10m)"

// sinceForms says what events --since takes, for its errors.
const sinceForms = "a sequence number (a plain integer, as --after-seq), a time (2006-01-02T15:04:05Z07:00, or 2006-01-02 in local time), Unix seconds with a fraction (1700000000.0), or a duration before now (10m)"

// parseTime reads s as a time flag; ok is false when s is none of the forms. A negative
// duration, a time still to come, only where future says the flag can mean one (events
// --until).
func parseTime(s string, now time.Time, future bool) (t time.Time, ok bool) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			return t, true
		}
	}
	if m := unixSeconds.FindStringSubmatch(s); m != nil {
		// Whole seconds and the fraction apart: a float64 would lose the nanoseconds.
		secs, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil || secs > maxUnixSeconds {
			return time.Time{}, false
		}
		nanos, _ := strconv.ParseInt((m[2] + "000000000")[:9], 10, 64)
		return time.Unix(secs, nanos), true
	}
	if d, err := time.ParseDuration(s); err == nil && (d >= 0 || future) {
		return now.Add(-d), true
	}
	return time.Time{}, false
}

// parseTimeFlag reads a time flag, or says which forms it takes.
func parseTimeFlag(flag, s string, now time.Time, future bool) (time.Time, error) {
	if t, ok := parseTime(s, now, future); ok {
		return t, nil
	}
	forms := timeFlagForms
	if future {
		forms += "; -10m is ten minutes from now"
	}
	return time.Time{}, usageError{fmt.Errorf("%s %q: give %s", flag, s, forms)}
}

// parseEventsSince reads events --since: a time, or a sequence number. A plain integer is
// a sequence number, as --since meant before it took times, so that scripts resuming after
// an event keep working; Unix seconds need a fraction there to be told from one.
func parseEventsSince(s string, now time.Time) (seq uint64, at time.Time, err error) {
	if plainInteger.MatchString(s) {
		seq, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, time.Time{}, usageError{fmt.Errorf("--since %q: a sequence number is at most %d", s, uint64(math.MaxUint64))}
		}
		return seq, time.Time{}, nil
	}
	if t, ok := parseTime(s, now, false); ok {
		return 0, t, nil
	}
	return 0, time.Time{}, usageError{fmt.Errorf("--since %q: give %s", s, sinceForms)}
}
