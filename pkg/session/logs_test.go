package session

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"roost.dev/roost/pkg/fdbudget"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session/store"
)

func appendFile(t *testing.T, path, data string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
}

func TestLogsCapThroughTheManager(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, `seq 1 200000; echo done >&2`, "capabilities:\n  resources:\n    log_max_bytes: 65536\n")})
	rec = waitEnd(t, m, rec.ID)
	out, errOut := logs(t, m, rec.ID)
	total := int64(len(seqText(200000)))
	if !strings.HasPrefix(out, "1\n2\n3\n") || !strings.HasSuffix(out, "\n200000\n") || errOut != "done\n" {
		t.Fatalf("stdout %.40q...%q, stderr %q", out, out[max(0, len(out)-20):], errOut)
	}
	if n := strings.Count(out, "--- roost: "); n != 1 || !strings.Contains(out, " bytes of stdout dropped here (resources.log_max_bytes 65536) ---\n") {
		t.Fatalf("%d markers", n)
	}
	st := LogStats(rec)
	if st == nil || st.Stdout.WrittenBytes != total || st.MaxBytes != 65536 || st.Stdout.DroppedBytes < total-65536 ||
		st.Stderr.WrittenBytes != 5 || st.Stderr.DroppedBytes != 0 {
		t.Fatalf("stats %+v", st)
	}
	for range 3 {
		m.journal.logCuts(rec.ID, rec.RecordsDir)
	}
	var details []string
	m.Events(context.Background(), 0, false, func(ev store.Event) error {
		if ev.Type == store.EventLimit && ev.SessionID == rec.ID {
			details = append(details, ev.Detail)
		}
		return nil
	})
	if len(details) != 1 || !strings.HasPrefix(details[0], "log_bytes: stdout past resources.log_max_bytes (65536)") {
		t.Fatalf("limit events %q", details)
	}
}

func seqText(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.String()
}

func TestLogsOptionsThroughTheManager(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, `echo one; sleep 0.3; echo two; sleep 0.3; echo three; echo err >&2`, "")})
	rec = waitEnd(t, m, rec.ID)
	get := func(opts records.LogOptions) []records.LogChunk {
		t.Helper()
		var out []records.LogChunk
		if err := m.Logs(context.Background(), rec.ID, opts, func(c records.LogChunk) error {
			if c.Stream == records.Stdout {
				out = append(out, records.LogChunk{Stream: c.Stream, Data: slices.Clone(c.Data), Offset: c.Offset, Time: c.Time})
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	text := func(cs []records.LogChunk) string {
		var b strings.Builder
		for _, c := range cs {
			b.Write(c.Data)
		}
		return b.String()
	}
	timed := get(records.LogOptions{Timestamps: true})
	if text(timed) != "one\ntwo\nthree\n" || len(timed) != 3 {
		t.Fatalf("timed chunks %+v", timed)
	}
	// A time is when roost-init read the bytes, the end when it saw the program exit: the
	// last read can come a scheduler's moment after that.
	const slack = 200 * time.Millisecond
	for i, c := range timed {
		if c.Time.Before(rec.StartedAt.Add(-slack)) || c.Time.After(rec.EndedAt.Add(slack)) {
			t.Fatalf("chunk %d at %s, outside the run %s..%s", i, c.Time, rec.StartedAt, rec.EndedAt)
		}
		if i > 0 && c.Time.Sub(timed[i-1].Time) < 250*time.Millisecond {
			t.Fatalf("chunk %d at %s, %s after the one before", i, c.Time, c.Time.Sub(timed[i-1].Time))
		}
	}
	if got := get(records.LogOptions{}); len(got) != 1 || !got[0].Time.IsZero() || got[0].Offset != 0 {
		t.Fatalf("without timestamps %+v", got)
	}
	two := int64(2)
	if got := text(get(records.LogOptions{Tail: &two})); got != "two\nthree\n" {
		t.Fatalf("tail 2: %q", got)
	}
	if got := text(get(records.LogOptions{Since: timed[1].Time.Add(-100 * time.Millisecond)})); got != "two\nthree\n" {
		t.Fatalf("since before two: %q", got)
	}
	if got := text(get(records.LogOptions{StdoutOffset: 4})); got != "two\nthree\n" {
		t.Fatalf("from 4: %q", got)
	}
	// Following with a tail says first where each stream begins.
	var first []records.LogChunk
	m.Logs(context.Background(), rec.ID, records.LogOptions{Follow: true, Tail: &two}, func(c records.LogChunk) error {
		first = append(first, c)
		return nil
	})
	if len(first) < 3 || len(first[0].Data) != 0 || first[0].Offset != 4 || first[0].Stream != records.Stdout || first[1].Stream != records.Stdout || first[1].Offset != 4 {
		t.Fatalf("follow with tail begins %+v", first[:min(2, len(first))])
	}
	neg := int64(-1)
	if err := m.Logs(context.Background(), rec.ID, records.LogOptions{Tail: &neg}, func(records.LogChunk) error { return nil }); err == nil {
		t.Fatal("a negative tail was taken")
	}
}

func TestLogsTailStopsAtItsEnd(t *testing.T) {
	m, _ := openManager(t, stateDir(t))
	rec := run(t, m, StageOptions{Capsule: capsule(t, `echo a; echo b; echo x >&2; echo y >&2; sleep 30`, "")})
	defer m.Kill(context.Background(), rec.ID, syscall.SIGKILL)
	stderr := filepath.Join(rec.RecordsDir, "stderr.log")
	// The two streams reach their files on their own: wait for both.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		out, _ := os.ReadFile(filepath.Join(rec.RecordsDir, "stdout.log"))
		if errOut, _ := os.ReadFile(stderr); string(out) == "a\nb\n" && string(errOut) == "x\ny\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the program did not write")
		}
	}
	one := int64(1)
	got := map[string]string{}
	if err := m.Logs(context.Background(), rec.ID, records.LogOptions{Tail: &one}, func(c records.LogChunk) error {
		if c.Stream == records.Stdout && got[records.Stdout] == "" {
			appendFile(t, stderr, "z\n")
		}
		got[c.Stream] += string(c.Data)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got[records.Stdout] != "b\n" || got[records.Stderr] != "y\n" {
		t.Fatalf("tail 1 sent %q and %q, want %q and %q", got[records.Stdout], got[records.Stderr], "b\n", "y\n")
	}
}

// Log readers hold descriptors of roostd's budget, one per stream, all of them under one
// share (fdbudget.Followers): past it a reader is refused (ResourceExhausted, naming the
// budget) while the running ones go on, and a reader that ends gives its slots back.
func TestLogsFollowersBudget(t *testing.T) {
	cfg := testConfig(stateDir(t), &recorder{})
	fds := fdbudget.Sized(100, 4)
	cfg.Descriptors = fds
	m, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	rec := run(t, m, StageOptions{Capsule: capsule(t, `echo up; sleep 30`, "")})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	follow := func(ctx context.Context) chan error {
		done := make(chan error, 1)
		go func() {
			done <- m.Logs(ctx, rec.ID, records.LogOptions{Follow: true}, func(records.LogChunk) error { return nil })
		}()
		return done
	}
	first := follow(ctx)
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	second := follow(ctx2)
	for deadline := time.Now().Add(5 * time.Second); fds.Held(fdbudget.Followers) < 4; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("two followers hold %d slots, want 4", fds.Held(fdbudget.Followers))
		}
	}
	err = m.Logs(context.Background(), rec.ID, records.LogOptions{Follow: true}, func(records.LogChunk) error { return nil })
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "readers of sessions' logs together hold their share of 4") || !strings.Contains(err.Error(), rec.ID) {
		t.Fatalf("a third follower past the share: %v", err)
	}
	if n := fds.InUse(fdbudget.Follower); n != 4 {
		t.Fatalf("a refused follower left %d follower slots held, want 4", n)
	}
	cancel2()
	if err := <-second; err == nil {
		t.Fatal("a cancelled follower returned nil")
	}
	if n := fds.Held(fdbudget.Followers); n != 2 {
		t.Fatalf("a follower that ended left %d slots held, want 2", n)
	}
	third := follow(ctx)
	for deadline := time.Now().Add(5 * time.Second); fds.Held(fdbudget.Followers) < 4; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a follower in the freed place: %d slots held, want 4", fds.Held(fdbudget.Followers))
		}
	}
	// The session's end ends its followers.
	if _, err := m.Kill(context.Background(), rec.ID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Errorf("a follower at the session's end: %v", err)
	}
	if err := <-third; err != nil {
		t.Errorf("a follower at the session's end: %v", err)
	}
	if st := fds.Stats(); st.Held != 0 {
		t.Fatalf("after every follower ended: %+v", st)
	}
}
