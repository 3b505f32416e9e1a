package sysview

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// ldCache is /etc/ld.so.cache as glibc's loader reads it: for each library name, the files
// ldconfig found for it, each with the flags that say which ABI it is for.
type ldCache struct {
	byName map[string][]cacheEntry
}

type cacheEntry struct {
	flags int32
	path  string
}

// The formats glibc's ldconfig writes (sysdeps/generic/dl-cache.h): the old one (libc5's),
// the new one alone (glibc 2.32 and later by default), or both, the new one following the
// old one's entries at the next 8-byte boundary.
const (
	oldMagic       = "ld.so-1.7.0"
	newMagic       = "glibc-ld.so.cache1.1"
	oldHeaderSize  = 16
	oldEntrySize   = 12
	newHeaderSize  = 48
	newEntrySize   = 24
	endianMask     = 3
	endianUnset    = 0
	endianLittle   = 2
	endianBig      = 3
	maxCacheString = 4096
)

// parseLdCache reads a cache file's entries. Where the file holds both formats the new one
// is read, as the loader does; its string offsets count from the new header, the old one's
// from the end of its entries.
func parseLdCache(data []byte) (*ldCache, error) {
	if bytes.HasPrefix(data, []byte(newMagic)) {
		return parseNewCache(data)
	}
	if !bytes.HasPrefix(data, []byte(oldMagic)) {
		return nil, errors.New("neither ld.so cache format")
	}
	if len(data) < oldHeaderSize {
		return nil, errors.New("old-format header truncated")
	}
	// The old format has no byte-order mark: it is the host's own, little-endian on every
	// machine this runs on but a few, whose caches are the new format anyway.
	nlibs := uint64(binary.LittleEndian.Uint32(data[12:]))
	end := oldHeaderSize + nlibs*oldEntrySize
	if end > uint64(len(data)) {
		return nil, fmt.Errorf("old format: %d entries overrun the file (%d bytes)", nlibs, len(data))
	}
	if next := (end + 7) &^ 7; next < uint64(len(data)) && bytes.HasPrefix(data[next:], []byte(newMagic)) {
		return parseNewCache(data[next:])
	}
	c := &ldCache{byName: map[string][]cacheEntry{}}
	strs := data[end:]
	for i := uint64(0); i < nlibs; i++ {
		e := data[oldHeaderSize+i*oldEntrySize:]
		flags := int32(binary.LittleEndian.Uint32(e))
		key, err := cacheString(strs, binary.LittleEndian.Uint32(e[4:]))
		if err != nil {
			return nil, fmt.Errorf("old format entry %d: key: %v", i, err)
		}
		value, err := cacheString(strs, binary.LittleEndian.Uint32(e[8:]))
		if err != nil {
			return nil, fmt.Errorf("old format entry %d: value: %v", i, err)
		}
		c.add(key, flags, value)
	}
	return c, nil
}

func parseNewCache(data []byte) (*ldCache, error) {
	if len(data) < newHeaderSize {
		return nil, errors.New("header truncated")
	}
	var bo binary.ByteOrder
	switch data[28] & endianMask {
	case endianLittle, endianUnset:
		// An unset mark is an ldconfig from before glibc 2.33, which wrote its own host's
		// order: little-endian on the machines roost runs on.
		bo = binary.LittleEndian
	case endianBig:
		bo = binary.BigEndian
	default:
		return nil, errors.New("marked invalid by ldconfig")
	}
	nlibs := uint64(bo.Uint32(data[20:]))
	if newHeaderSize+nlibs*newEntrySize > uint64(len(data)) {
		return nil, fmt.Errorf("%d entries overrun the file (%d bytes)", nlibs, len(data))
	}
	c := &ldCache{byName: make(map[string][]cacheEntry, nlibs)}
	for i := uint64(0); i < nlibs; i++ {
		e := data[newHeaderSize+i*newEntrySize:]
		flags := int32(bo.Uint32(e))
		key, err := cacheString(data, bo.Uint32(e[4:]))
		if err != nil {
			return nil, fmt.Errorf("entry %d: key: %v", i, err)
		}
		value, err := cacheString(data, bo.Uint32(e[8:]))
		if err != nil {
			return nil, fmt.Errorf("entry %d: value: %v", i, err)
		}
		// The hwcap word (a glibc-hwcaps subdirectory, or a legacy hwcap mask) only says
		// which of a name's entries the loader prefers on this CPU; a session may run on any
		// CPU the host has, so every entry counts.
		c.add(key, flags, value)
	}
	return c, nil
}

func (c *ldCache) add(key string, flags int32, value string) {
	c.byName[key] = append(c.byName[key], cacheEntry{flags: flags, path: value})
}

// lookup lists the files the cache holds for name whose flags are one of accept (any, for
// an empty accept: a machine whose flags this package does not know, where the files' own
// ELF headers decide).
func (c *ldCache) lookup(name string, accept []int32) []string {
	if c == nil {
		return nil
	}
	var out []string
	for _, e := range c.byName[name] {
		if len(accept) == 0 {
			out = append(out, e.path)
			continue
		}
		for _, f := range accept {
			if e.flags == f {
				out = append(out, e.path)
				break
			}
		}
	}
	return out
}

// cacheString reads the NUL-terminated string at off in data.
func cacheString(data []byte, off uint32) (string, error) {
	if uint64(off) >= uint64(len(data)) {
		return "", fmt.Errorf("string offset %d beyond the file (%d bytes)", off, len(data))
	}
	rest := data[off:]
	if len(rest) > maxCacheString {
		rest = rest[:maxCacheString]
	}
	s, _, ok := bytes.Cut(rest, []byte{0})
	if !ok {
		return "", fmt.Errorf("string at %d unterminated", off)
	}
	return string(s), nil
}
