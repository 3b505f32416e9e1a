package termtext

import (
	"bytes"
	"slices"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text\n", "plain text\n"},
		{"tab\there\r\n", "tab\there\r\n"},
		// OSC 52 (the clipboard), OSC 0 (the title), CSI 2J (clear the screen).
		{"\x1b]52;c;aGVsbG8=\x07", `\x1b]52;c;aGVsbG8=\x07`},
		{"\x1b]0;title\x07", `\x1b]0;title\x07`},
		{"\x1b[2J", `\x1b[2J`},
		{"nul\x00bs\x08del\x7f", `nul\x00bs\x08del\x7f`},
		// C1 CSI as a character, and as a raw byte that is no UTF-8.
		{"\u009b2J", `\u009b2J`},
		{"\x9b2J", `\x9b2J`},
		{"\u0085 next line, \u00a0 no-break space", `\u0085 next line, ` + "\u00a0" + ` no-break space`},
		{"héllo, 世界, 🙂", "héllo, 世界, 🙂"},
		// A sequence cut short at the end, and one broken in the middle.
		{"end\xe4\xb8", `end\xe4\xb8`},
		{"a\xe4\xb8b", `a\xe4\xb8b`},
		// Overlong and surrogate encodings are no UTF-8.
		{"\xc0\x9b", `\xc0\x9b`},
		{"\xed\xa0\x80", `\xed\xa0\x80`},
		// U+FFFD itself is text.
		{"\ufffd", "\ufffd"},
		{`back\slash`, `back\slash`},
	} {
		if got := String(c.in); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// writeChunks writes in through a Writer cut at every offset in cuts.
func writeChunks(t testing.TB, in []byte, cuts []int) []byte {
	t.Helper()
	var out bytes.Buffer
	w := NewWriter(&out)
	prev := 0
	for _, c := range append(cuts, len(in)) {
		if c < prev || c > len(in) {
			continue
		}
		n, err := w.Write(in[prev:c])
		if err != nil || n != c-prev {
			t.Fatalf("Write(%q) = %d, %v", in[prev:c], n, err)
		}
		prev = c
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// A character split across writes is the same character; a byte that is no UTF-8 is
// escaped whether or not its stream was cut beside it.
func TestWriterChunks(t *testing.T) {
	in := []byte("世界\u009b🙂\x1b[2J\xe4\xb8 end\xf0\x9f")
	want := String(string(in))
	for i := 0; i <= len(in); i++ {
		for j := i; j <= len(in); j++ {
			if got := string(writeChunks(t, in, []int{i, j})); got != want {
				t.Fatalf("cut at %d and %d: %q, want %q", i, j, got, want)
			}
		}
	}
	// One byte at a time.
	var cuts []int
	for i := range in {
		cuts = append(cuts, i)
	}
	if got := string(writeChunks(t, in, cuts)); got != want {
		t.Fatalf("byte by byte: %q, want %q", got, want)
	}
}

// What a Write holds back waits for the next one: nothing of a split character is shown
// before the rest of it comes.
func TestWriterHoldsASplitCharacter(t *testing.T) {
	var out bytes.Buffer
	w := NewWriter(&out)
	w.Write([]byte("a\xe4"))
	if out.String() != "a" {
		t.Fatalf("after the first byte of 世: %q", out.String())
	}
	w.Write([]byte("\xb8\x96"))
	if out.String() != "a世" {
		t.Fatalf("after all of 世: %q", out.String())
	}
}

func FuzzWriter(f *testing.F) {
	f.Add([]byte("\x1b]52;c;aGVsbG8=\x07\x1b]0;title\x07\x1b[2J"), uint8(3), uint8(7))
	f.Add([]byte("世界\u009b\x9b🙂\xe4\xb8"), uint8(1), uint8(2))
	f.Add([]byte("plain\r\n\ttext"), uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, in []byte, a, b uint8) {
		whole := String(string(in))
		for i, r := range whole {
			if r == utf8.RuneError && !bytes.HasPrefix([]byte(whole[i:]), []byte("\ufffd")) {
				t.Fatalf("output is no UTF-8 at %d: %q", i, whole)
			}
			if (r < 0x20 && r != '\n' && r != '\t' && r != '\r') || (r >= 0x7f && r <= 0x9f) {
				t.Fatalf("raw control %U in %q (from %q)", r, whole, in)
			}
		}
		// Cut where the fuzzer says, and every a-th byte: the output may not depend on it.
		cuts := []int{int(a), int(a) + int(b)}
		if a > 0 {
			for i := int(b); i < len(in); i += int(a) {
				cuts = append(cuts, i)
			}
		}
		slices.Sort(cuts)
		if got := string(writeChunks(t, in, cuts)); got != whole {
			t.Fatalf("cut at %v: %q, whole: %q", cuts, got, whole)
		}
		if utf8.Valid(in) && !bytes.ContainsFunc(in, func(r rune) bool {
			return (r < 0x20 && r != '\n' && r != '\t' && r != '\r') || (r >= 0x7f && r <= 0x9f)
		}) && whole != string(in) {
			t.Fatalf("text without controls changed: %q became %q", in, whole)
		}
	})
}
