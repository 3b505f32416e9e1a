package sysview

import (
	"debug/elf"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkResolve works out the closure of @python, @git and @gcc on this host (the page
// cache warm: cold is without a Cache), together and each alone.
func BenchmarkResolve(b *testing.B) {
	all := presetWant(b)
	// presetWant's order: python3, git, then the gcc drivers, as and ld; then the trees.
	wants := []struct {
		name string
		w    Want
	}{
		{"python+git+gcc", all},
		{"python", Want{Files: all.Files[:1], ReadTrees: all.ReadTrees}},
		{"git", Want{Files: all.Files[1:2], ExecTrees: all.ExecTrees[:1]}},
		{"gcc", Want{Files: all.Files[2:], ExecTrees: all.ExecTrees[1:]}},
	}
	for _, tc := range wants {
		run := func(b *testing.B, o Options) {
			var c *Closure
			for b.Loop() {
				var err error
				if c, err = Resolve(tc.w, o); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(c.Files)), "files")
			b.ReportMetric(float64(len(c.Trees)), "trees")
			b.ReportMetric(float64(len(c.Links)), "links")
		}
		b.Run(tc.name+"/cold", func(b *testing.B) { run(b, Options{}) })
		b.Run(tc.name+"/warm", func(b *testing.B) {
			o := Options{Cache: NewCache()}
			if _, err := Resolve(tc.w, o); err != nil {
				b.Fatal(err)
			}
			run(b, o)
		})
	}
}

// BenchmarkReadELF reads the needs of every ELF file of the closure of @python, @git and
// @gcc: with the program-header reader Resolve uses, and with debug/elf.
func BenchmarkReadELF(b *testing.B) {
	c, err := Resolve(presetWant(b), Options{})
	if err != nil {
		b.Fatal(err)
	}
	var files []string
	for _, f := range c.Files {
		if info, err := readFile(unix.AT_FDCWD, f, false); err == nil && info.kind == kindELF {
			files = append(files, f)
		}
	}
	b.Run("program-headers", func(b *testing.B) {
		for b.Loop() {
			for _, f := range files {
				if _, err := readFile(unix.AT_FDCWD, f, false); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(len(files)), "files")
	})
	b.Run("debug-elf", func(b *testing.B) {
		for b.Loop() {
			for _, f := range files {
				e, err := elf.Open(f)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := e.ImportedLibraries(); err != nil {
					b.Fatal(err)
				}
				_, _ = e.DynString(elf.DT_RUNPATH)
				e.Close()
			}
		}
		b.ReportMetric(float64(len(files)), "files")
	})
}
