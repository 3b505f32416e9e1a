package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/term"
	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// isTerminal says whether f (a command's stdin, stdout or stderr) is a terminal: progress
// lines, redrawn screens and questions are for a person, never for a pipe or a file a
// script reads or writes.
func isTerminal(stream any) bool {
	f, ok := stream.(*os.File)
	if !ok {
		return false
	}
	return term.IsTerminal(int(f.Fd()))
}

// Escape sequences every terminal roostctl meets understands (VT100).
const (
	eraseLine = "\033[K" // from the cursor to the end of the line
	cursorTop = "\033[H" // to the top left corner
	eraseDown = "\033[J" // from the cursor to the end of the screen
)

// progress keeps one status line up to date in place: after delay (an operation that ends
// sooner says nothing, so quick ones stay quiet), then every tick, it redraws the line
// status gives for the time elapsed. Stop ends it, replacing the line with a final one, or
// erasing it. Write it only to a terminal (isTerminal): it redraws with a carriage return.
type progress struct {
	w      io.Writer
	status func(elapsed time.Duration) string
	start  time.Time

	mu    sync.Mutex
	shown bool
	done  bool
	stop  chan struct{}
	ended chan struct{}
}

func startProgress(w io.Writer, delay, tick time.Duration, status func(elapsed time.Duration) string) *progress {
	p := &progress{w: w, status: status, start: time.Now(), stop: make(chan struct{}), ended: make(chan struct{})}
	go p.loop(delay, tick)
	return p
}

func (p *progress) loop(delay, tick time.Duration) {
	defer close(p.ended)
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		p.mu.Lock()
		if !p.done {
			// \r and erase: the line may have grown shorter since it was last drawn.
			fmt.Fprintf(p.w, "\r%s%s", p.status(time.Since(p.start)), eraseLine)
			p.shown = true
		}
		p.mu.Unlock()
		t.Reset(tick)
	}
}

// Stop ends the progress line. When it was shown, final (with the time elapsed) replaces it
// on a line of its own; an empty final erases it, leaving the cursor where the line began.
// It reports whether the line was shown. Only the first call does anything.
func (p *progress) Stop(final func(elapsed time.Duration) string) bool {
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		return false
	}
	p.done = true
	shown := p.shown
	if shown {
		text := ""
		if final != nil {
			text = final(time.Since(p.start))
		}
		if text == "" {
			fmt.Fprintf(p.w, "\r%s", eraseLine)
		} else {
			fmt.Fprintf(p.w, "\r%s%s\n", text, eraseLine)
		}
	}
	p.mu.Unlock()
	close(p.stop)
	<-p.ended
	return shown
}

// seconds says an elapsed time the way progress lines do: whole seconds, tenths below ten.
func seconds(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return fmt.Sprintf("%ds", int(d.Seconds()))
}

// Progress timing: what waits less than progressDelay shows nothing; a line shown is
// redrawn every progressTick (the elapsed time counts tenths).
const (
	progressDelay = 500 * time.Millisecond
	progressTick  = 100 * time.Millisecond
)

// launchShowingWait is c.Launch that, on a terminal, says so when the launch takes a while.
// roostd answers Launch once the session's program runs (a sealed root composed, roost-init
// started and reporting); it queues no launch behind others, so a slow answer means it is
// still starting this one. After progressDelay the line
//
//	waiting for roostd to start ses_…: 1.2s
//
// appears on stderr, and goes once Launch answers, leaving nothing behind: run's own output
// (or error) follows as it would have.
func launchShowingWait(ctx context.Context, c roostv1.SessionServiceClient, stderr io.Writer, req *roostv1.LaunchRequest) (*roostv1.LaunchResponse, error) {
	return launchWaitLine(ctx, c, stderr, isTerminal(stderr), progressDelay, req)
}

// launchWaitLine is launchShowingWait with the terminal test and the delay given.
func launchWaitLine(ctx context.Context, c roostv1.SessionServiceClient, stderr io.Writer, tty bool, delay time.Duration, req *roostv1.LaunchRequest) (*roostv1.LaunchResponse, error) {
	if !tty {
		return c.Launch(ctx, req)
	}
	p := startProgress(stderr, delay, progressTick, func(d time.Duration) string {
		return fmt.Sprintf("waiting for roostd to start %s: %s", req.GetId(), seconds(d))
	})
	resp, err := c.Launch(ctx, req)
	p.Stop(nil)
	return resp, err
}

// treeCount is what a capsule directory holds, as push counts it before sending it.
type treeCount struct {
	files int64
	bytes int64
}

func (t treeCount) String() string {
	return fmt.Sprintf("%d %s, %s", t.files, plural(int(t.files), "file"), mebibytes(t.bytes))
}

// mebibytes is a size in MiB with one decimal: progress lines keep one unit so the number
// reads as it grows.
func mebibytes(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// countTree adds up the regular files under dir and their sizes, links not followed (roostd
// stores links as links), calling seen after each directory so a long count can show how
// far it got. What cannot be read is left to roostd, whose refusal names it.
func countTree(dir string, seen func(treeCount)) treeCount {
	var t treeCount
	var walk func(string)
	walk = func(d string) {
		f, err := os.Open(d)
		if err != nil {
			return
		}
		defer f.Close()
		for {
			entries, err := f.ReadDir(1024)
			for _, e := range entries {
				switch {
				case e.IsDir():
					walk(filepath.Join(d, e.Name()))
				case e.Type().IsRegular():
					if info, err := e.Info(); err == nil {
						t.files++
						t.bytes += info.Size()
					}
				}
			}
			if err != nil {
				break
			}
		}
		if seen != nil {
			seen(t)
		}
	}
	walk(dir)
	return t
}

// pushProgress shows, on a terminal, what push is doing with a large tree: counting it,
// then sending it, on one line redrawn in place
//
//	pushing ./big: 12000 files, 830.2 MiB … 3.1s
//
// and a last line once roostd has answered. Nothing is shown for a push quicker than
// progressDelay, nor anywhere but a terminal.
type pushProgress struct {
	dir string
	p   *progress
	mu  sync.Mutex
	n   treeCount
	// counted is set once the count is whole: until then the line says "counting".
	counted bool
}

func startPushProgress(w io.Writer, dir string) *pushProgress {
	pp := &pushProgress{dir: dir}
	pp.p = startProgress(w, progressDelay, progressTick, pp.line)
	return pp
}

func (pp *pushProgress) line(d time.Duration) string {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if !pp.counted {
		return fmt.Sprintf("counting %s: %s so far … %s", pp.dir, pp.n, seconds(d))
	}
	return fmt.Sprintf("pushing %s: %s … %s", pp.dir, pp.n, seconds(d))
}

// count records how far the count got; whole marks it done.
func (pp *pushProgress) count(n treeCount, whole bool) {
	pp.mu.Lock()
	pp.n, pp.counted = n, whole
	pp.mu.Unlock()
}

// finish replaces the line with what came of the push when roostd stored it (or had it),
// and erases it when not (ok false).
func (pp *pushProgress) finish(ok bool) {
	pp.p.Stop(func(d time.Duration) string {
		pp.mu.Lock()
		defer pp.mu.Unlock()
		if !ok {
			// The error, which follows, says what went wrong.
			return ""
		}
		return fmt.Sprintf("pushed %s: %s in %s", pp.dir, pp.n, seconds(d))
	})
}
