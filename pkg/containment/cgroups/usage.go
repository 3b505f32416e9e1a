package cgroups

import (
	"errors"
	"math"

	ocgroups "github.com/opencontainers/cgroups"
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

// StatsLimits reads the ceilings out of statistics a manager gathered already, so a sealed
// session's usage costs one read of its cgroup (libcontainer's Stats reads memory.max and
// pids.max with the counters).
func StatsLimits(st *ocgroups.Stats) (memory, pids int64) {
	// PidsStats.Limit is 0 already for "max".
	return ceiling(st.MemoryStats.Usage.Limit), ceiling(st.PidsStats.Limit)
}

// Limits reads the memory and pids ceilings of m's cgroup from its files, through the
// paths the manager holds: the session's own cgroup, which is where roost writes its limits
// (a parent's tighter ceiling would show in its own files, not here). 0 where the cgroup
// has none, or the file cannot be read (a controller the hierarchy lacks): the ceilings are
// for showing, and a missing one must not hide the counters read with it.
func Limits(m ocgroups.Manager) (memory, pids int64) {
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
	if ocgroups.IsCgroup2UnifiedMode() {
		return read("", "memory.max"), read("", "pids.max")
	}
	return read("memory", "memory.limit_in_bytes"), read("pids", "pids.max")
}

// Usage is what a session's processes use now.
type Usage struct {
	MemoryBytes     int64
	MemoryPeakBytes int64
	CPUSeconds      float64
	Pids            int64
	// MemoryLimitBytes and PidsLimit are the cgroup's ceilings (memory.max, pids.max); 0
	// when it has none, as an advisory session's cgroup, which holds no limits.
	MemoryLimitBytes int64
	PidsLimit        int64
}

// ReadUsage reads what the processes in m's cgroup use.
func ReadUsage(m ocgroups.Manager) (Usage, error) {
	if m == nil {
		return Usage{}, errors.New("the session has no cgroup")
	}
	st, err := m.GetStats()
	if err != nil {
		return Usage{}, err
	}
	return Usage{
		MemoryBytes:     int64(st.MemoryStats.Usage.Usage),
		MemoryPeakBytes: int64(st.MemoryStats.Usage.MaxUsage),
		CPUSeconds:      float64(st.CpuStats.CpuUsage.TotalUsage) / 1e9,
		Pids:            int64(st.PidsStats.Current),
	}, nil
}
