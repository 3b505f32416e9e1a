package containment

import (
	"math"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fscommon"
)

// noLimitAbove: a ceiling past this is the kernel's way of saying "none". cgroup v2 writes
// "max" (read as MaxUint64); v1's memory.limit_in_bytes says the page counter's largest value
// in bytes (0x7FFFFFFFFFFFF000 with 4 KiB pages, less with larger ones), which no real limit
// comes near.
const noLimitAbove = math.MaxInt64 / 2

// ceiling turns a cgroup file's value into a limit for the API: 0 when there is none.
func ceiling(v uint64) int64 {
	if v > noLimitAbove {
		return 0
	}
	return int64(v)
}

// statsLimits reads the ceilings out of statistics a manager gathered already, so a sealed
// session's usage costs one read of its cgroup (libcontainer's Stats reads memory.max and
// pids.max with the counters).
func statsLimits(st *cgroups.Stats) (memory, pids int64) {
	// PidsStats.Limit is 0 already for "max".
	return ceiling(st.MemoryStats.Usage.Limit), ceiling(st.PidsStats.Limit)
}

// cgroupLimits reads the memory and pids ceilings of m's cgroup from its files, through the
// paths the manager holds: the session's own cgroup, which is where roost writes its limits
// (a parent's tighter ceiling would show in its own files, not here). 0 where the cgroup
// has none, or the file cannot be read (a controller the hierarchy lacks): the ceilings are
// for showing, and a missing one must not hide the counters read with it.
func cgroupLimits(m cgroups.Manager) (memory, pids int64) {
	if m == nil {
		return 0, 0
	}
	read := func(subsystem, file string) int64 {
		dir := m.Path(subsystem)
		if dir == "" {
			return 0
		}
		v, err := fscommon.GetCgroupParamUint(dir, file)
		if err != nil {
			return 0
		}
		return ceiling(v)
	}
	if cgroups.IsCgroup2UnifiedMode() {
		return read("", "memory.max"), read("", "pids.max")
	}
	return read("memory", "memory.limit_in_bytes"), read("pids", "pids.max")
}
