// Package termtext makes a session's output safe to show on an operator's terminal. A
// terminal obeys the control sequences in what it is given: a session that prints OSC 52
// writes the operator's clipboard, OSC 0 retitles the window, CSI sequences move the cursor,
// clear the screen or hide what came before, and some terminals answer queries by typing
// into their input. A session's output is the session's, not the operator's, so on a
// terminal roostctl shows those bytes as text (\x1b) instead of handing them over.
//
// Kept as they are: printable text, \n, \t and \r (so lines, columns and progress bars
// still work). Escaped: every other C0 control and DEL as \xHH, the C1 controls
// U+0080–U+009F as \u00HH, and every byte that is not part of valid UTF-8 as \xHH (a lone
// 0x9b is CSI to a terminal reading 8-bit controls). Backslashes are left alone: escaping
// is for the terminal's sake, not for reading the bytes back.
package termtext

import (
	"io"
	"unicode/utf8"
)

const hex = "0123456789abcdef"

// Append appends src to dst escaped, and says how many bytes of src it took. Unless atEOF,
// a valid UTF-8 sequence cut short by the end of src is left for the next call (at most
// utf8.UTFMax-1 bytes), so where a stream is cut into chunks never changes what is shown.
func Append(dst, src []byte, atEOF bool) (out []byte, consumed int) {
	i := 0
	for i < len(src) {
		b := src[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != 0x7f || b == '\n' || b == '\t' || b == '\r' {
				// Runs of plain ASCII, the common case, are copied whole.
				j := i + 1
				for j < len(src) && src[j] >= 0x20 && src[j] < 0x7f {
					j++
				}
				dst = append(dst, src[i:j]...)
				i = j
				continue
			}
			dst = append(dst, '\\', 'x', hex[b>>4], hex[b&0xf])
			i++
			continue
		}
		if !atEOF && !utf8.FullRune(src[i:]) {
			break
		}
		r, size := utf8.DecodeRune(src[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, '\\', 'x', hex[b>>4], hex[b&0xf])
		case r >= 0x80 && r <= 0x9f:
			dst = append(dst, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
		default:
			dst = append(dst, src[i:i+size]...)
		}
		i += size
	}
	return dst, i
}

// String is s escaped whole.
func String(s string) string {
	out, _ := Append(nil, []byte(s), true)
	return string(out)
}

// Writer escapes what is written to it before passing it on. Flush writes out a sequence
// still held for its end, once no more is coming.
type Writer struct {
	w io.Writer
	// held is the start of a UTF-8 sequence the last Write ended inside.
	held [utf8.UTFMax]byte
	n    int
	buf  []byte
	in   []byte
}

// NewWriter escapes for w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write escapes p and writes it on, but for a UTF-8 sequence p ends inside, which waits
// for the next Write or Flush. It counts p as written once w has taken all it was given.
func (e *Writer) Write(p []byte) (int, error) {
	src := p
	if e.n > 0 {
		e.in = append(append(e.in[:0], e.held[:e.n]...), p...)
		src = e.in
	}
	out, consumed := Append(e.buf[:0], src, false)
	e.n = copy(e.held[:], src[consumed:])
	e.buf = out[:0]
	if len(out) == 0 {
		return len(p), nil
	}
	if _, err := e.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes out what a Write left held, escaped as the end of the stream.
func (e *Writer) Flush() error {
	if e.n == 0 {
		return nil
	}
	out, _ := Append(e.buf[:0], e.held[:e.n], true)
	e.n = 0
	_, err := e.w.Write(out)
	return err
}
