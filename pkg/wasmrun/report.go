package wasmrun

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/bytecodealliance/wasmtime-go/v39"
	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/containment/roostinit"
	"roost.dev/roost/pkg/records"
)

// Report is what roost-wasm writes on the report pipe (roostinit.OutcomeFDEnv) when a
// guest ends abnormally: a trap, fuel exhaustion, its deadline, or memory refused.
type Report = records.Outcome

// Report statuses.
const (
	StatusCrashed         = records.OutcomeCrashed
	StatusDeadlineReached = records.OutcomeDeadlineReached
	StatusFuelExhausted   = records.OutcomeFuelExhausted
	StatusMemoryRefused   = records.OutcomeMemoryRefused
)

// Bounds of a report's fields, in bytes.
const (
	maxDetail    = 1 << 10
	maxBacktrace = 8 << 10
)

// reportFromEnv is the report pipe roostinit.OutcomeFDEnv names, or nil: when the variable
// names no open descriptor (checked before the runner opens any file, which could take
// its number), or one of 0-2 (a report must not land in the guest's output).
func reportFromEnv() io.WriteCloser {
	v := os.Getenv(roostinit.OutcomeFDEnv)
	if v == "" {
		return nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "report")
}

// writeReport writes rep as one JSON object (and a newline) to w, bounding its fields.
func writeReport(w io.Writer, rep Report) error {
	rep.Detail = truncate(oneLine(rep.Detail), maxDetail)
	rep.Backtrace = truncate(rep.Backtrace, maxBacktrace)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(rep); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// truncate cuts s to at most n bytes on a rune boundary, ending it with "…" when cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// oneLine joins s's non-empty lines with "; ".
func oneLine(s string) string {
	var parts []string
	for line := range strings.Lines(s) {
		if line = strings.TrimSpace(line); line != "" {
			parts = append(parts, line)
		}
	}
	return strings.Join(parts, "; ")
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// trapText splits what wasmtime says of a trap into its cause ("wasm trap: wasm
// `unreachable` instruction executed", with what led to it in parentheses) and the
// guest's wasm backtrace, one frame a line, the middle of a long one elided. wasmtime's
// message reads "error while executing at wasm backtrace: <frames> Caused by: <causes>
// [Stack backtrace: <the host's frames>]"; the host's frames are dropped.
func trapText(err error) (cause, backtrace string) {
	msg := err.Error()
	if i := strings.Index(msg, "\nStack backtrace:"); i >= 0 {
		msg = msg[:i]
	}
	head, causes, found := strings.Cut(msg, "\nCaused by:")
	if !found {
		head, causes = "", msg
	}
	cause = causeLine(causes)
	var frames []string
	if _, text, ok := strings.Cut(head, "wasm backtrace:"); ok {
		for line := range strings.Lines(text) {
			line = strings.TrimRight(line, "\r\n")
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "note:") {
				frames = append(frames, line)
			}
		}
	}
	var trap *wasmtime.Trap
	if len(frames) == 0 && errors.As(err, &trap) {
		frames = framesText(trap.Frames())
	}
	return cause, strings.Join(elide(frames, maxFramesHead, maxFramesTail), "\n")
}

// How many of a backtrace's innermost and outermost frames are kept: a stack overflow's
// runs to tens of thousands.
const (
	maxFramesHead = 40
	maxFramesTail = 10
)

// elide keeps the first head and last tail of lines, saying how many are left out.
func elide(lines []string, head, tail int) []string {
	if len(lines) <= head+tail+1 {
		return lines
	}
	out := append([]string{}, lines[:head]...)
	out = append(out, fmt.Sprintf("      … %d frames elided …", len(lines)-head-tail))
	return append(out, lines[len(lines)-tail:]...)
}

// causeLine makes wasmtime's chain of causes one line: the trap itself ("wasm trap: …",
// the last cause) first, what led to it after, in parentheses. A chain is numbered
// ("0: memory fault at …", "1: wasm trap: out of bounds memory access").
func causeLine(causes string) string {
	var parts []string
	for line := range strings.Lines(causes) {
		line = strings.TrimSpace(line)
		if i := strings.Index(line, ": "); i > 0 && strings.Trim(line[:i], "0123456789") == "" {
			line = line[i+2:]
		}
		if line != "" {
			parts = append(parts, line)
		}
	}
	if len(parts) < 2 {
		return strings.Join(parts, "")
	}
	last := parts[len(parts)-1]
	return last + " (" + strings.Join(parts[:len(parts)-1], "; ") + ")"
}

// framesText is a trap's frames as wasmtime prints them, when its message has none.
func framesText(frames []*wasmtime.Frame) []string {
	var lines []string
	for i, f := range frames {
		module, name := "<unknown>", fmt.Sprintf("<wasm function %d>", f.FuncIndex())
		if m := f.ModuleName(); m != nil {
			module = *m
		}
		if n := f.FuncName(); n != nil {
			name = *n
		}
		lines = append(lines, fmt.Sprintf("%4d: %#8x - %s!%s", i, f.ModuleOffset(), module, name))
	}
	return lines
}
