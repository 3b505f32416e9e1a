package containment_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/records"
)

// Output is held to resources.log_max_bytes by roost-init, which drains the program's pipes
// and never makes it wait on the records: the head and the newest bytes are kept, the
// counts say what was written and dropped.

// floodLines is how many numbered lines the flood writes: seq 1 floodLines is just over
// 1 GiB.
const floodLines = 120_000_000

// seqOffset is where line k (numbered from 1) of `seq 1 n` begins.
func seqOffset(k int64) int64 {
	var off int64
	for digits, lo := int64(1), int64(1); lo < k; digits, lo = digits+1, lo*10 {
		hi := min(lo*10, k)
		off += (hi - lo) * (digits + 1)
	}
	return off
}

// seqPrefix is the first n bytes of seq's output.
func seqPrefix(n int) []byte {
	var b bytes.Buffer
	for i := 1; b.Len() < n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.Bytes()[:n]
}

// dirSize adds up the sizes of the files in dir.
func dirSize(t *testing.T, dir string) int64 {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			total += info.Size()
		}
	}
	return total
}

// streamFiles reads a stream's files from the records directory.
func streamFiles(t *testing.T, dir, stream string) ([]records.LogFile, [][]byte) {
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

// checkFlood checks what a session that ran `seq 1 floodLines` under a cap of maxBytes left.
func checkFlood(t *testing.T, s containment.Spec, info containment.ExitInfo, maxBytes int64, took time.Duration) {
	t.Helper()
	total := seqOffset(floodLines + 1)
	t.Logf("%d bytes through the pump in %s (%.0f MB/s); records hold %d bytes", total, took.Round(time.Millisecond), float64(total)/took.Seconds()/1e6, dirSize(t, s.RecordsDir))
	if info.Code != 0 || info.Signal != 0 {
		t.Fatalf("exit %+v", info)
	}
	if size := dirSize(t, s.RecordsDir); size > maxBytes+1<<20 {
		t.Fatalf("the records directory holds %d bytes, past the cap %d + 1 MiB", size, maxBytes)
	}
	files, data := streamFiles(t, s.RecordsDir, records.StdoutStream)
	if len(files) < 2 || files[0].Name != containment.StdoutFile {
		t.Fatalf("stdout files %+v", files)
	}
	// The head is how it started, byte for byte.
	head := data[0]
	if len(head) == 0 || len(head) > 1<<20 || !bytes.Equal(head, seqPrefix(len(head))) {
		t.Fatalf("the head (%d bytes) is not the first bytes written: %.40q", len(head), head)
	}
	// The tail is one run of the newest bytes, ending with the last line.
	var tail []byte
	for i := 1; i < len(files); i++ {
		if i > 1 && files[i].Offset != files[i-1].Offset+int64(len(data[i-1])) {
			t.Fatalf("a gap inside the tail before %s", files[i].Name)
		}
		tail = append(tail, data[i]...)
	}
	if files[len(files)-1].Offset+int64(len(data[len(data)-1])) != total {
		t.Fatalf("the tail ends at %d, the stream at %d", files[len(files)-1].Offset+int64(len(data[len(data)-1])), total)
	}
	first := bytes.IndexByte(tail, '\n') + 1
	lines := strings.Split(strings.TrimSuffix(string(tail[first:]), "\n"), "\n")
	n, err := strconv.ParseInt(lines[0], 10, 64)
	if err != nil || seqOffset(n) != files[1].Offset+int64(first) {
		t.Fatalf("the tail's first whole line %q is not at its offset", lines[0])
	}
	for i, l := range lines {
		if l != strconv.FormatInt(n+int64(i), 10) {
			t.Fatalf("tail line %d is %q, want %d", i, l, n+int64(i))
		}
	}
	if last := lines[len(lines)-1]; last != strconv.Itoa(floodLines) {
		t.Fatalf("the newest line is %q", last)
	}
	keptBytes := int64(len(head) + len(tail))
	if keptBytes > maxBytes || keptBytes < maxBytes/2 {
		t.Fatalf("%d bytes kept of a cap of %d", keptBytes, maxBytes)
	}
	// The counts: everything written, everything not kept dropped.
	st, err := records.ReadLogStats(s.RecordsDir)
	if err != nil {
		t.Fatal(err)
	}
	want := records.StreamStats{WrittenBytes: total, DroppedBytes: total - keptBytes, CutAt: st.Stdout.CutAt}
	if !st.Final || st.MaxBytes != maxBytes || st.Stdout != want || st.Stdout.CutAt.IsZero() || st.Stderr != (records.StreamStats{}) {
		t.Fatalf("logs.json %+v, want stdout %+v", st, want)
	}
	if onDisk, err := containment.ReadExit(s.RecordsDir); err != nil || onDisk.Logs == nil || onDisk.Logs.Stdout != st.Stdout {
		t.Fatalf("exit.json %+v %v", onDisk, err)
	}
}

const floodScript = "seq 1 120000000"

func TestLogCapFloodAdvisory(t *testing.T) {
	const maxBytes = 4 << 20
	s := kit.Spec(t, "/bin/sh", "-c", floodScript)
	s.LogMaxBytes = maxBytes
	start := time.Now()
	p, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	info := testkit.WaitDone(t, p)
	checkFlood(t, s, info, maxBytes, time.Since(start))
}

func TestLogCapFloodScoped(t *testing.T) {
	const maxBytes = 4 << 20
	start := time.Now()
	info, _, _, s := kit.ScopedRun(t, fmt.Sprintf("capabilities: {containment: scoped, shell: {allow: [seq]}, resources: {log_max_bytes: %d}}", maxBytes), floodScript)
	checkFlood(t, s, info, maxBytes, time.Since(start))
}

func TestLogCapFloodSealed(t *testing.T) {
	const maxBytes = 4 << 20
	start := time.Now()
	info, _, _, s := kit.SealedRun(t, fmt.Sprintf("capabilities: {containment: sealed, shell: {allow: [seq]}, resources: {log_max_bytes: %d}}", maxBytes), floodScript)
	checkFlood(t, s, info, maxBytes, time.Since(start))
}

// A program that writes a little is recorded byte for byte, as before the cap, with exact
// counts; binary output and a stream closed early included.
func TestLogSmallOutputVerbatim(t *testing.T) {
	script := `printf 'one\n\000\377\r\ntwo'; printf 'warn\n' >&2; exec 1>&-; printf 'late\n' >&2`
	wantOut, wantErr := "one\n\x00\xff\r\ntwo", "warn\nlate\n"
	check := func(t *testing.T, s containment.Spec, out, errOut string) {
		t.Helper()
		if out != wantOut || errOut != wantErr {
			t.Fatalf("stdout %q, stderr %q", out, errOut)
		}
		st, err := records.ReadLogStats(s.RecordsDir)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Final || st.Stdout != (records.StreamStats{WrittenBytes: int64(len(wantOut))}) || st.Stderr != (records.StreamStats{WrittenBytes: int64(len(wantErr))}) {
			t.Fatalf("logs.json %+v", st)
		}
		for _, stream := range []string{records.StdoutStream, records.StderrStream} {
			if files, _ := streamFiles(t, s.RecordsDir, stream); len(files) != 1 {
				t.Fatalf("%s files %+v", stream, files)
			}
		}
	}
	t.Run("advisory", func(t *testing.T) {
		s := kit.Spec(t, "/bin/sh", "-c", script)
		p, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		if info := testkit.WaitDone(t, p); info.Code != 0 {
			t.Fatalf("exit %+v", info)
		}
		check(t, s, testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile)), testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StderrFile)))
	})
	t.Run("sealed", func(t *testing.T) {
		info, out, errOut, s := kit.SealedRun(t, "capabilities: {containment: sealed}", script)
		if info.Code != 0 {
			t.Fatalf("exit %+v", info)
		}
		check(t, s, out, errOut)
	})
}

// A background process that keeps the program's stdout after it exits does not hold the
// session: roost-init kills it, drains what it wrote, and records the final counts.
func TestLogOrphanHoldsThePipe(t *testing.T) {
	s := kit.Spec(t, "/bin/sh", "-c", `(trap '' TERM HUP; while :; do echo orphan; sleep 0.01; done) & sleep 0.2; echo parent; exit 3`)
	start := time.Now()
	p, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	info := testkit.WaitDone(t, p)
	if took := time.Since(start); info.Code != 3 || took > 5*time.Second {
		t.Fatalf("exit %+v after %s", info, took)
	}
	out := testkit.ReadFile(t, filepath.Join(s.RecordsDir, containment.StdoutFile))
	st, err := records.ReadLogStats(s.RecordsDir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "orphan\n") || !strings.Contains(out, "parent\n") || !st.Final || st.Stdout != (records.StreamStats{WrittenBytes: int64(len(out))}) {
		t.Fatalf("stdout %q, logs.json %+v", out, st)
	}
}

// A full disk under the records loses output, never the program's pace or its end: the
// bytes that could not be written are counted, what follows once there is room is kept
// (the gap between files), and exit.json records the exact exit code.
func TestLogDiskFull(t *testing.T) {
	testkit.NeedRoot(t)
	s := kit.Spec(t, "/bin/sh", "-c", `head -c 3000000 /dev/zero | tr '\000' x; echo; touch wrote; while [ ! -e go ]; do sleep 0.02; done; echo after; exit 7`)
	if err := unix.Mount("tmpfs", s.RecordsDir, "tmpfs", 0, "size=4m,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(s.RecordsDir, unix.MNT_DETACH) })
	// Leave about 256 KiB: the head begins, then the disk is full.
	filler := filepath.Join(s.RecordsDir, "filler")
	if err := os.WriteFile(filler, make([]byte, 4<<20-256<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := kit.NewProcessRuntime(containment.SelfInit).Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	// 3 MB is more than the pipe holds: the program gets past it only if the pump kept
	// draining while its writes failed.
	testkit.WaitFile(t, filepath.Join(s.Dir, "wrote"))
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	info := testkit.WaitDone(t, p)
	if info.Code != 7 {
		t.Fatalf("exit %+v", info)
	}
	st, err := records.ReadLogStats(s.RecordsDir)
	if err != nil {
		t.Fatal(err)
	}
	files, data := streamFiles(t, s.RecordsDir, records.StdoutStream)
	var keptBytes int64
	for _, d := range data {
		keptBytes += int64(len(d))
	}
	t.Logf("logs.json %+v; files %+v", st.Stdout, files)
	const written = 3000001 + 6
	if !st.Final || st.Stdout.WrittenBytes != written || st.Stdout.FailedBytes == 0 || st.Stdout.DroppedBytes != st.Stdout.FailedBytes ||
		st.Stdout.KeptBytes() != keptBytes || st.Stdout.WriteError == "" || !st.Stdout.CutAt.IsZero() {
		t.Fatalf("logs.json %+v, %d bytes kept", st.Stdout, keptBytes)
	}
	last := files[len(files)-1]
	if string(data[len(data)-1]) != "after\n" || last.Offset != 3000001 {
		t.Fatalf("the output after the disk had room again: %s %.40q", last.Name, data[len(data)-1])
	}
	if !bytes.Equal(data[0], bytes.Repeat([]byte("x"), len(data[0]))) {
		t.Fatalf("the head is not the first bytes")
	}
}
