package roostinit

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"roost.dev/roost/pkg/records"
)

const (
	// pipeSize is what roost-init asks of each output pipe: a burst this large never waits
	// for the pump. The kernel grants up to fs.pipe-max-size (1 MiB by default).
	pipeSize = 1 << 20
	// pumpBuffer is what one read takes from a pipe at most.
	pumpBuffer = 256 << 10
	// statsInterval is how often logs.json follows the counts while output flows.
	statsInterval = time.Second
	// drainGrace bounds the last drain once the program and everything it left are gone:
	// only a process outside the session (handed the pipe over a socket) can hold it open
	// longer, and it is not waited for.
	drainGrace = 2 * time.Second
)

// logPump carries the program's stdout and stderr from pipes into the records directory,
// each held to the cap (see records.LogsFile). It always reads: a write that fails counts as
// dropped, so the program never waits on the disk's state, only on the pump's pace.
type logPump struct {
	dir   int
	sinks [2]*logSink
	pipes [2]*os.File
	// child holds the program's ends of the pipes until it has been started.
	child [2]int
	wg    sync.WaitGroup

	mu    sync.Mutex
	stats records.LogStats
	dirty bool

	// cut wakes the flusher when a stream is first cut; stop ends it.
	cut     chan struct{}
	stop    chan struct{}
	flusher chan struct{}
}

// newPump makes the pipes alone: a program can be started on them before its output has
// anywhere to go (see begin), which waits in the pipes meanwhile.
func newPump() (_ *logPump, err error) {
	p := &logPump{
		child:   [2]int{-1, -1},
		cut:     make(chan struct{}, 1),
		stop:    make(chan struct{}),
		flusher: make(chan struct{}),
	}
	defer func() {
		if err != nil {
			p.closeChildEnds()
			p.closePipes()
		}
	}()
	for i, name := range []string{records.StdoutStream, records.StderrStream} {
		var fds [2]int
		if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
			return nil, err
		}
		p.child[i] = fds[1]
		// Best effort: a smaller pipe only means the program waits sooner in a burst.
		_, _ = unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, pipeSize)
		// roost-init's end is non-blocking, so the runtime's poller waits on it and a
		// deadline can bound the last drain; the program's end stays blocking, as a
		// program expects its stdout to be.
		if err := unix.SetNonblock(fds[0], true); err != nil {
			unix.Close(fds[0])
			return nil, err
		}
		p.pipes[i] = os.NewFile(uintptr(fds[0]), name)
	}
	return p, nil
}

func (p *logPump) closePipes() {
	for _, f := range p.pipes {
		if f != nil {
			f.Close()
		}
	}
}

// begin creates the streams' files in the records directory dirfd, each held to maxBytes,
// and starts copying the pipes into them.
func (p *logPump) begin(dirfd int, maxBytes int64) error {
	if maxBytes <= 0 {
		maxBytes = records.DefaultLogMaxBytes
	}
	p.dir = dirfd
	p.stats = records.LogStats{MaxBytes: maxBytes, UpdatedAt: time.Now().UTC()}
	layout := records.LayoutFor(maxBytes)
	for i, name := range []string{records.StdoutStream, records.StderrStream} {
		s := &logSink{dir: dirfd, stream: name, layout: layout, stats: p.stats.Stream(name), pump: p}
		if err := s.openHead(); err != nil {
			p.closeSinks()
			return err
		}
		p.sinks[i] = s
	}
	// The files exist (empty) before the program runs, as roostd made them before.
	if err := writeJSONAtomically(dirfd, records.LogsFile, p.stats); err != nil {
		p.closeSinks()
		return err
	}
	for i := range p.sinks {
		p.wg.Add(1)
		go p.run(p.pipes[i], p.sinks[i])
	}
	go p.flush()
	return nil
}

// premake makes, empty, the files a session's start opens in the records directory dirfd:
// a sandbox made ahead does it before its session exists, so that the claim allocates no
// inode, which on a filesystem without a journal (ext4 skips every recently deleted inode
// looking for a free one) costs more than the write. The start opens them as it would have
// made them (a head appended to, an index and the temporary files truncated); what fails
// here is left for the start to make.
func premake(dirfd int) {
	premakeFiles(dirfd, records.HeadFile(records.StdoutStream), records.TimesFile(records.HeadFile(records.StdoutStream)),
		records.HeadFile(records.StderrStream), records.TimesFile(records.HeadFile(records.StderrStream)),
		tmpName(records.LogsFile), tmpName(InitFile))
}

// premakeEnd makes, empty, the temporary files of the session's end records while its
// program runs, for the same reason: its end then allocates no inode before exit.json.
func premakeEnd(dirfd int) { premakeFiles(dirfd, tmpName(records.LogsFile), tmpName(ExitFile)) }

func premakeFiles(dirfd int, names ...string) {
	for _, name := range names {
		if fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600); err == nil {
			unix.Close(fd)
		}
	}
}

func (p *logPump) closeSinks() {
	for _, s := range p.sinks {
		if s != nil {
			s.closeFile()
		}
	}
}

// childFDs are the program's stdout and stderr.
func (p *logPump) childFDs() (stdout, stderr int) { return p.child[0], p.child[1] }

// closeChildEnds drops roost-init's copies of the program's ends, once the program holds
// them: the pipes then read EOF once every process that holds them is gone.
func (p *logPump) closeChildEnds() {
	for i, fd := range p.child {
		if fd >= 0 {
			unix.Close(fd)
			p.child[i] = -1
		}
	}
}

func (p *logPump) run(pipe *os.File, s *logSink) {
	defer p.wg.Done()
	buf := make([]byte, pumpBuffer)
	for {
		n, err := pipe.Read(buf)
		if n > 0 {
			// The read's time is the bytes' write time as near as roost-init can tell: the
			// pump keeps up with the program, so they waited in the pipe only as long as
			// the last write to disk took.
			s.write(buf[:n], time.Now())
		}
		if err != nil {
			// EOF: every writer is gone. A deadline: the last drain's grace is over.
			break
		}
	}
	s.closeFile()
}

// account adds one chunk's counts to the stream's: written by the program, cut by the cap,
// lost to a failed write.
func (p *logPump) account(st *records.StreamStats, written, cut, failed int64, writeErr error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	first := (cut > 0 && st.CutAt.IsZero()) || (failed > 0 && st.FailedBytes == 0)
	st.WrittenBytes += written
	st.DroppedBytes += cut + failed
	st.FailedBytes += failed
	if writeErr != nil {
		st.WriteError = writeErr.Error()
	}
	if cut > 0 && st.CutAt.IsZero() {
		st.CutAt = time.Now().UTC()
	}
	p.dirty = true
	if first {
		// roostd learns of a cut from logs.json: write it now, not at the next tick.
		select {
		case p.cut <- struct{}{}:
		default:
		}
	}
}

// flush keeps logs.json current while the program runs: at most every statsInterval, and
// at once when a stream is first cut.
func (p *logPump) flush() {
	defer close(p.flusher)
	tick := time.NewTicker(statsInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		case <-p.cut:
		}
		p.writeStats(false)
	}
}

// writeStats writes logs.json if the counts changed since it was last written.
func (p *logPump) writeStats(final bool) records.LogStats {
	p.mu.Lock()
	if final {
		p.stats.Final, p.dirty = true, true
	}
	if !p.dirty {
		st := p.stats
		p.mu.Unlock()
		return st
	}
	p.stats.UpdatedAt = time.Now().UTC()
	st := p.stats
	p.dirty = false
	p.mu.Unlock()
	if err := writeJSONAtomically(p.dir, records.LogsFile, st); err != nil {
		// A full disk, say: the next tick tries again, and exit.json carries the totals.
		p.mu.Lock()
		p.dirty = true
		p.mu.Unlock()
	}
	return st
}

// finish drains the pipes, which every process of the session has let go (roost-init has
// killed and reaped them), for at most grace, and writes the final counts. A pipe still
// held past that, by a process the session handed it to, is abandoned.
func (p *logPump) finish(grace time.Duration) records.LogStats {
	p.closeChildEnds()
	deadline := time.Now().Add(grace)
	for _, f := range p.pipes {
		_ = f.SetReadDeadline(deadline)
	}
	drained := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(drained)
	}()
	final := true
	select {
	case <-drained:
	case <-time.After(grace + time.Second):
		// A write that does not return (a hung filesystem): record what is counted.
		final = false
	}
	close(p.stop)
	<-p.flusher
	for _, f := range p.pipes {
		f.Close()
	}
	return p.writeStats(final)
}

// logSink keeps one stream in the records directory: the head, then the rotated tail.
type logSink struct {
	dir    int
	stream string
	layout records.Layout
	pump   *logPump
	stats  *records.StreamStats

	// f is the file being written, nil between files; it holds size bytes. inHead says it
	// is the head.
	f      *os.File
	size   int64
	inHead bool
	// offset is the stream offset of the next byte.
	offset int64
	// tail is the kept segments, oldest first; the last is f when f is one.
	tail []segment

	// idx is f's time index (see records.TimesFile), nil when f has none; it holds idxSize bytes,
	// which count against f's part of the cap with its data.
	idx     *os.File
	idxSize int64
	// lastRead is when the stream's last entry was made, as the clock's monotonic reading
	// measures the spacing; lastTime is the time it recorded, which the next may not be
	// before.
	lastRead time.Time
	lastTime int64
	entry    [records.TimeEntrySize]byte
}

type segment struct {
	name string
	size int64
}

func (s *logSink) openHead() error {
	fd, err := unix.Openat(s.dir, records.HeadFile(s.stream), unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "open", Path: records.HeadFile(s.stream), Err: err}
	}
	s.f, s.inHead = os.NewFile(uintptr(fd), records.HeadFile(s.stream)), true
	// After the head, unlike a segment's: the program has not run yet, so no reader can
	// find a byte of the head before its index is there.
	s.openIndex(records.HeadFile(s.stream), s.layout.Head)
	return nil
}

// openIndex begins the time index of the file name, whose part of the cap is share. The
// index is best effort: a file without one has no times, and its bytes are kept all the
// same.
func (s *logSink) openIndex(name string, share int64) {
	s.idx, s.idxSize = nil, 0
	if share < records.MinTimedShare {
		// One made ahead (premake) for a share this small is not kept: a file has an
		// index only where its entries are written.
		_ = unix.Unlinkat(s.dir, records.TimesFile(name), 0)
		return
	}
	fd, err := unix.Openat(s.dir, records.TimesFile(name), unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return
	}
	s.idx = os.NewFile(uintptr(fd), records.TimesFile(name))
}

// stamp adds an entry to the index: the stream's next byte was written at now. It reports
// whether the entry was kept.
func (s *logSink) stamp(now time.Time) bool {
	t := max(now.UnixNano(), s.lastTime)
	records.EncodeTime(&s.entry, records.LogTime{Offset: s.offset, Time: t})
	// At its own offset rather than appended: a short write (a full disk) is then
	// overwritten by the next entry instead of shifting every later one.
	n, err := s.idx.WriteAt(s.entry[:], s.idxSize)
	if err != nil || n != records.TimeEntrySize {
		if n > 0 {
			_ = s.idx.Truncate(s.idxSize)
		}
		return false
	}
	s.idxSize += records.TimeEntrySize
	s.lastRead, s.lastTime = now, t
	return true
}

// limit is how much the current file may hold.
func (s *logSink) limit() int64 {
	if s.inHead {
		return s.layout.Head
	}
	return s.layout.Segment
}

// write keeps p, the stream's next bytes, read from the pipe at now, as far as the cap and
// the disk allow, and notes their time in the index.
func (s *logSink) write(p []byte, now time.Time) {
	var cut, failed int64
	var writeErr error
	written := int64(len(p))
	// A read a millisecond or more after the stream's last entry gets one of its own (in
	// the file it begins in); the bytes of one that comes sooner keep the last entry's time.
	// Each file's index begins with an entry whatever the spacing.
	due := s.lastRead.IsZero() || now.Sub(s.lastRead) >= records.TimeGranularity
	for len(p) > 0 {
		if s.f != nil {
			used := s.size + s.idxSize
			if s.idx != nil && (due || s.idxSize == 0) {
				// The entry, and at least a byte after it, must fit: the index and the data
				// share the file's part of the cap.
				used += records.TimeEntrySize
			}
			if used >= s.limit() {
				s.closeFile()
			}
		}
		if budget := s.layout.Segment * int64(s.layout.Segments); !s.inHead && int64(len(p)) > budget {
			// Past the head, only the chunk's last budget bytes would be kept: what comes
			// before would only pass through segments rotated away before it ends. Skip
			// it, and the segments it would have pushed out, without writing it (a tiny
			// cap would otherwise cost a file per few bytes).
			skip := int64(len(p)) - budget
			cut += s.dropTail() + skip
			s.offset += skip
			p = p[skip:]
		}
		if s.f == nil {
			d, err := s.next()
			cut += d
			if err != nil {
				// No file to write to: drop this chunk and carry on draining.
				n := int64(len(p))
				failed += n
				s.offset += n
				writeErr = err
				break
			}
		}
		if s.idx != nil && (due || s.idxSize == 0) && s.stamp(now) {
			due = false
		}
		chunk := p[:min(int64(len(p)), s.limit()-s.size-s.idxSize)]
		n, err := s.f.Write(chunk)
		s.size += int64(n)
		s.offset += int64(len(chunk))
		p = p[len(chunk):]
		if err != nil {
			failed += int64(len(chunk) - n)
			writeErr = err
			// What follows goes to a new file, named by its own offset: a gap in the
			// stream is always between files, where readers mark it. Each chunk tries
			// again, so output is kept again as soon as there is room.
			s.closeFile()
		}
	}
	s.pump.account(s.stats, written, cut, failed, writeErr)
}

// next opens the tail segment that begins at the current offset, and removes the oldest
// past the cap; it returns the bytes that removal dropped.
func (s *logSink) next() (int64, error) {
	name := records.TailFile(s.stream, s.offset)
	// The index before the segment: a reader that finds the segment and no index knows
	// there is none to wait for.
	s.openIndex(name, s.layout.Segment)
	fd, err := unix.Openat(s.dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		if s.idx != nil {
			s.idx.Close()
			s.idx = nil
			_ = unix.Unlinkat(s.dir, records.TimesFile(name), 0)
		}
		return 0, &os.PathError{Op: "open", Path: name, Err: err}
	}
	s.f, s.size, s.inHead = os.NewFile(uintptr(fd), name), 0, false
	s.tail = append(s.tail, segment{name: name})
	var dropped int64
	for len(s.tail) > s.layout.Segments {
		old := s.tail[0]
		s.remove(old.name)
		dropped += old.size
		s.tail = s.tail[1:]
	}
	return dropped, nil
}

// dropTail ends the current segment and removes every kept one; it returns the bytes they
// held.
func (s *logSink) dropTail() int64 {
	s.closeFile()
	var dropped int64
	for _, seg := range s.tail {
		s.remove(seg.name)
		dropped += seg.size
	}
	s.tail = nil
	return dropped
}

// closeFile ends the current file. An empty segment is removed: its name would claim an
// offset its bytes never reached.
func (s *logSink) closeFile() {
	if s.f == nil {
		return
	}
	s.f.Close()
	s.f = nil
	if s.idx != nil {
		s.idx.Close()
		s.idx = nil
	}
	if s.inHead {
		// The head is written once: what follows it goes to the tail.
		s.inHead = false
		return
	}
	last := &s.tail[len(s.tail)-1]
	last.size = s.size
	if s.size == 0 {
		s.remove(last.name)
		s.tail = s.tail[:len(s.tail)-1]
	}
}

// remove deletes a tail segment and its time index.
func (s *logSink) remove(name string) {
	_ = unix.Unlinkat(s.dir, name, 0)
	_ = unix.Unlinkat(s.dir, records.TimesFile(name), 0)
}
