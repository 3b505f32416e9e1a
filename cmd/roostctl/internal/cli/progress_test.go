package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// lockedBuffer is a terminal stand-in the progress goroutine and the test share.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A push slower than the delay shows its line, redrawn in place (\r, erased to the end),
// counting first and pushing once the count is whole, then one final line.
func TestPushProgressRedrawsThenFinishes(t *testing.T) {
	var out lockedBuffer
	pp := &pushProgress{dir: "big"}
	pp.p = startProgress(&out, 0, 5*time.Millisecond, pp.line)
	pp.count(treeCount{files: 10, bytes: 1 << 20}, false)
	waitFor(t, &out, "counting big: 10 files, 1.0 MiB so far … ")
	pp.count(treeCount{files: 1200, bytes: 3 << 20}, true)
	waitFor(t, &out, "pushing big: 1200 files, 3.0 MiB … ")
	pp.finish(true)
	got := out.String()
	if !strings.HasPrefix(got, "\r") || !strings.Contains(got, "\033[K\r") {
		t.Fatalf("not redrawn in place: %q", got)
	}
	last := got[strings.LastIndex(got, "\r"):]
	if !strings.HasPrefix(last, "\rpushed big: 1200 files, 3.0 MiB in ") || !strings.HasSuffix(last, "s\033[K\n") {
		t.Fatalf("final line %q", last)
	}
	if strings.Count(got, "\n") != 1 {
		t.Fatalf("more than the final line ends a line: %q", got)
	}
	// Nothing is written after Stop.
	time.Sleep(20 * time.Millisecond)
	if out.String() != got {
		t.Fatalf("written after finish: %q", strings.TrimPrefix(out.String(), got))
	}
}

// A failed push erases its line: the error that follows says what happened.
func TestPushProgressErasedOnFailure(t *testing.T) {
	var out lockedBuffer
	pp := &pushProgress{dir: "big"}
	pp.p = startProgress(&out, 0, 5*time.Millisecond, pp.line)
	pp.count(treeCount{files: 1, bytes: 10}, true)
	waitFor(t, &out, "pushing big: 1 file, 0.0 MiB")
	pp.finish(false)
	if got := out.String(); !strings.HasSuffix(got, "\r\033[K") || strings.Contains(got, "\n") {
		t.Fatalf("failed push: %q", got)
	}
}

// What ends before the delay says nothing at all.
func TestProgressQuietWhenQuick(t *testing.T) {
	var out lockedBuffer
	p := startProgress(&out, time.Hour, time.Millisecond, func(time.Duration) string { return "slow" })
	if shown := p.Stop(func(time.Duration) string { return "done" }); shown || out.String() != "" {
		t.Fatalf("a quick operation printed %q (shown %v)", out.String(), shown)
	}
	if p.Stop(nil) {
		t.Fatal("a second Stop did something")
	}
}

func TestCountTree(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755)
	os.WriteFile(filepath.Join(dir, "one"), make([]byte, 100), 0o644)
	os.WriteFile(filepath.Join(dir, "a", "b", "two"), make([]byte, 50), 0o644)
	// Links are not followed: a link to a big tree counts nothing.
	os.Symlink("/usr", filepath.Join(dir, "usr"))
	os.Symlink("one", filepath.Join(dir, "alias"))
	calls := 0
	got := countTree(dir, func(treeCount) { calls++ })
	if got != (treeCount{files: 2, bytes: 150}) || calls != 3 {
		t.Fatalf("count %+v after %d directories", got, calls)
	}
	if s := got.String(); s != "2 files, 0.0 MiB" {
		t.Fatalf("String %q", s)
	}
}

func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "0.0s", 1250 * time.Millisecond: "1.2s", 12 * time.Second: "12s", 95 * time.Second: "95s"} {
		if got := seconds(d); got != want {
			t.Errorf("seconds(%s) = %q, want %q", d, got, want)
		}
	}
}

func waitFor(t *testing.T, out fmt.Stringer, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("never printed %q: %q", want, out.String())
		}
		time.Sleep(time.Millisecond)
	}
}

// slowLauncher answers Launch after a while; nothing else is called.
type slowLauncher struct {
	roostv1.SessionServiceClient
	took time.Duration
}

func (s slowLauncher) Launch(ctx context.Context, req *roostv1.LaunchRequest, _ ...grpc.CallOption) (*roostv1.LaunchResponse, error) {
	time.Sleep(s.took)
	return &roostv1.LaunchResponse{Session: &roostv1.Session{Id: req.GetId()}}, nil
}

// A slow launch says so on a terminal, and leaves nothing behind once it answers; a quick
// one, or one not on a terminal, says nothing.
func TestLaunchWaitLine(t *testing.T) {
	req := &roostv1.LaunchRequest{Id: "ses_x"}
	var out lockedBuffer
	resp, err := launchWaitLine(context.Background(), slowLauncher{took: 300 * time.Millisecond}, &out, true, 10*time.Millisecond, req)
	if err != nil || resp.GetSession().GetId() != "ses_x" {
		t.Fatalf("launch: %v %v", resp, err)
	}
	got := out.String()
	if !strings.HasPrefix(got, "\rwaiting for roostd to start ses_x: 0.") || !strings.HasSuffix(got, "\r\033[K") || strings.Contains(got, "\n") {
		t.Fatalf("slow launch on a terminal: %q", got)
	}
	for _, tc := range []struct {
		tty   bool
		delay time.Duration
	}{{true, time.Hour}, {false, 0}} {
		var out lockedBuffer
		if _, err := launchWaitLine(context.Background(), slowLauncher{took: 50 * time.Millisecond}, &out, tc.tty, tc.delay, req); err != nil || out.String() != "" {
			t.Fatalf("tty %v, delay %s: printed %q (%v)", tc.tty, tc.delay, out.String(), err)
		}
	}
	// What run calls: a buffer is no terminal, so nothing is shown however long it takes.
	out = lockedBuffer{}
	if _, err := launchShowingWait(context.Background(), slowLauncher{took: 600 * time.Millisecond}, &out, req); err != nil || out.String() != "" {
		t.Fatalf("launch with stderr not a terminal: printed %q (%v)", out.String(), err)
	}
}
