package sysview

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// elfObject is what the loader reads of an ELF file to place it and to follow its needs.
type elfObject struct {
	class   elf.Class
	data    elf.Data
	machine elf.Machine
	// flags is e_flags: on arm, riscv and loongarch it holds the float ABI, which picks
	// the ld.so.cache entries a library may come from.
	flags  uint32
	interp string // PT_INTERP, "" for none
	needed []string
	rpath  string
	// runpath is DT_RUNPATH; hasRunpath tells an empty one from none, since any DT_RUNPATH
	// at all turns DT_RPATH off.
	runpath    string
	hasRunpath bool
	// nodeflib is DF_1_NODEFLIB: the object was linked with -z nodeflib, and its needs are
	// not looked for in ld.so.cache or the default directories.
	nodeflib bool
	// bad says why the object's program headers or dynamic section cannot be read; the
	// fields above it are still good (a header fit to be matched against, nothing more).
	bad string
}

// Bounds on what the reader takes from a file: the kernel's on program headers, and on the
// rest sizes far beyond what linkers write, so a hostile file costs little.
const (
	maxPhdrBytes   = 64 << 10
	maxDynamicSize = 64 << 10
	maxString      = 4096
	maxPathString  = 64 << 10
	headSize       = 1024
)

// readerAt is what the ELF reader reads through: a descriptor on a host file, or the
// fuzzers' bytes.
type readerAt interface {
	ReadAt(p []byte, off int64) (int, error)
}

// isELF says whether head starts like an ELF file.
func isELF(head []byte) bool { return len(head) >= 4 && string(head[:4]) == elf.ELFMAG }

// parseELF reads an ELF file's header, program headers and dynamic section, as the loader
// does and no more (debug/elf would read every section header, and the section string
// table, too). head is the file's start, as much of it as was read; r reads the rest.
// The error is for a file that starts like ELF but whose header cannot be used at all;
// what is wrong past the header goes to the object's bad.
func parseELF(r readerAt, head []byte) (*elfObject, error) {
	if !isELF(head) {
		return nil, errors.New("not an ELF file")
	}
	if len(head) < 52 {
		return nil, errors.New("ELF header truncated")
	}
	o := &elfObject{class: elf.Class(head[elf.EI_CLASS]), data: elf.Data(head[elf.EI_DATA])}
	var bo binary.ByteOrder
	switch o.data {
	case elf.ELFDATA2LSB:
		bo = binary.LittleEndian
	case elf.ELFDATA2MSB:
		bo = binary.BigEndian
	default:
		return nil, fmt.Errorf("ELF data encoding %d unknown", o.data)
	}
	var phoff uint64
	var phentsize, phnum int
	switch o.class {
	case elf.ELFCLASS64:
		if len(head) < 64 {
			return nil, errors.New("ELF header truncated")
		}
		o.machine = elf.Machine(bo.Uint16(head[18:]))
		o.flags = bo.Uint32(head[48:])
		phoff, phentsize, phnum = bo.Uint64(head[32:]), int(bo.Uint16(head[54:])), int(bo.Uint16(head[56:]))
	case elf.ELFCLASS32:
		o.machine = elf.Machine(bo.Uint16(head[18:]))
		o.flags = bo.Uint32(head[36:])
		phoff, phentsize, phnum = uint64(bo.Uint32(head[28:])), int(bo.Uint16(head[42:])), int(bo.Uint16(head[44:]))
	default:
		return nil, fmt.Errorf("ELF class %d unknown", o.class)
	}
	if phnum == 0 {
		// A relocatable object or a core file: nothing to load, nothing needed.
		return o, nil
	}
	minEnt := 32
	if o.class == elf.ELFCLASS64 {
		minEnt = 56
	}
	if phentsize < minEnt || phnum*phentsize > maxPhdrBytes {
		o.bad = fmt.Sprintf("program headers unusable (%d of %d bytes)", phnum, phentsize)
		return o, nil
	}
	rd := reader{r: r, head: head}
	phdrs, err := rd.read(phoff, phnum*phentsize)
	if err != nil {
		o.bad = "program headers: " + err.Error()
		return o, nil
	}
	type segment struct{ off, vaddr, filesz uint64 }
	var loads []segment
	var dyn, interp *segment
	for i := 0; i < phnum; i++ {
		ph := phdrs[i*phentsize:]
		var s segment
		typ := elf.ProgType(bo.Uint32(ph))
		if o.class == elf.ELFCLASS64 {
			s = segment{off: bo.Uint64(ph[8:]), vaddr: bo.Uint64(ph[16:]), filesz: bo.Uint64(ph[32:])}
		} else {
			s = segment{off: uint64(bo.Uint32(ph[4:])), vaddr: uint64(bo.Uint32(ph[8:])), filesz: uint64(bo.Uint32(ph[16:]))}
		}
		switch typ {
		case elf.PT_LOAD:
			loads = append(loads, s)
		case elf.PT_DYNAMIC:
			if dyn == nil {
				dyn = &s
			}
		case elf.PT_INTERP:
			if interp == nil {
				interp = &s
			}
		}
	}
	if interp != nil {
		// The kernel takes at most PATH_MAX of it, up to the first NUL.
		b, err := rd.read(interp.off, int(min(interp.filesz, maxString)))
		if err != nil {
			o.bad = "PT_INTERP: " + err.Error()
			return o, nil
		}
		name, _, _ := bytes.Cut(b, []byte{0})
		if len(name) == 0 {
			o.bad = "PT_INTERP is empty"
			return o, nil
		}
		o.interp = string(name)
	}
	if dyn == nil || dyn.filesz == 0 {
		return o, nil
	}
	if dyn.filesz > maxDynamicSize {
		o.bad = fmt.Sprintf("dynamic section of %d bytes", dyn.filesz)
		return o, nil
	}
	d, err := rd.read(dyn.off, int(dyn.filesz))
	if err != nil {
		o.bad = "dynamic section: " + err.Error()
		return o, nil
	}
	entSize := 8
	if o.class == elf.ELFCLASS64 {
		entSize = 16
	}
	var needed []uint64
	var strtab, strsz, rpath, runpath uint64
	var haveStrtab, haveRpath bool
	for i := 0; i+entSize <= len(d); i += entSize {
		var tag int64
		var val uint64
		if o.class == elf.ELFCLASS64 {
			tag, val = int64(bo.Uint64(d[i:])), bo.Uint64(d[i+8:])
		} else {
			tag, val = int64(int32(bo.Uint32(d[i:]))), uint64(bo.Uint32(d[i+4:]))
		}
		switch elf.DynTag(tag) {
		case elf.DT_NULL:
			i = len(d)
		case elf.DT_NEEDED:
			if len(needed) < maxDynamicSize/8 {
				needed = append(needed, val)
			}
		case elf.DT_STRTAB:
			strtab, haveStrtab = val, true
		case elf.DT_STRSZ:
			strsz = val
		case elf.DT_RPATH:
			rpath, haveRpath = val, true
		case elf.DT_RUNPATH:
			runpath, o.hasRunpath = val, true
		case elf.DT_FLAGS_1:
			o.nodeflib = val&uint64(elf.DF_1_NODEFLIB) != 0
		}
	}
	if len(needed) == 0 && !haveRpath && !o.hasRunpath {
		return o, nil
	}
	if !haveStrtab {
		o.bad = "dynamic section has no DT_STRTAB"
		return o, nil
	}
	// DT_STRTAB is an address; the loader finds it in memory, a reader of the file through
	// the PT_LOAD segment holding it.
	strOff, found := uint64(0), false
	for _, s := range loads {
		if strtab >= s.vaddr && strtab-s.vaddr < s.filesz {
			strOff, found = strtab-s.vaddr+s.off, true
			break
		}
	}
	if !found {
		o.bad = fmt.Sprintf("DT_STRTAB %#x lies in no loaded segment", strtab)
		return o, nil
	}
	st := stringTable{rd: &rd, off: strOff, size: strsz}
	st.prefetch(needed, rpath, runpath, haveRpath, o.hasRunpath)
	o.needed = make([]string, 0, len(needed))
	for _, n := range needed {
		s, err := st.at(n, maxString)
		if err != nil {
			o.bad = "DT_NEEDED: " + err.Error()
			return o, nil
		}
		if s == "" {
			o.bad = "DT_NEEDED names nothing"
			return o, nil
		}
		o.needed = append(o.needed, s)
	}
	if haveRpath {
		if o.rpath, err = st.at(rpath, maxPathString); err != nil {
			o.bad = "DT_RPATH: " + err.Error()
			return o, nil
		}
	}
	if o.hasRunpath {
		if o.runpath, err = st.at(runpath, maxPathString); err != nil {
			o.bad = "DT_RUNPATH: " + err.Error()
			return o, nil
		}
	}
	return o, nil
}

// reader reads a file's ranges, from its head when they lie in it.
type reader struct {
	r    readerAt
	head []byte
}

func (rd *reader) read(off uint64, size int) ([]byte, error) {
	if off <= uint64(len(rd.head)) && uint64(size) <= uint64(len(rd.head))-off {
		return rd.head[off : off+uint64(size)], nil
	}
	if off > math.MaxInt64-uint64(size) {
		return nil, fmt.Errorf("offset %#x beyond any file", off)
	}
	buf := make([]byte, size)
	n, err := rd.r.ReadAt(buf, int64(off))
	if n == size {
		return buf, nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%d bytes at %#x run past the end of the file", size, off)
	}
	return nil, err
}

// readUpTo is read for a range that may run past the file's end: a string's, whose length
// is known only once read.
func (rd *reader) readUpTo(off uint64, size int) ([]byte, error) {
	if off <= uint64(len(rd.head)) && uint64(size) <= uint64(len(rd.head))-off {
		return rd.head[off : off+uint64(size)], nil
	}
	if off > math.MaxInt64-uint64(size) {
		return nil, fmt.Errorf("offset %#x beyond any file", off)
	}
	buf := make([]byte, size)
	n, err := rd.r.ReadAt(buf, int64(off))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return buf[:n], nil
}

// stringTable reads strings of the dynamic string table, mostly from one read covering
// all the ones wanted (they sit together at its start as linkers write it).
type stringTable struct {
	rd        *reader
	off, size uint64
	span      []byte
	spanStart uint64
}

const maxPrefetch = 16 << 10

func (st *stringTable) prefetch(needed []uint64, rpath, runpath uint64, haveRpath, haveRunpath bool) {
	lo, hi := uint64(math.MaxUint64), uint64(0)
	add := func(v uint64) {
		lo, hi = min(lo, v), max(hi, v)
	}
	for _, n := range needed {
		add(n)
	}
	if haveRpath {
		add(rpath)
	}
	if haveRunpath {
		add(runpath)
	}
	if lo >= st.size || hi-lo > maxPrefetch {
		return
	}
	end := min(st.size, hi+256)
	if b, err := st.rd.readUpTo(st.off+lo, int(end-lo)); err == nil {
		st.span, st.spanStart = b, lo
	}
}

// at reads the string at index i, of at most limit bytes.
func (st *stringTable) at(i uint64, limit int) (string, error) {
	if i >= st.size {
		return "", fmt.Errorf("string %d beyond the string table (%d bytes)", i, st.size)
	}
	if st.span != nil && i >= st.spanStart && i-st.spanStart < uint64(len(st.span)) {
		if s, _, ok := bytes.Cut(st.span[i-st.spanStart:], []byte{0}); ok {
			return string(s), nil
		}
	}
	n := int(min(uint64(limit)+1, st.size-i))
	b, err := st.rd.readUpTo(st.off+i, n)
	if err != nil {
		return "", err
	}
	s, _, ok := bytes.Cut(b, []byte{0})
	if !ok {
		if len(b) > limit {
			return "", fmt.Errorf("string %d longer than %d bytes", i, limit)
		}
		return "", fmt.Errorf("string %d unterminated", i)
	}
	return string(s), nil
}
