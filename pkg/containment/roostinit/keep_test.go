package roostinit

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"testing"
	"time"

	"roost.dev/roost/pkg/records"
)

// What KeepOutput keeps of pipes roostd holds is what the records' reader serves: within
// the cap, the cut marked with the bound logs.json names; a nil stderr is an empty stream.
func TestKeepOutputNamesItsCap(t *testing.T) {
	dir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	const maxBytes = 64 << 10
	o, err := KeepOutput(dir, maxBytes, "a test's cap:", r, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	for i := range 20000 {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if _, err := w.Write(want.Bytes()); err != nil {
		t.Fatal(err)
	}
	w.Close()
	st := o.Finish(2 * time.Second)
	if !st.Final || st.Cap != "a test's cap:" || st.Stdout.WrittenBytes != int64(want.Len()) || st.Stdout.DroppedBytes == 0 || st.Stderr.WrittenBytes != 0 {
		t.Fatalf("counts: %+v", st)
	}
	var got bytes.Buffer
	reader, err := records.NewLogReader(dir, records.LogOptions{}, func(c records.LogChunk) error {
		got.Write(c.Data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if _, err := reader.Drain(func(c records.LogChunk) error { got.Write(c.Data); return nil }); err != nil {
		t.Fatal(err)
	}
	marker := regexp.MustCompile(fmt.Sprintf(`\n--- roost: %d bytes of stdout dropped here \(a test's cap: %d\) ---\n`, st.Stdout.DroppedBytes, maxBytes))
	if !marker.Match(got.Bytes()) || !bytes.HasPrefix(got.Bytes(), []byte("line 0\n")) || !bytes.HasSuffix(got.Bytes(), []byte("line 19999\n")) {
		t.Fatalf("kept %d bytes, without the marker or an end: %.100q ... %.100q", got.Len(), got.String(), got.String()[max(got.Len()-100, 0):])
	}
	if int64(got.Len()) > maxBytes+200 {
		t.Errorf("kept %d bytes under a cap of %d", got.Len(), maxBytes)
	}
}
