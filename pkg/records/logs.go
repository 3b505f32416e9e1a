// Package records is a session's records directory: what roost-init writes there and
// roostd reads (its output streams: the head and the newest segments of each, kept within
// resources.log_max_bytes, with their write-time index, served as log chunks with the cuts
// marked), and the trace roostd appends (the session's start, delegations, execs, egress and
// end, one JSON object a line). It knows no registry and no process.
package records

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
)

// Output streams, as a LogReader names them.
const (
	Stdout = StdoutStream
	Stderr = StderrStream
)

// logChunk is the most a read takes of a file at once.
const logChunk = 32 << 10

// LogOptions selects what a LogReader sends; the zero value is everything there is, once.
type LogOptions struct {
	// Follow keeps sending output until the session has ended.
	Follow bool
	// Timestamps splits output where its write time changes, so that each chunk has one.
	Timestamps bool
	// Tail, when set, is how many of each stream's last lines of what exists when the call
	// begins are sent (then, with Follow, everything after them).
	Tail *int64
	// Since, when set, skips output written before it.
	Since time.Time
	// StdoutOffset and StderrOffset resume a stream: only its bytes at or beyond the offset
	// are sent, and only the cuts after it marked.
	StdoutOffset, StderrOffset int64
}

// Check refuses a negative tail or offset.
func (o LogOptions) Check() error {
	if o.StdoutOffset < 0 || o.StderrOffset < 0 || (o.Tail != nil && *o.Tail < 0) {
		return fmt.Errorf("logs: negative tail or offset: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// LogChunk is a piece of one stream's output.
type LogChunk struct {
	Stream string
	Data   []byte
	// Offset is where in the stream Data's first byte was written; -1 for a line roost
	// inserted (the marker of a cut). A chunk without Data (sent first with Tail and
	// Follow) says where the stream's output begins, so that a follower that loses roostd
	// can resume from there however little it received.
	Offset int64
	// Time is when Data's first byte was written, with Timestamps; zero without them, for a
	// marker, and where roost-init recorded no time (records from before it did).
	Time time.Time
}

// LogReader reads a session's two output streams from its records directory, as
// LogOptions select.
type LogReader struct {
	streams []*logStream
}

// NewLogReader opens the streams of the records directory dir. With Tail and Follow it sends
// first, for each stream, where its lines begin (see LogChunk).
func NewLogReader(dir string, opts LogOptions, send func(LogChunk) error) (*LogReader, error) {
	if err := opts.Check(); err != nil {
		return nil, err
	}
	r := &LogReader{streams: []*logStream{newLogStream(dir, Stdout), newLogStream(dir, Stderr)}}
	for i, from := range []int64{opts.StdoutOffset, opts.StderrOffset} {
		s := r.streams[i]
		s.timestamps, s.from, s.pos = opts.Timestamps, from, from
		if !opts.Since.IsZero() {
			s.since = opts.Since.UnixNano()
		}
		if opts.Tail == nil {
			continue
		}
		start, end, err := tailStart(s.dir, s.name, *opts.Tail)
		if err != nil {
			r.Close()
			return nil, err
		}
		if !opts.Follow {
			// The last lines of what the stream held when asked: not those written since.
			s.until = end
		}
		if start > s.from {
			s.from, s.pos = start, start
			if opts.Follow {
				if err := send(LogChunk{Stream: s.name, Offset: start}); err != nil {
					r.Close()
					return nil, err
				}
			}
		}
	}
	return r, nil
}

// Drain sends what both streams hold that has not been sent, and says whether there was any.
func (r *LogReader) Drain(send func(LogChunk) error) (bool, error) {
	sent := false
	for _, s := range r.streams {
		n, err := s.copy(send)
		if err != nil {
			return sent, err
		}
		sent = sent || n > 0
	}
	return sent, nil
}

// Close lets go of the files being read.
func (r *LogReader) Close() {
	for _, s := range r.streams {
		s.close()
	}
}

// tailStart is the stream offset at which the last n lines of what the stream holds now
// begin: just past the n-th newline before its end (a newline that ends the stream ends
// its last line, and a last line without one counts). A cut is not a line break: lines are
// counted in the bytes kept.
func tailStart(dir, stream string, n int64) (start, streamEnd int64, err error) {
	files, err := LogFiles(dir, stream)
	if errors.Is(err, fs.ErrNotExist) || len(files) == 0 {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	buf := make([]byte, logChunk)
	last := true
	for i := len(files) - 1; i >= 0; i-- {
		f, err := os.OpenFile(filepath.Join(dir, files[i].Name), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if errors.Is(err, fs.ErrNotExist) {
			// Rotated away while counting: the lines begin with the file after it.
			if i+1 < len(files) {
				return files[i+1].Offset, streamEnd, nil
			}
			continue
		}
		if err != nil {
			return 0, 0, err
		}
		info, err := f.Stat()
		if err != nil {
			f.Close()
			return 0, 0, err
		}
		end := info.Size()
		if streamEnd == 0 {
			streamEnd = files[i].Offset + end
		}
		if n == 0 {
			f.Close()
			return files[i].Offset + end, streamEnd, nil
		}
		for end > 0 {
			k := min(end, int64(len(buf)))
			if _, err := f.ReadAt(buf[:k], end-k); err != nil && !errors.Is(err, io.EOF) {
				f.Close()
				return 0, 0, err
			}
			for j := k - 1; j >= 0; j-- {
				if buf[j] != '\n' {
					last = false
					continue
				}
				if last {
					last = false
					continue
				}
				if n--; n == 0 {
					f.Close()
					return files[i].Offset + end - k + j + 1, streamEnd, nil
				}
			}
			end -= k
		}
		f.Close()
	}
	return files[0].Offset, streamEnd, nil
}

// logStream reads one output stream as roost-init lays it out in the records directory (see
// LogsFile): the head, then the tail segments, each named by the stream offset it
// begins at, each with its time index beside it (see TimesFile). It follows
// rotation: once the writer has begun a later file, the current one is complete. A segment
// rotated away while it is read (a follower that fell behind) is left for the newest, the
// skipped bytes marked as dropped.
type logStream struct {
	name, dir string
	// timestamps splits chunks at the index's entries.
	timestamps bool
	// until, when not 0, is the offset to stop at: the end of what a tail counted in.
	until int64
	// from is the first offset to send (a resume, a tail); since, when not 0, the first
	// write time (unix nanoseconds), until a byte written at or after it has been sent:
	// times never fall, so every later byte is sent too.
	from, since int64
	// at is the file read last (f, while open); none before the first.
	at    LogFile
	begun bool
	f     *os.File
	tail  bool
	idx   timeIndex
	// pos is the stream offset of the next byte to read from f; never before from.
	pos int64
	// cutAt, when cutBy is not 0, is the offset of the file begun after a cut of cutBy
	// bytes: the marker goes out before that file's first byte, unless that byte is not
	// sent (it is before since: so was the cut).
	cutAt, cutBy int64
	// last is the last byte sent: a marker starts on a line of its own.
	last byte
	buf  []byte
}

func newLogStream(dir, name string) *logStream {
	return &logStream{name: name, dir: dir, last: '\n'}
}

// copy sends whatever the stream holds past what was sent before.
func (s *logStream) copy(send func(LogChunk) error) (int, error) {
	total := 0
	for {
		if s.f != nil {
			n, err := s.read(send)
			total += n
			if err != nil {
				return total, err
			}
		}
		files, err := LogFiles(s.dir, s.name)
		if errors.Is(err, fs.ErrNotExist) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		next, ok := s.after(files)
		if !ok {
			// Caught up with the newest file.
			return total, nil
		}
		if s.f != nil {
			// The writer has moved on, so the current file is complete: send what reached
			// it since the read above.
			n, err := s.read(send)
			total += n
			if err != nil {
				return total, err
			}
			s.closeFile()
		}
		s.at, s.begun = next, true
		f, err := os.OpenFile(filepath.Join(s.dir, next.Name), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if errors.Is(err, fs.ErrNotExist) {
			// Rotated away before it could be opened: on to a later one.
			continue
		}
		if err != nil {
			return total, err
		}
		if next.Offset > s.pos {
			// pos is where the last file read ended (or from, beyond it): what lies between
			// was dropped, and not yet seen by whoever resumes at from.
			s.cutAt, s.cutBy = next.Offset, next.Offset-s.pos
			s.pos = next.Offset
		}
		s.f, s.tail = f, next.Name != HeadFile(s.name)
		// roost-init makes a segment's index before the segment: one not there now never
		// will be.
		s.idx.open(filepath.Join(s.dir, TimesFile(next.Name)))
		if s.buf == nil {
			s.buf = make([]byte, logChunk)
		}
	}
}

// after is the first of files past the one read last.
func (s *logStream) after(files []LogFile) (LogFile, bool) {
	if !s.begun {
		if len(files) == 0 {
			return LogFile{}, false
		}
		return files[0], true
	}
	for i, f := range files {
		if f.Name == s.at.Name {
			if i+1 < len(files) {
				return files[i+1], true
			}
			return LogFile{}, false
		}
	}
	// The file read last is gone (rotated away): the first one beyond its offset.
	for _, f := range files {
		if f.Offset > s.at.Offset {
			return f, true
		}
	}
	return LogFile{}, false
}

// read sends f's bytes from pos up to its end, or until the segment is rotated away.
func (s *logStream) read(send func(LogChunk) error) (int, error) {
	total := 0
	for {
		if s.tail && unlinked(s.f) {
			return total, nil
		}
		s.skipBeforeSince()
		buf := s.buf
		if s.until > 0 {
			if s.pos >= s.until {
				return total, nil
			}
			buf = buf[:min(int64(len(buf)), s.until-s.pos)]
		}
		n, err := s.f.ReadAt(buf, s.pos-s.at.Offset)
		if n > 0 {
			// roost-init writes an entry before the bytes it times: every entry for what
			// was just read is there to be loaded now.
			s.idx.load(s.pos + int64(n))
			sent, serr := s.emit(send, s.buf[:n])
			total += sent
			if serr != nil {
				return total, serr
			}
		}
		if errors.Is(err, io.EOF) || n == 0 {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// skipBeforeSince moves pos past the bytes of f the index says were written before since,
// so that they are not read at all.
func (s *logStream) skipBeforeSince() {
	if s.since == 0 || len(s.idx.times) == 0 || s.pos < s.idx.times[0].Offset {
		return
	}
	i := sort.Search(len(s.idx.times), func(i int) bool { return s.idx.times[i].Time >= s.since })
	if i < len(s.idx.times) && s.idx.times[i].Offset > s.pos {
		s.pos = s.idx.times[i].Offset
	}
}

// emit sends data, f's bytes from pos: split where the index has an entry with timestamps
// (and until since is passed), without the bytes written before since, after the marker of
// a cut before them.
func (s *logStream) emit(send func(LogChunk) error, data []byte) (int, error) {
	total := 0
	// untimed is what f's modification time says of bytes the index does not time: all
	// were written before since when it is (read after them) before since.
	untimed := -1
	for len(data) > 0 {
		at := s.pos
		t, timed, next := s.idx.lookup(at)
		piece := data
		if (s.timestamps || s.since != 0) && next-at < int64(len(piece)) {
			piece = piece[:next-at]
		}
		data = data[len(piece):]
		s.pos += int64(len(piece))
		if s.since != 0 {
			before := timed && t < s.since
			if !timed {
				if untimed < 0 {
					untimed = 0
					if info, err := s.f.Stat(); err == nil && info.ModTime().UnixNano() < s.since {
						untimed = 1
					}
				}
				before = untimed == 1
			}
			if before {
				continue
			}
			s.since = 0
		}
		if s.cutBy != 0 {
			if at == s.cutAt {
				n, err := s.send(send, LogChunk{Stream: s.name, Data: s.marker(s.cutBy), Offset: -1})
				total += n
				if err != nil {
					return total, err
				}
			}
			s.cutBy = 0
		}
		c := LogChunk{Stream: s.name, Data: piece, Offset: at}
		if s.timestamps && timed {
			c.Time = time.Unix(0, t)
		}
		n, err := s.send(send, c)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

func (s *logStream) send(send func(LogChunk) error, c LogChunk) (int, error) {
	if len(c.Data) == 0 {
		return 0, nil
	}
	s.last = c.Data[len(c.Data)-1]
	return len(c.Data), send(c)
}

// marker is the line that stands for n dropped bytes, on a line of its own.
func (s *logStream) marker(n int64) []byte {
	nl := ""
	if s.last != '\n' {
		nl = "\n"
	}
	return []byte(nl + cutMarker(s.dir, s.name, n))
}

func (s *logStream) closeFile() {
	if s.f != nil {
		s.f.Close()
		s.f = nil
	}
	s.idx.close()
}

func (s *logStream) close() { s.closeFile() }

// timeIndex is the time index of the file a logStream reads, as far as it has been loaded.
type timeIndex struct {
	f     *os.File
	times []LogTime
	// size is how much of the index file times holds.
	size int64
	buf  []byte
}

// open begins the index at path; a file without one has no times.
func (x *timeIndex) open(path string) {
	x.close()
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return
	}
	x.f = f
	x.load(math.MaxInt64)
}

// load reads the entries added since the last load, unless those loaded already reach past
// the byte before end.
func (x *timeIndex) load(end int64) {
	if x.f == nil || (len(x.times) > 0 && x.times[len(x.times)-1].Offset >= end) {
		return
	}
	if x.buf == nil {
		x.buf = make([]byte, 1024*TimeEntrySize)
	}
	for {
		n, _ := x.f.ReadAt(x.buf, x.size)
		n -= n % TimeEntrySize
		x.times = DecodeTimes(x.times, x.buf[:n])
		x.size += int64(n)
		if n < len(x.buf) {
			return
		}
	}
}

// lookup is the time of the byte at off (the entry at or before it), whether there is one,
// and the offset of the next entry (math.MaxInt64 when none).
func (x *timeIndex) lookup(off int64) (t int64, timed bool, next int64) {
	i := sort.Search(len(x.times), func(i int) bool { return x.times[i].Offset > off })
	next = math.MaxInt64
	if i < len(x.times) {
		next = x.times[i].Offset
	}
	if i == 0 {
		return 0, false, next
	}
	return x.times[i-1].Time, true, next
}

func (x *timeIndex) close() {
	if x.f != nil {
		x.f.Close()
	}
	*x = timeIndex{buf: x.buf}
}

// cutMarker says where and how many bytes of a stream were dropped, e.g.
// "--- roost: 123456 bytes of stdout dropped here (resources.log_max_bytes 67108864) ---".
func cutMarker(dir, stream string, n int64) string {
	why := ""
	if st, err := ReadLogStats(dir); err == nil {
		bound := "resources.log_max_bytes"
		if st.Cap != "" {
			bound = st.Cap
		}
		why = fmt.Sprintf(" (%s %d)", bound, st.MaxBytes)
		if ss := st.Stream(stream); ss != nil && ss.FailedBytes > 0 {
			why = fmt.Sprintf(" (%s %d; %d bytes lost to failed writes: %s)", bound, st.MaxBytes, ss.FailedBytes, ss.WriteError)
		}
	}
	return fmt.Sprintf("--- roost: %d bytes of %s dropped here%s ---\n", n, stream, why)
}

// unlinked says whether f's file has been removed.
func unlinked(f *os.File) bool {
	var st syscall.Stat_t
	return syscall.Fstat(int(f.Fd()), &st) == nil && st.Nlink == 0
}
