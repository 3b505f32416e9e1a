package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"roost.dev/roost/pkg/containment/roostinit"
)

// Output streams, as Logs names them.
const (
	Stdout = roostinit.StdoutStream
	Stderr = roostinit.StderrStream
)

const (
	logChunk = 32 << 10
	// logPoll is how often a follower looks for new output while the session runs: output
	// goes from roost-init straight to files, so there is nothing to be woken by.
	logPoll = 50 * time.Millisecond
)

// Logs sends the session's output. Without follow it sends what exists and returns; with
// follow it returns once the session has ended and all of its output has been sent. Each
// stream is its head, then its newest bytes; where resources.log_max_bytes dropped bytes
// between them a marker line says how many (see cutMarker).
func (m *Manager) Logs(ctx context.Context, id string, follow bool, send func(stream string, data []byte) error) error {
	rec, err := m.Get(id)
	if err != nil {
		return err
	}
	streams := []*logStream{newLogStream(rec.RecordsDir, Stdout), newLogStream(rec.RecordsDir, Stderr)}
	defer func() {
		for _, s := range streams {
			s.close()
		}
	}()
	drain := func() (bool, error) {
		sent := false
		for _, s := range streams {
			n, err := s.copy(send)
			if err != nil {
				return sent, err
			}
			sent = sent || n > 0
		}
		return sent, nil
	}
	ticker := time.NewTicker(logPoll)
	defer ticker.Stop()
	for {
		changed := m.changed.wait()
		// Read the state before draining: once a session is exited its files are complete,
		// so the drain after that read is the last one needed.
		cur, err := m.Get(rec.ID)
		if err != nil {
			return err
		}
		sent, err := drain()
		if err != nil {
			return err
		}
		if !follow || cur.State == Exited {
			return nil
		}
		if sent {
			continue
		}
		select {
		case <-changed:
		case <-ticker.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// logStream reads one output stream as roost-init lays it out in the records directory (see
// roostinit.LogsFile): the head, then the tail segments, each named by the stream offset it
// begins at. It follows rotation: once the writer has begun a later file, the current one
// is complete. A segment rotated away while it is read (a follower that fell behind) is
// left for the newest, the skipped bytes marked as dropped.
type logStream struct {
	name, dir string
	// at is the file read last (f, while open); none before the first.
	at    roostinit.LogFile
	begun bool
	f     *os.File
	tail  bool
	// pos is the stream offset of the next byte read from f.
	pos int64
	// last is the last byte sent: a marker starts on a line of its own.
	last byte
	buf  []byte
}

func newLogStream(dir, name string) *logStream {
	return &logStream{name: name, dir: dir, last: '\n'}
}

// copy sends whatever the stream holds past what was sent before.
func (s *logStream) copy(send func(string, []byte) error) (int, error) {
	total := 0
	for {
		if s.f != nil {
			n, err := s.read(send)
			total += n
			if err != nil {
				return total, err
			}
		}
		files, err := roostinit.LogFiles(s.dir, s.name)
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
			s.f.Close()
			s.f = nil
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
			n, err := s.send(send, s.marker(next.Offset-s.pos))
			total += n
			if err != nil {
				f.Close()
				return total, err
			}
		}
		s.f, s.pos, s.tail = f, next.Offset, next.Name != roostinit.HeadFile(s.name)
		if s.buf == nil {
			s.buf = make([]byte, logChunk)
		}
	}
}

// after is the first of files past the one read last.
func (s *logStream) after(files []roostinit.LogFile) (roostinit.LogFile, bool) {
	if !s.begun {
		if len(files) == 0 {
			return roostinit.LogFile{}, false
		}
		return files[0], true
	}
	for i, f := range files {
		if f.Name == s.at.Name {
			if i+1 < len(files) {
				return files[i+1], true
			}
			return roostinit.LogFile{}, false
		}
	}
	// The file read last is gone (rotated away): the first one beyond its offset.
	for _, f := range files {
		if f.Offset > s.at.Offset {
			return f, true
		}
	}
	return roostinit.LogFile{}, false
}

// read sends f's bytes up to its end, or until the segment is rotated away.
func (s *logStream) read(send func(string, []byte) error) (int, error) {
	total := 0
	for {
		if s.tail && unlinked(s.f) {
			return total, nil
		}
		n, err := s.f.Read(s.buf)
		if n > 0 {
			s.pos += int64(n)
			sent, serr := s.send(send, s.buf[:n])
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

func (s *logStream) send(send func(string, []byte) error, data []byte) (int, error) {
	if len(data) == 0 {
		return 0, nil
	}
	s.last = data[len(data)-1]
	return len(data), send(s.name, data)
}

// marker is the line that stands for n dropped bytes, on a line of its own.
func (s *logStream) marker(n int64) []byte {
	nl := ""
	if s.last != '\n' {
		nl = "\n"
	}
	return []byte(nl + cutMarker(s.dir, s.name, n))
}

// cutMarker says where and how many bytes of a stream were dropped, e.g.
// "--- roost: 123456 bytes of stdout dropped here (resources.log_max_bytes 67108864) ---".
func cutMarker(dir, stream string, n int64) string {
	why := ""
	if st, err := roostinit.ReadLogStats(dir); err == nil {
		why = fmt.Sprintf(" (resources.log_max_bytes %d)", st.MaxBytes)
		if ss := st.Stream(stream); ss != nil && ss.FailedBytes > 0 {
			why = fmt.Sprintf(" (resources.log_max_bytes %d; %d bytes lost to failed writes: %s)", st.MaxBytes, ss.FailedBytes, ss.WriteError)
		}
	}
	return fmt.Sprintf("--- roost: %d bytes of %s dropped here%s ---\n", n, stream, why)
}

// unlinked says whether f's file has been removed.
func unlinked(f *os.File) bool {
	var st syscall.Stat_t
	return syscall.Fstat(int(f.Fd()), &st) == nil && st.Nlink == 0
}

func (s *logStream) close() {
	if s.f != nil {
		s.f.Close()
	}
}

// logCutsFile is where roostd notes the cuts it has reported, so each is reported once
// across restarts.
const logCutsFile = "logs.reported"

// CheckLogCuts reports, once per stream, a session's output first cut by
// resources.log_max_bytes (limit log_bytes) and first lost to a failed write (disk_full),
// as roost-init's logs.json counts them. Call it on the session's periodic guard tick
// while it runs, and once more when its end is recorded; it reads two small files.
func (m *Manager) CheckLogCuts(id, recordsDir string) {
	st, err := roostinit.ReadLogStats(recordsDir)
	if err != nil {
		return
	}
	m.logCutsMu.Lock()
	defer m.logCutsMu.Unlock()
	path := filepath.Join(recordsDir, logCutsFile)
	reported := map[string]bool{}
	if data, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(data, &reported)
	}
	changed := false
	for _, name := range []string{Stdout, Stderr} {
		ss := st.Stream(name)
		if cut := ss.DroppedBytes - ss.FailedBytes; cut > 0 && !reported[name+" "+LimitLogBytes] {
			m.LimitHit(id, LimitLogBytes, fmt.Sprintf("%s past resources.log_max_bytes (%d): its first bytes and its newest are kept, %d of %d bytes dropped so far",
				name, st.MaxBytes, ss.DroppedBytes, ss.WrittenBytes))
			reported[name+" "+LimitLogBytes], changed = true, true
		}
		if ss.FailedBytes > 0 && !reported[name+" "+LimitDiskFull] {
			m.LimitHit(id, LimitDiskFull, fmt.Sprintf("%s: %d bytes of output lost to failed writes in the records directory: %s", name, ss.FailedBytes, ss.WriteError))
			reported[name+" "+LimitDiskFull], changed = true, true
		}
	}
	if !changed {
		return
	}
	data, _ := json.Marshal(reported)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err == nil {
		if err := os.Rename(tmp, path); err != nil {
			m.cfg.Logger.Warn("noting a reported log cut", "session", id, "err", err)
		}
	}
}
