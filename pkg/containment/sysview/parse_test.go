package sysview

import (
	"bufio"
	"bytes"
	"debug/elf"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
)

// hostELFs are ELF files of this host to check the readers against: programs and
// libraries, at most n.
func hostELFs(t testing.TB, n int) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{"/usr/bin", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib/git-core"} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !e.Type().IsRegular() || len(out) >= n {
				continue
			}
			p := filepath.Join(dir, e.Name())
			head := make([]byte, 4)
			if f, err := os.Open(p); err == nil {
				_, _ = f.Read(head)
				f.Close()
			}
			if isELF(head) {
				out = append(out, p)
			}
		}
	}
	if len(out) == 0 {
		testenv.Need(t, "ELF files in /usr", os.ErrNotExist)
	}
	return out
}

// What the program-header reader finds is what debug/elf, reading the section headers,
// finds, for every ELF file of this host.
func TestParseELFMatchesDebugELF(t *testing.T) {
	files := hostELFs(t, 3000)
	checked := 0
	for _, p := range files {
		info, err := readFile(unix.AT_FDCWD, p, false)
		if err != nil {
			t.Fatal(err)
		}
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		o := info.elf
		if o.bad != "" {
			t.Errorf("%s: %s", p, o.bad)
			f.Close()
			continue
		}
		if o.class != f.Class || o.machine != f.Machine || o.data != f.Data {
			t.Errorf("%s: %v %v %v, debug/elf %v %v %v", p, o.class, o.machine, o.data, f.Class, f.Machine, f.Data)
		}
		if f.SectionByType(elf.SHT_DYNAMIC) != nil {
			needed, err := f.ImportedLibraries()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(o.needed, needed) && !(len(o.needed) == 0 && len(needed) == 0) {
				t.Errorf("%s: needs %q, debug/elf %q", p, o.needed, needed)
			}
			for tag, got := range map[elf.DynTag]string{elf.DT_RPATH: o.rpath, elf.DT_RUNPATH: o.runpath} {
				want, _ := f.DynString(tag)
				if strings.Join(want, ":") != got {
					t.Errorf("%s: %v %q, debug/elf %q", p, tag, got, want)
				}
			}
			checked++
		}
		var interp string
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				b := make([]byte, prog.Filesz)
				_, _ = prog.ReadAt(b, 0)
				interp, _, _ = strings.Cut(string(b), "\x00")
			}
		}
		if o.interp != interp {
			t.Errorf("%s: PT_INTERP %q, debug/elf %q", p, o.interp, interp)
		}
		f.Close()
	}
	if checked < 20 {
		t.Errorf("only %d dynamic objects checked", checked)
	}
}

// What parseLdCache reads of this host's cache is what ldconfig -p prints of it.
func TestParseLdCacheMatchesLdconfig(t *testing.T) {
	data, err := os.ReadFile("/etc/ld.so.cache")
	testenv.Need(t, "/etc/ld.so.cache", err)
	ldconfig, err := exec.LookPath("ldconfig")
	if err != nil {
		ldconfig = "/sbin/ldconfig"
	}
	out, err := exec.Command(ldconfig, "-p").Output()
	testenv.Need(t, "ldconfig", err)
	c, err := parseLdCache(data)
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Scan() // "N libs found in cache"
	for sc.Scan() {
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), " (")
		_, p, ok2 := strings.Cut(rest, " => ")
		if ok && ok2 {
			want = append(want, name+" "+p)
		}
	}
	for name, entries := range c.byName {
		for _, e := range entries {
			got = append(got, name+" "+e.path)
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("parsed %d entries, ldconfig -p lists %d:\n got %q\nwant %q", len(got), len(want), got, want)
	}
	// The flags pick this machine's entries: every one of libc.so.6's the loader would use
	// matches its ELF header.
	self, err := elf.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	a := abi{class: self.Class, data: self.Data, machine: self.Machine}
	self.Close()
	libc := c.lookup("libc.so.6", cacheFlags(a))
	if len(libc) == 0 && self.Machine == elf.EM_X86_64 {
		t.Errorf("no libc.so.6 for %v in the cache", a)
	}
	for _, p := range libc {
		f, err := elf.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if f.Class != a.class || f.Machine != a.machine {
			t.Errorf("%s is %v %v, taken for %v", p, f.Class, f.Machine, a)
		}
		f.Close()
	}
}

func TestParseLdCacheFormats(t *testing.T) {
	entries := []testCacheEntry{
		{"libc.so.6", 0x0303, "/lib/x86_64-linux-gnu/libc.so.6", 0},
		{"libz.so.1", 0x0303, "/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libz.so.1", 1<<62 | 1},
		{"libz.so.1", 0x0303, "/lib/x86_64-linux-gnu/libz.so.1", 0},
	}
	newFormat := ldCacheBytes(entries)
	// The compat format: an old-format table (of nothing the loader uses) before it, at
	// the next 8-byte boundary.
	old := append([]byte(oldMagic), 0, 1, 0, 0, 0)
	old = append(old, make([]byte, oldEntrySize)...)
	for len(old)%8 != 0 {
		old = append(old, 0)
	}
	compat := append(old, newFormat...)
	for name, data := range map[string][]byte{"new": newFormat, "compat": compat} {
		c, err := parseLdCache(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := c.lookup("libz.so.1", []int32{0x0303}); len(got) != 2 {
			t.Errorf("%s: libz.so.1: %q", name, got)
		}
		if got := c.lookup("libc.so.6", []int32{0x0a03}); len(got) != 0 {
			t.Errorf("%s: an aarch64 lookup found %q", name, got)
		}
	}
	bad := slices.Clone(newFormat)
	bad[28] = 1
	if _, err := parseLdCache(bad); err == nil {
		t.Error("a cache marked invalid was read")
	}
	if _, err := parseLdCache(newFormat[:60]); err == nil {
		t.Error("a truncated cache was read")
	}
}

// The cache is a file of the host's /etc, which a compromised package could write; parsing
// it must never fail other than with an error, and what it reads must be what a writer put.
func FuzzLdCache(f *testing.F) {
	// This host's cache, a few of its entries: the fuzzer stalls on seeds of tens of KiB.
	if data, err := os.ReadFile("/etc/ld.so.cache"); err == nil {
		if c, err := parseLdCache(data); err == nil {
			var some []testCacheEntry
			for _, name := range slices.Sorted(maps.Keys(c.byName)) {
				for _, e := range c.byName[name] {
					if len(some) < 12 {
						some = append(some, testCacheEntry{name: name, flags: e.flags, path: e.path})
					}
				}
			}
			f.Add(ldCacheBytes(some))
		}
	}
	f.Add(ldCacheBytes([]testCacheEntry{{"libc.so.6", 0x0303, "/lib/libc.so.6", 0}, {"liba.so", 1, "/a", 1 << 62}}))
	f.Add(ldCacheBytes(nil))
	f.Add(append([]byte(oldMagic), 1, 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
	f.Add([]byte(newMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseLdCache(data)
		if err != nil {
			return
		}
		var entries []testCacheEntry
		for name, es := range c.byName {
			for _, e := range es {
				if strings.ContainsRune(name, 0) || strings.ContainsRune(e.path, 0) {
					t.Fatalf("a string holds a NUL: %q %q", name, e.path)
				}
				entries = append(entries, testCacheEntry{name: name, flags: e.flags, path: e.path})
			}
		}
		if len(entries) > len(data)/oldEntrySize {
			t.Fatalf("%d entries from %d bytes", len(entries), len(data))
		}
		// Written again and read back, the entries are the same.
		again, err := parseLdCache(ldCacheBytes(entries))
		if err != nil {
			t.Fatalf("a cache of what was read cannot be read: %v", err)
		}
		for name, es := range c.byName {
			if len(again.byName[name]) != len(es) {
				t.Fatalf("%s: %d entries, %d read back", name, len(es), len(again.byName[name]))
			}
		}
	})
}

// The loader reads every library a session's closure holds, and this reads them first: as
// root, in the daemon. Whatever an ELF file holds, reading it must cost little and not
// fail, and where debug/elf reads the same program headers it finds the same loader.
func FuzzDynamic(f *testing.F) {
	// The smallest dynamic objects of this host: the fuzzer stalls on seeds much larger.
	added := 0
	for _, p := range hostELFs(f, 3000) {
		if st, err := os.Stat(p); err == nil && st.Size() < 20<<10 && added < 3 {
			if data, err := os.ReadFile(p); err == nil {
				f.Add(data)
				added++
			}
		}
	}
	f.Add(fakeELF{interp: "/lib64/ld-linux-x86-64.so.2", needed: []string{"libc.so.6", "libm.so.6"}, runpath: "$ORIGIN/../lib"}.bytes())
	f.Add(fakeELF{class: elf.ELFCLASS32, machine: elf.EM_386, needed: []string{"libc.so.6"}, rpath: "/opt/lib", nodeflib: true}.bytes())
	f.Add(fakeELF{hasRunpath: true}.bytes())
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := parseELF(bytes.NewReader(data), data[:min(len(data), headSize)])
		if err != nil {
			return
		}
		for _, n := range o.needed {
			if n == "" || strings.ContainsRune(n, 0) || len(n) > maxString {
				t.Fatalf("needed %q", n)
			}
		}
		if strings.ContainsRune(o.interp, 0) || strings.ContainsRune(o.rpath, 0) || strings.ContainsRune(o.runpath, 0) {
			t.Fatalf("a NUL in %q %q %q", o.interp, o.rpath, o.runpath)
		}
		if o.bad != "" {
			return
		}
		// debug/elf without the section headers, which this never reads and which make
		// debug/elf allocate what they claim (megabytes, for each of the fuzzer's inputs).
		phdrsOnly := bytes.Clone(data)
		if len(phdrsOnly) >= 64 && elf.Class(phdrsOnly[elf.EI_CLASS]) == elf.ELFCLASS64 {
			clear(phdrsOnly[40:48])
			clear(phdrsOnly[58:64])
		} else if len(phdrsOnly) >= 52 {
			clear(phdrsOnly[32:36])
			clear(phdrsOnly[46:52])
		}
		e, err := elf.NewFile(bytes.NewReader(phdrsOnly))
		if err != nil {
			return
		}
		for _, p := range e.Progs {
			if p.Type != elf.PT_INTERP {
				continue
			}
			b := make([]byte, min(p.Filesz, maxString))
			if n, _ := p.ReadAt(b, 0); n != len(b) {
				return
			}
			want, _, _ := strings.Cut(string(b), "\x00")
			if want != o.interp {
				t.Fatalf("PT_INTERP %q, debug/elf %q", o.interp, want)
			}
			return
		}
	})
}
