package session

import (
	"fmt"

	"roost.dev/roost/pkg/session/store"
)

// What the state directory's filesystem must keep free for roostd to stage a session: 1 %
// of it, at least 4 MiB and at most 64 MiB, and 1024 inodes. The rest of that room is for
// what runs: sessions' ends, logs and exit records, the registry's and the ledger's commits.
const (
	minDiskReserve = 4 << 20
	maxDiskReserve = 64 << 20
	minFreeInodes  = 1024
)

func diskReserve(size uint64) uint64 { return min(max(size/100, minDiskReserve), maxDiskReserve) }

// checkDiskSpace refuses a new session when the state directory's filesystem is nearly full,
// so that what runs keeps the room it needs to record how it ends. It counts a disk_full
// limit: there is no session to note it on.
func checkDiskSpace(stateDir string, obs Observer) error {
	d, err := store.StatDisk(stateDir)
	if err != nil {
		// Nothing known; the registry's own write reports a full disk.
		return nil
	}
	var what string
	switch {
	case d.Free < diskReserve(d.Size):
		what = fmt.Sprintf("refusing to stage a session: roostd keeps %s free on the state directory's filesystem so that running sessions can still record how they end", store.SizeOf(diskReserve(d.Size)))
	case d.Inodes > 0 && d.FreeInodes < minFreeInodes:
		what = fmt.Sprintf("refusing to stage a session: the state directory's filesystem has %d inodes free of %d (roostd keeps %d)", d.FreeInodes, d.Inodes, minFreeInodes)
	default:
		return nil
	}
	if obs, ok := obs.(LimitObserver); ok {
		obs.LimitHit(store.LimitDiskFull)
	}
	return store.NoSpaceError(stateDir, what)
}
