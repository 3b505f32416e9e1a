package records

import (
	"encoding/binary"
	"time"
)

// Write times. Beside each file of a stream that roost-init writes (stdout.log,
// stdout.tail.<N>, ...) it keeps a time index, <file>.times: entries of 16 bytes, the
// stream offset of a byte and when roost-init read it from the pipe (unix nanoseconds),
// both int64 little endian. An entry's time holds for every byte from its offset up to the
// next entry's, so a read that returns within TimeGranularity of the stream's last entry
// adds none: a program that writes often costs at most one entry per millisecond, and a
// line written alone gets a time of its own.
//
// The index lives and dies with its file: it is removed when the file is rotated away, and
// the first entry of every index is at its file's first byte, so what remains of a stream
// is timed from its first byte on whatever was dropped before it. Entries are in offset
// order and their times never decrease (a wall clock stepped back is held at the last
// time), so a reader can search them. An index and its file share the file's part of
// resources.log_max_bytes: a program that writes a byte at a time keeps fewer bytes, never
// more disk.
//
// A file without an index (records from before roost kept times, or a file whose part of
// the cap is too small to spare room for one) has no times; readers fall back on what the
// file's own modification time tells.
const (
	// TimesSuffix ends a time index's name.
	TimesSuffix = ".times"
	// TimeEntrySize is the size of one entry.
	TimeEntrySize = 16
	// TimeGranularity is the least time between two entries of a stream.
	TimeGranularity = time.Millisecond
	// MinTimedShare is the least part of the cap a file must have to be given an index:
	// below it an entry would take too much of the room its bytes have (a cap of a few
	// bytes is an experiment, not a log).
	MinTimedShare = 256
)

// LogTime is one entry of a time index: the stream's bytes from Offset on were written at
// Time, in unix nanoseconds.
type LogTime struct {
	Offset int64
	Time   int64
}

// TimesFile names the time index of a stream's file.
func TimesFile(name string) string { return name + TimesSuffix }

// DecodeTimes appends the whole entries of b to dst; a trailing partial entry (one being
// written) is left for the next read.
func DecodeTimes(dst []LogTime, b []byte) []LogTime {
	for ; len(b) >= TimeEntrySize; b = b[TimeEntrySize:] {
		dst = append(dst, LogTime{
			Offset: int64(binary.LittleEndian.Uint64(b)),
			Time:   int64(binary.LittleEndian.Uint64(b[8:])),
		})
	}
	return dst
}

// EncodeTime writes e as one entry.
func EncodeTime(b *[TimeEntrySize]byte, e LogTime) {
	binary.LittleEndian.PutUint64(b[:8], uint64(e.Offset))
	binary.LittleEndian.PutUint64(b[8:], uint64(e.Time))
}
