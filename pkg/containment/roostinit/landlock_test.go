package roostinit

import (
	"bytes"
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"roost.dev/roost/pkg/containment/sysview"
)

// roost-exec reads the head of every file bound for the exec allowlist, as root, and a
// capsule writes those files: whatever they hold, reading them must not fail roost-exec,
// and what it finds must be what the kernel would use.
func FuzzInterpreters(f *testing.F) {
	for _, p := range []string{"/bin/sh", "/usr/bin/env", "/usr/bin/true"} {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data[:min(len(data), 8192)])
		}
	}
	f.Add([]byte("#!/bin/sh\necho hi\n"))
	f.Add([]byte("#!/usr/bin/env -S python3 -u\n"))
	f.Add([]byte("#!\n"))
	f.Add([]byte("#! /\t x\x00y"))
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		file := filepath.Join(dir, "f")
		if err := os.WriteFile(file, data, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := interpreters(file)
		if rest, ok := bytes.CutPrefix(data, []byte("#!")); ok {
			name, _ := sysview.Shebang(rest[:min(len(rest), scriptHead-2)])
			switch {
			case name == "" && err == nil:
				t.Fatalf("an empty #! line was accepted: %q", data)
			case name != "" && (err != nil || len(got) == 0 || got[0].name != name):
				t.Fatalf("#! line %q: got %+v, %v; want %q first", data, got, err, name)
			case strings.ContainsAny(name, " \t\n\x00"):
				t.Fatalf("interpreter %q holds a separator", name)
			}
			return
		}
		// What debug/elf, reading the whole file, finds as the loader must be what the
		// program-header reader finds.
		e, eerr := elf.NewFile(bytes.NewReader(data))
		if eerr != nil {
			return
		}
		for _, p := range e.Progs {
			if p.Type != elf.PT_INTERP || p.Filesz == 0 || p.Filesz > 4096 {
				continue
			}
			want := make([]byte, p.Filesz)
			if n, _ := p.ReadAt(want, 0); n != len(want) {
				return
			}
			w, _, _ := strings.Cut(string(want), "\x00")
			if w == "" {
				return
			}
			if err != nil || len(got) != 1 || got[0].name != w {
				t.Fatalf("ELF loader: got %+v, %v; debug/elf says %q", got, err, w)
			}
			return
		}
	})
}
