package roostinit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"roost.dev/roost/pkg/records"
)

// testSink is one stream's sink on a fresh directory, without pipes: the test hands it
// reads and their times.
func testSink(t *testing.T, maxBytes int64) (string, *logSink) {
	t.Helper()
	dir := t.TempDir()
	dirfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(dirfd) })
	p := &logPump{dir: dirfd, stats: records.LogStats{MaxBytes: maxBytes}, cut: make(chan struct{}, 1)}
	s := &logSink{dir: dirfd, stream: records.StdoutStream, layout: records.LayoutFor(maxBytes), stats: &p.stats.Stdout, pump: p}
	if err := s.openHead(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.closeFile)
	return dir, s
}

// streamDisk adds up what the stream's files and their indexes hold on disk.
func streamDisk(t *testing.T, dir, stream string) (data, index int64) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), stream+".") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(e.Name(), records.TimesSuffix) {
			index += info.Size()
		} else {
			data += info.Size()
		}
	}
	return data, index
}

// readTimes reads the index beside a stream's file.
func readTimes(t *testing.T, dir, name string) []records.LogTime {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, records.TimesFile(name)))
	if err != nil {
		t.Fatal(err)
	}
	if len(b)%records.TimeEntrySize != 0 {
		t.Fatalf("%s: %d bytes, not whole entries", records.TimesFile(name), len(b))
	}
	return records.DecodeTimes(nil, b)
}

// checkIndexes checks every kept file's index: it begins at the file's first byte, its
// offsets rise within the file, its times never fall, and the stream's files only are
// indexed.
func checkIndexes(t *testing.T, dir string, files []records.LogFile, data [][]byte) {
	t.Helper()
	var last int64
	for i, f := range files {
		if len(data[i]) == 0 {
			continue
		}
		times := readTimes(t, dir, f.Name)
		if len(times) == 0 || times[0].Offset != f.Offset {
			t.Fatalf("%s at %d: index begins %+v", f.Name, f.Offset, times[:min(1, len(times))])
		}
		for j, e := range times {
			if e.Offset >= f.Offset+int64(len(data[i])) || (j > 0 && e.Offset <= times[j-1].Offset) || e.Time < last {
				t.Fatalf("%s: entry %d %+v out of order (file of %d bytes at %d)", f.Name, j, e, len(data[i]), f.Offset)
			}
			last = e.Time
		}
	}
}

// A program that writes a byte at a time, each a millisecond after the last, makes an
// entry per byte: sixteen bytes of index for each of its own. Whatever it does, the stream's
// files and their indexes together stay within log_max_bytes, and the counts still say what
// was kept.
func TestLogTimesHostileTinyWritesStayInTheCap(t *testing.T) {
	for _, maxBytes := range []int64{1, 300, 4096, 64 << 10, 1 << 20} {
		dir, s := testSink(t, maxBytes)
		start := time.Unix(1_700_000_000, 0)
		writes := int(3*maxBytes/records.TimeEntrySize) + 1000
		peak := int64(0)
		for i := range writes {
			s.write([]byte{byte('a' + i%26)}, start.Add(time.Duration(i)*time.Millisecond))
			if i%97 == 0 {
				d, x := streamDisk(t, dir, records.StdoutStream)
				peak = max(peak, d+x)
			}
		}
		s.closeFile()
		d, x := streamDisk(t, dir, records.StdoutStream)
		peak = max(peak, d+x)
		if peak > maxBytes {
			t.Fatalf("cap %d: the stream's files held %d bytes (%d now: %d data, %d index)", maxBytes, peak, d+x, d, x)
		}
		st := s.pump.stats.Stdout
		if st.WrittenBytes != int64(writes) || st.KeptBytes() != d || st.DroppedBytes == 0 {
			t.Fatalf("cap %d: counts %+v, %d bytes of data on disk", maxBytes, st, d)
		}
		if layout := records.LayoutFor(maxBytes); layout.Segment >= records.MinTimedShare && x == 0 {
			t.Fatalf("cap %d: no index written", maxBytes)
		}
		files, data := kept(t, dir, records.StdoutStream)
		if records.LayoutFor(maxBytes).Segment >= records.MinTimedShare {
			checkIndexes(t, dir, files, data)
		}
	}
}

// The same through a real pipe and pump: a writer that sleeps between one-byte writes.
func TestLogTimesHostilePumpStaysInTheCap(t *testing.T) {
	const maxBytes = 4096
	dir := t.TempDir()
	dirfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirfd)
	p, err := startPump(dirfd, maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	outFD, errFD := p.childFDs()
	p.child = [2]int{-1, -1}
	unix.Close(errFD)
	n := 0
	peak := int64(0)
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); n++ {
		if _, err := unix.Write(outFD, []byte{'x'}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Microsecond)
		if n%50 == 0 {
			d, x := streamDisk(t, dir, records.StdoutStream)
			peak = max(peak, d+x)
		}
	}
	unix.Close(outFD)
	st := p.finish(drainGrace)
	d, x := streamDisk(t, dir, records.StdoutStream)
	peak = max(peak, d+x)
	t.Logf("%d one-byte writes: %d bytes of data and %d of index kept", n, d, x)
	if peak > maxBytes || x == 0 {
		t.Fatalf("the stream's files held %d bytes (cap %d); %d now in indexes", peak, maxBytes, x)
	}
	if st.Stdout.WrittenBytes != int64(n) || st.Stdout.KeptBytes() != d {
		t.Fatalf("counts %+v, %d bytes of data on disk", st.Stdout, d)
	}
	onDisk, err := records.ReadLogStats(dir)
	if err != nil || onDisk.Stdout != st.Stdout {
		t.Fatalf("logs.json %+v (%v)", onDisk.Stdout, err)
	}
}

// Reads closer together than a millisecond share the entry before them; a file's first
// byte always has one; a clock stepped back is held at the last time.
func TestLogTimesEntriesAndCoalescing(t *testing.T) {
	dir, s := testSink(t, 64<<10)
	t0 := time.Unix(1_700_000_000, 0)
	ms := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Millisecond))) }
	for _, w := range []struct {
		data string
		at   time.Time
	}{
		{"aa", ms(0)},
		{"b", ms(0.3)},
		{"c", ms(0.9)},
		{"dd", ms(1.0)},
		{"e", ms(1.5)},
		{"f", ms(2.5)},
		{"g", ms(500)},
		{"h", ms(500.9)},
		{"i", ms(502)},
	} {
		s.write([]byte(w.data), w.at)
	}
	s.closeFile()
	got := readTimes(t, dir, records.HeadFile(records.StdoutStream))
	want := []records.LogTime{
		{Offset: 0, Time: ms(0).UnixNano()},
		{Offset: 4, Time: ms(1.0).UnixNano()},
		{Offset: 7, Time: ms(2.5).UnixNano()},
		{Offset: 8, Time: ms(500).UnixNano()},
		{Offset: 10, Time: ms(502).UnixNano()},
	}
	if len(got) != len(want) {
		t.Fatalf("entries %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entry %d %+v, want %+v", i, got[i], want[i])
		}
	}

	// The spacing is measured on the monotonic clock, the time recorded is the wall clock's:
	// one stepped back (here, a wall time before the last entry's) is held at the last time,
	// so that times never fall.
	dir, s = testSink(t, 64<<10)
	s.write([]byte("x"), ms(10))
	s.lastTime = ms(20).UnixNano()
	s.write([]byte("y"), ms(12))
	s.closeFile()
	if got := readTimes(t, dir, records.HeadFile(records.StdoutStream)); len(got) != 2 || got[1] != (records.LogTime{Offset: 1, Time: ms(20).UnixNano()}) {
		t.Fatalf("after a step back: %+v", got)
	}
}

// Rotation: each segment's index begins at its first byte, with the time of the read that
// began it even within a millisecond of the last entry, and goes with it when it is dropped.
func TestLogTimesFollowSegments(t *testing.T) {
	const maxBytes = 8192 // head 1024, segments of 1792
	dir, s := testSink(t, maxBytes)
	t0 := time.Unix(1_700_000_000, 0)
	chunk := []byte(strings.Repeat("0123456789abcde\n", 100))
	var at time.Time
	for i := range 40 {
		// Ten reads per millisecond: only the first of each millisecond, and each file's
		// first, get entries.
		at = t0.Add(time.Duration(i) * 100 * time.Microsecond)
		s.write(chunk, at)
	}
	s.closeFile()
	files, data := kept(t, dir, records.StdoutStream)
	checkIndexes(t, dir, files, data)
	entries, _ := os.ReadDir(dir)
	indexes := 0
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), records.TimesSuffix) {
			indexes++
			if _, err := os.Stat(filepath.Join(dir, strings.TrimSuffix(e.Name(), records.TimesSuffix))); err != nil {
				t.Fatalf("%s outlived its file", e.Name())
			}
		}
	}
	if indexes != len(files) {
		t.Fatalf("%d indexes for %d files", indexes, len(files))
	}
	last := files[len(files)-1]
	times := readTimes(t, dir, last.Name)
	if times[len(times)-1].Time > at.UnixNano() || times[0].Time < t0.UnixNano() {
		t.Fatalf("%s: times %+v outside the writes", last.Name, times)
	}
	total := int64(0)
	for _, e := range readTimes(t, dir, files[0].Name) {
		total++
		_ = e
	}
	// 40 reads over 4 ms: the head got the first millisecond's entry only.
	if total != 1 {
		t.Fatalf("head index has %d entries", total)
	}
	d, x := streamDisk(t, dir, records.StdoutStream)
	if d+x > maxBytes {
		t.Fatalf("%d + %d bytes past the cap", d, x)
	}
}

// Records from before write times: nothing but the data files, which records.LogFiles lists as
// before; an index is never taken for a stream file.
func TestLogTimesIndexIsNotAStreamFile(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"stdout.log", "stdout.log.times", "stdout.tail.10", "stdout.tail.10.times"} {
		os.WriteFile(filepath.Join(dir, name), nil, 0o600)
	}
	files, err := records.LogFiles(dir, records.StdoutStream)
	if err != nil || len(files) != 2 || files[0].Name != "stdout.log" || files[1].Name != "stdout.tail.10" {
		t.Fatalf("files %+v (%v)", files, err)
	}
}
