package roostinit

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"roost.dev/roost/pkg/records"
)

// startPump creates stdout.log and stderr.log in the records directory dirfd and the pipes
// the program writes to, and starts copying. The program's ends are childFDs.
func startPump(dirfd int, maxBytes int64) (*logPump, error) {
	p, err := newPump()
	if err != nil {
		return nil, err
	}
	if err := p.begin(dirfd, maxBytes); err != nil {
		p.closeChildEnds()
		p.closePipes()
		return nil, err
	}
	return p, nil
}

// pumpThrough runs a pump on a fresh directory, writes each of chunks to the program's
// stdout end (and errText to stderr), and returns the directory and the final counts.
func pumpThrough(t *testing.T, maxBytes int64, chunks [][]byte, errText string) (string, records.LogStats) {
	t.Helper()
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
	out, errOut := os.NewFile(uintptr(outFD), "out"), os.NewFile(uintptr(errFD), "err")
	p.child = [2]int{-1, -1}
	for _, c := range chunks {
		if _, err := out.Write(c); err != nil {
			t.Fatal(err)
		}
	}
	errOut.WriteString(errText)
	out.Close()
	errOut.Close()
	st := p.finish(drainGrace)
	if !st.Final {
		t.Fatal("counts not final")
	}
	onDisk, err := records.ReadLogStats(dir)
	if err != nil || onDisk.Stdout != st.Stdout || onDisk.Stderr != st.Stderr || !onDisk.Final {
		t.Fatalf("logs.json %+v (%v), want %+v", onDisk, err, st)
	}
	return dir, st
}

// indexSize is the size of a file's time index; 0 when it has none.
func indexSize(t *testing.T, dir, name string) int64 {
	t.Helper()
	info, err := os.Stat(filepath.Join(dir, records.TimesFile(name)))
	if err != nil {
		return 0
	}
	return info.Size()
}

// kept reads a stream's files back as (offset, bytes) pieces.
func kept(t *testing.T, dir, stream string) ([]records.LogFile, [][]byte) {
	t.Helper()
	files, err := records.LogFiles(dir, stream)
	if err != nil {
		t.Fatal(err)
	}
	var data [][]byte
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, b)
	}
	return files, data
}

func TestPumpSmallOutputIsVerbatim(t *testing.T) {
	in := []byte("line 1\n\x00\xff binary\r\nno newline")
	dir, st := pumpThrough(t, 1<<20, [][]byte{in[:5], in[5:]}, "oops\n")
	if got, _ := os.ReadFile(filepath.Join(dir, StdoutFile)); !bytes.Equal(got, in) {
		t.Fatalf("stdout.log %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, StderrFile)); string(got) != "oops\n" {
		t.Fatalf("stderr.log %q", got)
	}
	if st.Stdout != (records.StreamStats{WrittenBytes: int64(len(in))}) || st.Stderr != (records.StreamStats{WrittenBytes: 5}) || st.MaxBytes != 1<<20 {
		t.Fatalf("counts %+v", st)
	}
	if files, _ := records.LogFiles(dir, records.StdoutStream); len(files) != 1 {
		t.Fatalf("files %+v", files)
	}
}

// Whatever the chunking, the kept files are the head and a contiguous run of the newest
// bytes, each exactly the input at its offset, within the cap; the counts add up.
func TestPumpKeepsHeadAndNewest(t *testing.T) {
	for _, maxBytes := range []int64{1, 7, 100, 4096, 1 << 20} {
		r := rand.New(rand.NewPCG(uint64(maxBytes), 1))
		var in []byte
		var chunks [][]byte
		for len(in) < int(maxBytes)*5+3000 {
			c := make([]byte, r.IntN(int(min(maxBytes, 300_000))+2000))
			for i := range c {
				c[i] = byte(r.Uint32())
			}
			in = append(in, c...)
			chunks = append(chunks, c)
		}
		dir, st := pumpThrough(t, maxBytes, chunks, "")
		files, data := kept(t, dir, records.StdoutStream)
		layout := records.LayoutFor(maxBytes)
		var total int64
		for i, f := range files {
			total += int64(len(data[i]))
			if !bytes.Equal(data[i], in[f.Offset:f.Offset+int64(len(data[i]))]) {
				t.Fatalf("cap %d: %s differs from the input at %d", maxBytes, f.Name, f.Offset)
			}
			if i > 1 && files[i-1].Offset+int64(len(data[i-1])) != f.Offset {
				t.Fatalf("cap %d: a gap inside the tail before %s", maxBytes, f.Name)
			}
		}
		last := files[len(files)-1]
		if last.Offset+int64(len(data[len(data)-1])) != int64(len(in)) {
			t.Fatalf("cap %d: the newest bytes are not kept", maxBytes)
		}
		// A file is full when its data and its index fill its part of the cap, or when the
		// next entry would not fit with a byte after it.
		headIndex := indexSize(t, dir, files[0].Name)
		if files[0].Name != StdoutFile || int64(len(data[0]))+headIndex > layout.Head || int64(len(data[0]))+headIndex+records.TimeEntrySize < layout.Head {
			t.Fatalf("cap %d: head %s of %d bytes, %d of index", maxBytes, files[0].Name, len(data[0]), headIndex)
		}
		onDisk, index := streamDisk(t, dir, records.StdoutStream)
		slack := int64(len(files)) * records.TimeEntrySize
		if onDisk != total || total+index > maxBytes || total+index+slack < layout.Head+layout.Segment*int64(layout.Segments-1) {
			t.Fatalf("cap %d: %d bytes kept, %d of index", maxBytes, total, index)
		}
		if layout.Segment >= records.MinTimedShare {
			checkIndexes(t, dir, files, data)
		}
		if st.Stdout.WrittenBytes != int64(len(in)) || st.Stdout.KeptBytes() != total || st.Stdout.FailedBytes != 0 || st.Stdout.CutAt.IsZero() {
			t.Fatalf("cap %d: counts %+v, %d kept", maxBytes, st.Stdout, total)
		}
	}
}

// The pump finishes on its own once the writers are gone, and within its grace when a
// process it cannot kill still holds a pipe.
func TestPumpFinishIsBounded(t *testing.T) {
	dir := t.TempDir()
	dirfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirfd)
	p, err := startPump(dirfd, 0)
	if err != nil {
		t.Fatal(err)
	}
	outFD, _ := p.childFDs()
	held, err := unix.Dup(outFD)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(held)
	unix.Write(held, []byte("still here\n"))
	start := time.Now()
	st := p.finish(300 * time.Millisecond)
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("finish took %s", took)
	}
	if st.Stdout.WrittenBytes != 11 || st.MaxBytes != records.DefaultLogMaxBytes {
		t.Fatalf("counts %+v", st)
	}
}
