package roostinit

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"roost.dev/roost/pkg/records"
)

// refusalFlushInterval is how often the recorder writes at most: a loop refused a million
// times a second still adds one line per distinct refusal each interval.
const refusalFlushInterval = time.Second

// refusalRecorder writes refused execs to records.RefusalsFile in the records directory,
// coalescing repeats (the same path and program: one line per interval with its count) and
// bounded (records.MaxRefusalKeys distinct, records.MaxRefusalBytes of lines): past a bound
// it only counts, and the one marker line at finish says how many more were refused. A
// session looping through refused execs cannot fill the disk.
type refusalRecorder struct {
	dir int
	now func() time.Time

	// mu guards the counts; add holds it while an exec waits, so no write happens under it.
	mu      sync.Mutex
	entries map[refusalKey]*refusalEntry
	// dirty lists, in order, the entries with counts not yet written.
	dirty   []*refusalEntry
	written int64
	// more counts what is past the bounds; full says the bytes bound was met.
	more     int64
	full     bool
	finished bool

	// writeMu guards the file.
	writeMu sync.Mutex
	fd      int // -1 until the first line
	lastErr error

	wake chan struct{}
	stop chan struct{}
}

type refusalKey struct{ path, program string }

type refusalEntry struct {
	line records.ExecRefusal
	// pending is what was counted since the entry's last line.
	pending int64
}

func newRefusalRecorder(dir int, now func() time.Time) *refusalRecorder {
	return &refusalRecorder{dir: dir, now: now, fd: -1, entries: map[refusalKey]*refusalEntry{},
		wake: make(chan struct{}, 1), stop: make(chan struct{})}
}

// add counts one refusal.
func (r *refusalRecorder) add(ref records.ExecRefusal) {
	for _, s := range []*string{&ref.Path, &ref.Resolved, &ref.Argv0, &ref.Program, &ref.Interpreter} {
		*s = bounded(*s)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished {
		return
	}
	key := refusalKey{ref.Path, ref.Program}
	e := r.entries[key]
	switch {
	case r.full:
		r.more++
		return
	case e == nil && len(r.entries) >= records.MaxRefusalKeys:
		r.more++
		return
	case e == nil:
		e = &refusalEntry{line: ref}
		r.entries[key] = e
	}
	// The line tells the last attempt's time; pid and argv[0] stay the first's.
	e.line.Time = ref.Time
	if e.pending == 0 {
		r.dirty = append(r.dirty, e)
	}
	e.pending++
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// bounded cuts a name the session chose to at most records.MaxRefusalField bytes, on a rune
// boundary.
func bounded(s string) string {
	if len(s) <= records.MaxRefusalField {
		return s
	}
	s = s[:records.MaxRefusalField]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// flusher writes what was counted as it comes, at most once an interval, until finish.
func (r *refusalRecorder) flusher() {
	for {
		select {
		case <-r.wake:
		case <-r.stop:
			return
		}
		r.flush()
		select {
		case <-time.After(refusalFlushInterval):
		case <-r.stop:
			return
		}
	}
}

// flush writes a line for each entry with counts pending, in one write.
func (r *refusalRecorder) flush() {
	r.write(r.take())
}

// take turns the pending counts into lines, holding them to the bytes bound.
func (r *refusalRecorder) take() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	var buf []byte
	for i, e := range r.dirty {
		line := e.line
		line.Count = e.pending
		data, err := json.Marshal(line)
		if err != nil {
			continue
		}
		if r.written+int64(len(buf)+len(data)+1) > records.MaxRefusalBytes {
			// From here on everything is only counted.
			r.full = true
			for _, rest := range r.dirty[i:] {
				r.more += rest.pending
				rest.pending = 0
			}
			break
		}
		buf = append(append(buf, data...), '\n')
		e.pending = 0
	}
	r.dirty = r.dirty[:0]
	// Counted as written whether or not the disk takes it: the bound is on what is tried.
	r.written += int64(len(buf))
	return buf
}

// write appends buf to the file, opening it on first use.
func (r *refusalRecorder) write(buf []byte) {
	if len(buf) == 0 {
		return
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	if r.fd < 0 {
		fd, err := unix.Openat(r.dir, records.RefusalsFile, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			r.note(err)
			return
		}
		r.fd = fd
	}
	if _, err := unix.Write(r.fd, buf); err != nil {
		r.note(err)
	}
}

// note says in init.log why refusals were lost, once per kind of failure. The caller holds
// r.writeMu.
func (r *refusalRecorder) note(err error) {
	if r.lastErr != nil && r.lastErr.Error() == err.Error() {
		return
	}
	r.lastErr = err
	fmt.Fprintf(os.Stderr, "roost-init: writing %s: %v\n", records.RefusalsFile, err)
}

// finish writes every count still pending and, when anything was past the bounds, the marker
// that counts it. Refusals after it are dropped: the session's processes are gone.
func (r *refusalRecorder) finish() {
	select {
	case <-r.stop:
		return
	default:
	}
	close(r.stop)
	r.mu.Lock()
	r.finished = true
	r.mu.Unlock()
	buf := r.take()
	r.mu.Lock()
	more := r.more
	r.mu.Unlock()
	if more > 0 {
		if data, err := json.Marshal(records.ExecRefusal{Time: r.now().UTC(), More: more}); err == nil {
			buf = append(append(buf, data...), '\n')
		}
	}
	r.write(buf)
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}
