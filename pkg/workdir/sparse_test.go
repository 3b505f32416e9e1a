package workdir_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/workdir"
)

// extent is a run of a file's data, as SEEK_DATA and SEEK_HOLE find it.
type extent struct{ off, end int64 }

func extents(t testing.TB, path string) []extent {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	var out []extent
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, extent{data, hole})
		off = hole
	}
	return out
}

func allocated(t testing.TB, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// sparseFile makes a file of size bytes holding data at each of offs (the rest holes),
// and says whether this filesystem keeps holes at all.
func sparseFile(t testing.TB, path string, size int64, data []byte, offs ...int64) bool {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, off := range offs {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return allocated(t, path) < size/2
}

// slack is what a copy may allocate beyond its source: a few blocks of filesystem
// metadata (extent tree) or rounding.
const slack = 16 << 10

// A parent's 1 GiB sparse file holding 1 MiB of data is copied as what it holds: the copy
// allocates what the source does, and reads back byte for byte the same, data where the
// source has data, zeros in its holes, up to the same size.
func TestCopyKeepsSparseFilesSparse(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	data := make([]byte, 1<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	files := map[string][]int64{
		// 1 MiB of data in the middle of 1 GiB.
		"middle": {512 << 20},
		// Data at both ends, a hole between: the copy must not end short.
		"ends": {0, 1<<30 - 1<<20},
		// Data at the start, a hole to the end: only ftruncate gives the copy its size.
		"tail": {0},
	}
	for name, offs := range files {
		if !sparseFile(t, filepath.Join(src, name), 1<<30, data, offs...) {
			testenv.Need(t, "a temporary filesystem that keeps holes", errors.New("a sparse file took its full size"))
		}
	}
	if err := workdir.Copy(src, dst, workdir.Limits{}); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		from, to := filepath.Join(src, name), filepath.Join(dst, name)
		a, b := allocated(t, from), allocated(t, to)
		t.Logf("%s: the source allocates %d bytes, the copy %d", name, a, b)
		if b > a+slack {
			t.Errorf("%s: the copy allocates %d bytes, its source %d: the holes were written", name, b, a)
		}
		fi, err := os.Stat(to)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != 1<<30 {
			t.Errorf("%s: the copy is %d bytes, want %d", name, fi.Size(), int64(1<<30))
		}
		// Where the copy has data it is the source's, and everywhere else both read as
		// zeros: the holes of the one are holes, or zeros, in the other.
		sameBytes(t, name, from, to, extents(t, from), extents(t, to))
	}
}

// sameBytes compares two files over the data extents of either.
func sameBytes(t *testing.T, name, from, to string, a, b []extent) {
	t.Helper()
	f, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := os.Open(to)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, e := range append(a, b...) {
		x, y := make([]byte, e.end-e.off), make([]byte, e.end-e.off)
		if _, err := f.ReadAt(x, e.off); err != nil {
			t.Fatal(err)
		}
		if _, err := g.ReadAt(y, e.off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Fatalf("%s: the copy differs from its source in [%d, %d)", name, e.off, e.end)
		}
	}
}

// A copy given a limit stops before it allocates past it, however the tree got there: here
// two files where the room is for one, as a tree whose owner filled its holes after it was
// measured would be. The error says where and how far it got; nothing past the limit is
// written.
func TestCopyStopsAtItsLimit(t *testing.T) {
	src := t.TempDir()
	data := make([]byte, 256<<10)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(src, "a"), string(data), 0o644)
	writeFile(t, filepath.Join(src, "b"), string(data), 0o644)
	for _, c := range []struct {
		lim  workdir.Limits
		want string
	}{
		// Room for one file's data and its blocks, not two.
		{workdir.Limits{Bytes: 400 << 10}, "more would pass the 409600 it may take"},
		{workdir.Limits{Inodes: 1}, "1 files and directories copied, the most it may make"},
	} {
		dst := t.TempDir()
		err := workdir.Copy(src, dst, c.lim)
		var le *workdir.LimitError
		// Whichever the directory lists second is the one refused.
		if !errors.Is(err, workdir.ErrPastLimit) || !errors.As(err, &le) || le.Rel != "a" && le.Rel != "b" || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("a copy of two files within %+v: %v", c.lim, err)
		}
		if le.Inodes != (c.lim.Inodes > 0) {
			t.Errorf("the copy stopped at %+v, said inodes %v", c.lim, le.Inodes)
		}
		used, err := workdir.Measure([]string{dst}, workdir.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		// dst's own directory is the caller's, not the copy's.
		used.Bytes -= allocated(t, dst)
		if c.lim.Bytes > 0 && used.Bytes > c.lim.Bytes {
			t.Errorf("the copy allocated %d bytes, past its limit of %d", used.Bytes, c.lim.Bytes)
		}
		first := map[string]string{"a": "b", "b": "a"}[le.Rel]
		if got := readFile(t, filepath.Join(dst, first)); got != string(data) {
			t.Errorf("%s, copied within the limit, holds %d bytes", first, len(got))
		}
		if c.lim.Bytes > 0 {
			if got := allocated(t, filepath.Join(dst, le.Rel)); got != 0 {
				t.Errorf("%s, the file past the limit, allocates %d bytes", le.Rel, got)
			}
		} else if _, err := os.Lstat(filepath.Join(dst, le.Rel)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s, one entry past the limit, was made: %v", le.Rel, err)
		}
	}
}

// BenchmarkCopySparse copies a 1 GiB file holding 1 MiB of data: the cost is the data's,
// not the file's size.
func BenchmarkCopySparse(b *testing.B) {
	src := b.TempDir()
	data := make([]byte, 1<<20)
	if _, err := rand.Read(data); err != nil {
		b.Fatal(err)
	}
	if !sparseFile(b, filepath.Join(src, "sparse"), 1<<30, data, 512<<20) {
		testenv.Need(b, "a temporary filesystem that keeps holes", errors.New("a sparse file took its full size"))
	}
	base := b.TempDir()
	var alloc int64
	i := 0
	for b.Loop() {
		dst := filepath.Join(base, strconv.Itoa(i))
		i++
		if err := os.Mkdir(dst, 0o700); err != nil {
			b.Fatal(err)
		}
		if err := workdir.Copy(src, dst, workdir.Limits{Bytes: 2 << 20}); err != nil {
			b.Fatal(err)
		}
		alloc = allocated(b, filepath.Join(dst, "sparse"))
		if err := os.RemoveAll(dst); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(alloc), "allocated-B/op")
}
