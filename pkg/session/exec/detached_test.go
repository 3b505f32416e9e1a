package exec

import (
	"os"
	osexec "os/exec"
	"path/filepath"
	"testing"
	"time"

	"roost.dev/roost/pkg/containment"
)

// Each stream of a detached exec keeps a sixty-fourth of the session's cap, at least
// 64 KiB, never more than the cap itself.
func TestCapFor(t *testing.T) {
	for logMax, want := range map[int64]int64{0: 1 << 20, 64 << 20: 1 << 20, 1 << 20: 64 << 10, 16 << 10: 16 << 10, 1 << 30: 16 << 20} {
		if got := CapFor(logMax); got != want {
			t.Errorf("CapFor(%d) = %d, want %d", logMax, got, want)
		}
	}
}

// An id that is no exec's never names a path.
func TestCheckID(t *testing.T) {
	for _, id := range []string{"", "../exec_0123456789ab", "exec_0123456789ab/..", "exec_0123456789AB", "exec_0123456789a", "ses_0123456789ab"} {
		if CheckID(id) == nil {
			t.Errorf("CheckID(%q) took it", id)
		}
	}
	if err := CheckID(newID()); err != nil {
		t.Error(err)
	}
}

func writeTestRecord(t *testing.T, recordsDir string, rec Record) {
	t.Helper()
	dir := filepath.Join(recordsDir, Dir, rec.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeRecord(dir, rec); err != nil {
		t.Fatal(err)
	}
}

// A record left running by a roostd that died is lost once read: the mark is kept, and
// the process its pid and start time still name is killed.
func TestMarkLostEndsWhatIsLeft(t *testing.T) {
	recordsDir := t.TempDir()
	cmd := osexec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer cmd.Process.Kill()
	start, err := containment.StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	rec := Record{ID: newID(), Command: []string{"sleep", "1000"}, PID: cmd.Process.Pid, PIDStart: start, StartedAt: time.Now().UTC()}
	writeTestRecord(t, recordsDir, rec)
	// A pid whose start time is not the record's is not the command's: left alone.
	other := rec
	other.ID, other.PIDStart = newID(), start+1
	MarkLost(recordsDir, other)
	select {
	case <-exited:
		t.Fatal("MarkLost killed a process whose start time is not the record's")
	case <-time.After(100 * time.Millisecond):
	}
	got := MarkLost(recordsDir, rec)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("MarkLost left the command running")
	}
	again, err := ReadRecord(recordsDir, "ses_x", rec.ID)
	if err != nil || got.State() != Lost || again.State() != Lost || again.Code != nil {
		t.Fatalf("after MarkLost: %+v, on disk %+v (%v)", got, again, err)
	}
	if code, detail := EndDetail(again); code != 255 || detail == "" {
		t.Errorf("a lost exec's end: %d %q", code, detail)
	}
}

// The records keep every running exec and the MaxEnded newest ended ones, oldest first.
func TestPruneKeepsTheNewestEnded(t *testing.T) {
	recordsDir := t.TempDir()
	base := time.Now().UTC()
	var running []string
	for i := range MaxEnded + 10 {
		code := 0
		rec := Record{ID: newID(), StartedAt: base.Add(time.Duration(i) * time.Second), EndedAt: base.Add(time.Hour), Code: &code}
		if i%20 == 0 {
			rec.EndedAt, rec.Code = time.Time{}, nil
			running = append(running, rec.ID)
		}
		writeTestRecord(t, recordsDir, rec)
	}
	recs, err := ReadRecords(recordsDir)
	if err != nil || len(recs) != MaxEnded+10 {
		t.Fatalf("ReadRecords: %d records, %v", len(recs), err)
	}
	Prune(recordsDir, recs)
	kept, err := ReadRecords(recordsDir)
	if err != nil {
		t.Fatal(err)
	}
	ended, live := 0, map[string]bool{}
	for i, r := range kept {
		if i > 0 && r.StartedAt.Before(kept[i-1].StartedAt) {
			t.Errorf("records out of order at %d", i)
		}
		if r.State() == Running {
			live[r.ID] = true
		} else {
			ended++
		}
	}
	if ended != MaxEnded || len(live) != len(running) {
		t.Fatalf("kept %d ended and %d running, want %d and %d", ended, len(live), MaxEnded, len(running))
	}
	// The oldest ended went (the 1st to 6th made; the 0th runs): the 7th is next.
	if first := kept[1]; !first.StartedAt.Equal(base.Add(7 * time.Second)) {
		t.Errorf("the oldest ended record kept started at %s, want %s", first.StartedAt, base.Add(7*time.Second))
	}
}
