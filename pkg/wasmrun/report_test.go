package wasmrun

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncate(t *testing.T) {
	if got := truncate("short", 10); got != "short" {
		t.Fatal(got)
	}
	s := strings.Repeat("é", 600) // 1200 bytes
	got := truncate(s, maxDetail)
	if len(got) > maxDetail || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Fatalf("%d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}

func TestCauseLine(t *testing.T) {
	for in, want := range map[string]string{
		"\n    wasm trap: wasm `unreachable` instruction executed\n":                                                                      "wasm trap: wasm `unreachable` instruction executed",
		"\n    0: memory fault at wasm address 0xf4240 in linear memory of size 0x10000\n    1: wasm trap: out of bounds memory access\n": "wasm trap: out of bounds memory access (memory fault at wasm address 0xf4240 in linear memory of size 0x10000)",
		"exit with invalid exit status outside of [0..126)":                                                                               "exit with invalid exit status outside of [0..126)",
	} {
		if got := causeLine(in); got != want {
			t.Errorf("causeLine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTrapText(t *testing.T) {
	msg := "error while executing at wasm backtrace:\n    0:     0x29 - <unknown>!inner\n    1:     0x24 - <unknown>!<wasm function 0>\nnote: using the `WASMTIME_BACKTRACE_DETAILS=1` environment variable may show more debugging information\n\nCaused by:\n    wasm trap: wasm `unreachable` instruction executed\n\nStack backtrace:\n   0: anyhow::error::<impl core::convert::From<E> for anyhow::Error>::from\n   1: wasmtime_func_call"
	cause, bt := trapText(errors.New(msg))
	if cause != "wasm trap: wasm `unreachable` instruction executed" {
		t.Errorf("cause %q", cause)
	}
	if bt != "    0:     0x29 - <unknown>!inner\n    1:     0x24 - <unknown>!<wasm function 0>" {
		t.Errorf("backtrace %q", bt)
	}
}

func TestElide(t *testing.T) {
	var lines []string
	for i := range 1000 {
		lines = append(lines, fmt.Sprint(i))
	}
	got := elide(lines, 3, 2)
	if strings.Join(got, ",") != "0,1,2,      … 995 frames elided …,998,999" {
		t.Fatalf("%q", got)
	}
	if got := elide(lines[:6], 3, 2); len(got) != 6 {
		t.Fatalf("%q", got)
	}
}

func TestWriteReportBounds(t *testing.T) {
	var buf bytes.Buffer
	err := writeReport(&buf, Report{Status: StatusCrashed, Detail: strings.Repeat("a\n", 2000), Backtrace: strings.Repeat("<frame>\n", 5000)})
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := jsonUnmarshalStrict(buf.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Detail) > maxDetail || strings.Contains(rep.Detail, "\n") || len(rep.Backtrace) > maxBacktrace || !strings.HasPrefix(rep.Backtrace, "<frame>") {
		t.Fatalf("detail %d bytes, backtrace %d bytes", len(rep.Detail), len(rep.Backtrace))
	}
	if n := bytes.Count(buf.Bytes(), []byte("\n")); n != 1 || buf.Len() > 16<<10 {
		t.Fatalf("%d lines, %d bytes", n, buf.Len())
	}
}
