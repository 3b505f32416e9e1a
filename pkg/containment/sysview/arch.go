package sysview

import (
	"debug/elf"
	"fmt"
	"path"
	"strings"
)

// abi is what the loader matches a library against its needer by: a library of another
// class, byte order or machine is passed over, as glibc's open_verify does.
type abi struct {
	class   elf.Class
	data    elf.Data
	machine elf.Machine
	// float is the float ABI where a machine has more than one (arm hard or soft,
	// riscv's and loongarch's soft or double), taken from e_flags; 0 elsewhere.
	float uint32
}

func abiOf(o *elfObject) abi {
	a := abi{class: o.class, data: o.data, machine: o.machine}
	switch o.machine {
	case elf.EM_ARM:
		a.float = o.flags & 0x400 // EF_ARM_ABI_FLOAT_HARD
	case elf.EM_RISCV:
		a.float = o.flags & 0x6 // EF_RISCV_FLOAT_ABI
	case elf.EM_LOONGARCH:
		a.float = o.flags & 0x7 // EF_LOONGARCH_ABI_MODIFIER_MASK
	}
	return a
}

func (a abi) matches(o *elfObject) bool {
	return o.class == a.class && o.data == a.data && o.machine == a.machine
}

func (a abi) String() string {
	return fmt.Sprintf("%v/%v/%v/%#x", a.machine, a.class, a.data, a.float)
}

// cacheFlags lists the ld.so.cache flags the loader for a accepts (glibc's
// _dl_cache_check_flags for that machine: FLAG_ELF_LIBC6 with the machine's
// FLAG_*_LIB64-like bits, sysdeps/generic/ldconfig.h). Empty means a machine this does not
// know: every entry is a candidate, and the files' ELF headers decide.
func cacheFlags(a abi) []int32 {
	const (
		elfAny   = 0x0001
		libc6    = 0x0003
		sparc64  = 0x0100
		ia64     = 0x0200
		x8664    = 0x0300
		s390x    = 0x0400
		ppc64    = 0x0500
		x32      = 0x0800
		armHF    = 0x0900
		aarch64  = 0x0a00
		armSF    = 0x0b00
		rvSoft   = 0x0f00
		rvDouble = 0x1000
		laSoft   = 0x1100
		laDouble = 0x1200
	)
	is64 := a.class == elf.ELFCLASS64
	switch {
	case a.machine == elf.EM_X86_64 && is64:
		return []int32{x8664 | libc6}
	case a.machine == elf.EM_X86_64:
		return []int32{x32 | libc6}
	case a.machine == elf.EM_AARCH64 && is64:
		return []int32{aarch64 | libc6}
	case a.machine == elf.EM_ARM && a.float != 0:
		return []int32{armHF | libc6, libc6}
	case a.machine == elf.EM_ARM:
		return []int32{armSF | libc6, libc6}
	case a.machine == elf.EM_RISCV && is64 && a.float == 0x4:
		return []int32{rvDouble | libc6}
	case a.machine == elf.EM_RISCV && is64 && a.float == 0:
		return []int32{rvSoft | libc6}
	case a.machine == elf.EM_LOONGARCH && is64 && a.float == 0x3:
		return []int32{laDouble | libc6}
	case a.machine == elf.EM_LOONGARCH && is64 && a.float == 0x1:
		return []int32{laSoft | libc6}
	case a.machine == elf.EM_PPC64:
		return []int32{ppc64 | libc6}
	case a.machine == elf.EM_S390 && is64:
		return []int32{s390x | libc6}
	case a.machine == elf.EM_SPARCV9:
		return []int32{sparc64 | libc6}
	case a.machine == elf.EM_IA_64:
		return []int32{ia64 | libc6}
	case a.machine == elf.EM_386, a.machine == elf.EM_PPC, a.machine == elf.EM_S390, a.machine == elf.EM_SPARC:
		return []int32{elfAny, libc6}
	}
	return nil
}

// platform is what $PLATFORM expands to for a (the kernel's AT_PLATFORM), where it does
// not depend on the CPU model; "" elsewhere, and a search path element naming it is dropped.
func platform(a abi) string {
	switch a.machine {
	case elf.EM_X86_64:
		if a.class == elf.ELFCLASS64 {
			return "x86_64"
		}
	case elf.EM_386:
		return "i686"
	case elf.EM_AARCH64:
		return "aarch64"
	}
	return ""
}

// multiarchOf reads a Debian multiarch triple (x86_64-linux-gnu, aarch64-linux-gnu) off a
// library directory: /lib/<triple> or /usr/lib/<triple>. ok is false for any other.
func multiarchOf(dir string) (string, bool) {
	rest, ok := strings.CutPrefix(dir, "/usr")
	if !ok {
		rest = dir
	}
	t, ok := strings.CutPrefix(rest, "/lib/")
	if !ok || t == "" || strings.Contains(t, "/") || !strings.Contains(t, "-linux-") {
		return "", false
	}
	return t, true
}

// defaultDirs are where the loader looks last for a's libraries: the multiarch directories,
// then the class's own, then /lib and /usr/lib.
func defaultDirs(triple string, a abi) []string {
	var dirs []string
	if triple != "" {
		dirs = append(dirs, path.Join("/lib", triple), path.Join("/usr/lib", triple))
	}
	if a.class == elf.ELFCLASS64 {
		dirs = append(dirs, "/lib64", "/usr/lib64")
	} else {
		dirs = append(dirs, "/lib32", "/usr/lib32")
	}
	return append(dirs, "/lib", "/usr/lib")
}
