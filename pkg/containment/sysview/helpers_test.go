package sysview

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// fakeELF describes an ELF file for tests to write: as a linker lays a dynamic object out
// (program headers, interpreter, string table, dynamic section, one PT_LOAD over it all),
// with no section headers, which the loader never reads.
type fakeELF struct {
	class   elf.Class // ELFCLASS64 unless set
	machine elf.Machine
	interp  string
	needed  []string
	rpath   string
	runpath string
	// hasRunpath writes a DT_RUNPATH even when runpath is empty.
	hasRunpath bool
	nodeflib   bool
}

func (f fakeELF) bytes() []byte {
	is64 := f.class != elf.ELFCLASS32
	machine := f.machine
	if machine == 0 {
		machine = elf.EM_X86_64
	}
	bo := binary.LittleEndian
	ehsize, phentsize, dynent := 52, 32, 8
	if is64 {
		ehsize, phentsize, dynent = 64, 56, 16
	}
	nph := 2
	if f.interp != "" {
		nph++
	}
	off := ehsize + nph*phentsize
	interpOff := off
	if f.interp != "" {
		off += len(f.interp) + 1
	}
	strtab := []byte{0}
	str := func(s string) uint64 {
		i := len(strtab)
		strtab = append(append(strtab, s...), 0)
		return uint64(i)
	}
	type dyn struct {
		tag elf.DynTag
		val uint64
	}
	var dyns []dyn
	for _, n := range f.needed {
		dyns = append(dyns, dyn{elf.DT_NEEDED, str(n)})
	}
	if f.rpath != "" {
		dyns = append(dyns, dyn{elf.DT_RPATH, str(f.rpath)})
	}
	if f.runpath != "" || f.hasRunpath {
		dyns = append(dyns, dyn{elf.DT_RUNPATH, str(f.runpath)})
	}
	if f.nodeflib {
		dyns = append(dyns, dyn{elf.DT_FLAGS_1, uint64(elf.DF_1_NODEFLIB)})
	}
	strOff := off
	off += len(strtab)
	off = (off + 7) &^ 7
	dynOff := off
	dyns = append(dyns, dyn{elf.DT_STRTAB, uint64(strOff)}, dyn{elf.DT_STRSZ, uint64(len(strtab))}, dyn{elf.DT_NULL, 0})
	total := dynOff + len(dyns)*dynent
	b := make([]byte, total)
	copy(b, elf.ELFMAG)
	b[elf.EI_CLASS] = byte(elf.ELFCLASS32)
	if is64 {
		b[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	}
	b[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	b[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	bo.PutUint16(b[16:], uint16(elf.ET_DYN))
	bo.PutUint16(b[18:], uint16(machine))
	bo.PutUint32(b[20:], uint32(elf.EV_CURRENT))
	if is64 {
		bo.PutUint64(b[32:], uint64(ehsize))
		bo.PutUint16(b[52:], uint16(ehsize))
		bo.PutUint16(b[54:], uint16(phentsize))
		bo.PutUint16(b[56:], uint16(nph))
	} else {
		bo.PutUint32(b[28:], uint32(ehsize))
		bo.PutUint16(b[40:], uint16(ehsize))
		bo.PutUint16(b[42:], uint16(phentsize))
		bo.PutUint16(b[44:], uint16(nph))
	}
	ph := b[ehsize:]
	putPhdr := func(typ elf.ProgType, off, size uint64) {
		if is64 {
			bo.PutUint32(ph[0:], uint32(typ))
			bo.PutUint32(ph[4:], uint32(elf.PF_R))
			bo.PutUint64(ph[8:], off)
			bo.PutUint64(ph[16:], off)
			bo.PutUint64(ph[24:], off)
			bo.PutUint64(ph[32:], size)
			bo.PutUint64(ph[40:], size)
			bo.PutUint64(ph[48:], 8)
		} else {
			bo.PutUint32(ph[0:], uint32(typ))
			bo.PutUint32(ph[4:], uint32(off))
			bo.PutUint32(ph[8:], uint32(off))
			bo.PutUint32(ph[12:], uint32(off))
			bo.PutUint32(ph[16:], uint32(size))
			bo.PutUint32(ph[20:], uint32(size))
			bo.PutUint32(ph[24:], uint32(elf.PF_R))
			bo.PutUint32(ph[28:], 4)
		}
		ph = ph[phentsize:]
	}
	if f.interp != "" {
		putPhdr(elf.PT_INTERP, uint64(interpOff), uint64(len(f.interp)+1))
		copy(b[interpOff:], f.interp)
	}
	putPhdr(elf.PT_LOAD, 0, uint64(total))
	putPhdr(elf.PT_DYNAMIC, uint64(dynOff), uint64(len(dyns)*dynent))
	copy(b[strOff:], strtab)
	d := b[dynOff:]
	for _, e := range dyns {
		if is64 {
			bo.PutUint64(d, uint64(e.tag))
			bo.PutUint64(d[8:], e.val)
		} else {
			bo.PutUint32(d, uint32(e.tag))
			bo.PutUint32(d[4:], uint32(e.val))
		}
		d = d[dynent:]
	}
	return b
}

// testCacheEntry is an entry for writeLdCache.
type testCacheEntry struct {
	name  string
	flags int32
	path  string
	hwcap uint64
}

// ldCacheBytes writes a cache in glibc's new format, as ldconfig does: header, entries,
// then the strings, offsets counted from the header.
func ldCacheBytes(entries []testCacheEntry) []byte {
	var strs bytes.Buffer
	base := newHeaderSize + len(entries)*newEntrySize
	offs := map[string]uint32{}
	str := func(s string) uint32 {
		if o, ok := offs[s]; ok {
			return o
		}
		o := uint32(base + strs.Len())
		strs.WriteString(s)
		strs.WriteByte(0)
		offs[s] = o
		return o
	}
	bo := binary.LittleEndian
	b := make([]byte, base)
	copy(b, newMagic)
	bo.PutUint32(b[20:], uint32(len(entries)))
	b[28] = endianLittle
	for i, e := range entries {
		p := b[newHeaderSize+i*newEntrySize:]
		bo.PutUint32(p, uint32(e.flags))
		bo.PutUint32(p[4:], str(e.name))
		bo.PutUint32(p[8:], str(e.path))
		bo.PutUint64(p[16:], e.hwcap)
	}
	bo.PutUint32(b[24:], uint32(strs.Len()))
	return append(b, strs.Bytes()...)
}

// tree writes files beneath root: a value of []byte is a file's content (mode 0755), a
// string starting with "->" a symlink, "/" alone a directory.
func tree(t testing.TB, root string, files map[string]any) {
	t.Helper()
	for p, v := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch v := v.(type) {
		case []byte:
			err = os.WriteFile(full, v, 0o755)
		case string:
			if v == "/" {
				err = os.MkdirAll(full, 0o755)
			} else {
				err = os.Symlink(v[2:], full)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
