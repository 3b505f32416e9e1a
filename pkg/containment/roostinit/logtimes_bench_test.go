package roostinit

import (
	"bytes"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"roost.dev/roost/pkg/records"
)

// benchPump pushes b.N writes of size bytes through a real pipe and pump under a cap of
// maxBytes, as a program's output goes: the cost of the whole path, times included.
func benchPump(b *testing.B, size int, maxBytes int64) {
	var line bytes.Buffer
	for i := 0; line.Len() < size; i++ {
		line.WriteString(strconv.Itoa(i))
		line.WriteByte('\n')
	}
	chunk := line.Bytes()[:size]
	dir := b.TempDir()
	dirfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(dirfd)
	p, err := startPump(dirfd, maxBytes)
	if err != nil {
		b.Fatal(err)
	}
	outFD, errFD := p.childFDs()
	p.child = [2]int{-1, -1}
	unix.Close(errFD)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		if _, err := unix.Write(outFD, chunk); err != nil {
			b.Fatal(err)
		}
	}
	unix.Close(outFD)
	p.finish(drainGrace)
}

func BenchmarkPump(b *testing.B) {
	for _, size := range []int{64, 4 << 10, 64 << 10} {
		b.Run(strconv.Itoa(size), func(b *testing.B) { benchPump(b, size, 8<<20) })
	}
}

// BenchmarkSinkWrite is one read's trip into the records directory: every read with an
// entry (reads a millisecond or more apart: the most entries there can be), and none (reads
// closer together, which share the last entry).
func BenchmarkSinkWrite(b *testing.B) {
	chunk := bytes.Repeat([]byte("0123456789abcde\n"), 256) // 4 KiB
	for _, c := range []struct {
		name string
		step time.Duration
	}{{"entry-each", time.Millisecond}, {"coalesced", 0}} {
		b.Run(c.name, func(b *testing.B) {
			dir := b.TempDir()
			dirfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer unix.Close(dirfd)
			p := &logPump{dir: dirfd, stats: records.LogStats{MaxBytes: 64 << 20}, cut: make(chan struct{}, 1)}
			s := &logSink{dir: dirfd, stream: records.StdoutStream, layout: records.LayoutFor(64 << 20), stats: &p.stats.Stdout, pump: p}
			if err := s.openHead(); err != nil {
				b.Fatal(err)
			}
			defer s.closeFile()
			now := time.Unix(1_700_000_000, 0)
			b.SetBytes(int64(len(chunk)))
			b.ResetTimer()
			for range b.N {
				now = now.Add(c.step)
				s.write(chunk, now)
			}
		})
	}
}
