package store

import "testing"

// An ended record's labels: oom split from crashed by the detail outcome gives it, and the
// floor standing in for a class never achieved.
func TestRecordEndLabels(t *testing.T) {
	rows := []struct {
		rec           Record
		class, status string
	}{
		{Record{Achieved: "sealed", Declared: "scoped", ExitStatus: StatusCrashed, Detail: DetailOOM}, "sealed", "oom"},
		{Record{Achieved: "sealed", ExitStatus: StatusCrashed, Detail: "killed by SIGSEGV"}, "sealed", "crashed"},
		{Record{Declared: "scoped", ExitStatus: StatusStartFailed}, "scoped", "start_failed"},
		{Record{Achieved: "advisory", ExitStatus: StatusDeadlineReached}, "advisory", "deadline_reached"},
	}
	for _, r := range rows {
		if c, s := r.rec.EndClass(), r.rec.EndStatus(); c != r.class || s != r.status {
			t.Errorf("%+v: %s/%s, want %s/%s", r.rec, c, s, r.class, r.status)
		}
	}
}
