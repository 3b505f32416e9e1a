package session

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"roost.dev/roost/pkg/containment"
)

// Output streams, as Logs names them.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

const (
	logChunk = 32 << 10
	// logPoll is how often a follower looks for new output while the session runs: output
	// goes straight from the program to files, so there is nothing to be woken by.
	logPoll = 50 * time.Millisecond
)

// Logs sends the session's output. Without follow it sends what exists and returns; with
// follow it returns once the session has ended and all of its output has been sent.
func (m *Manager) Logs(ctx context.Context, id string, follow bool, send func(stream string, data []byte) error) error {
	rec, err := m.Get(id)
	if err != nil {
		return err
	}
	streams := []*logStream{
		{name: Stdout, path: filepath.Join(rec.RecordsDir, containment.StdoutFile)},
		{name: Stderr, path: filepath.Join(rec.RecordsDir, containment.StderrFile)},
	}
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

type logStream struct {
	name string
	path string
	f    *os.File
	buf  []byte
}

// copy sends whatever the file holds past what was sent before.
func (s *logStream) copy(send func(string, []byte) error) (int, error) {
	if s.f == nil {
		f, err := os.OpenFile(s.path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		s.f, s.buf = f, make([]byte, logChunk)
	}
	total := 0
	for {
		n, err := s.f.Read(s.buf)
		if n > 0 {
			total += n
			if err := send(s.name, s.buf[:n]); err != nil {
				return total, err
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

func (s *logStream) close() {
	if s.f != nil {
		s.f.Close()
	}
}
