package idsweep

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// An IPC object as /proc/sysvipc lists it: its id and the ids of its owner and creator.
type ipcObject struct {
	id  int
	ids []uint64 // uid, gid, cuid, cgid
}

// ipcKinds are the /proc/sysvipc tables, the column naming each object's id, and how one is
// removed.
var ipcKinds = []struct {
	file, idCol string
	rm          func(id int) error
}{
	{"shm", "shmid", func(id int) error { _, err := unix.SysvShmCtl(id, unix.IPC_RMID, nil); return err }},
	{"sem", "semid", func(id int) error {
		_, _, e := unix.Syscall6(unix.SYS_SEMCTL, uintptr(id), 0, unix.IPC_RMID, 0, 0, 0)
		return errnoErr(e)
	}},
	{"msg", "msqid", func(id int) error {
		_, _, e := unix.Syscall(unix.SYS_MSGCTL, uintptr(id), unix.IPC_RMID, 0)
		return errnoErr(e)
	}},
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// parseSysvipc reads one /proc/sysvipc table: a header naming the columns, then a row per
// object. Columns are found by name, so tables with more or fewer of them read alike.
func parseSysvipc(data, idCol string) ([]ipcObject, error) {
	lines := strings.Split(strings.TrimRight(data, "\n"), "\n")
	if len(lines) == 0 || strings.TrimSpace(lines[0]) == "" {
		return nil, fmt.Errorf("no header")
	}
	head := strings.Fields(lines[0])
	col := map[string]int{}
	for i, h := range head {
		col[h] = i
	}
	want := []string{idCol, "uid", "gid", "cuid", "cgid"}
	for _, w := range want {
		if _, ok := col[w]; !ok {
			return nil, fmt.Errorf("header %q has no column %s", lines[0], w)
		}
	}
	var out []ipcObject
	for n, line := range lines[1:] {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < len(head) {
			return nil, fmt.Errorf("line %d: %d columns, the header names %d", n+2, len(f), len(head))
		}
		id, err := strconv.Atoi(f[col[idCol]])
		if err != nil || id < 0 {
			return nil, fmt.Errorf("line %d: %s %q", n+2, idCol, f[col[idCol]])
		}
		o := ipcObject{id: id}
		for _, w := range want[1:] {
			v, err := strconv.ParseUint(f[col[w]], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("line %d: %s %q", n+2, w, f[col[w]])
			}
			o.ids = append(o.ids, v)
		}
		out = append(out, o)
	}
	return out, nil
}

// removeIPC removes every SysV object an id of rs owns or created, in roostd's IPC
// namespace (the host's: a sealed or scoped session's own namespace goes with it).
func (s Sweeper) removeIPC(rs Ranges) (int, error) {
	removed := 0
	var errs []error
	for _, k := range ipcKinds {
		data, err := os.ReadFile(filepath.Join(s.proc(), "sysvipc", k.file))
		if errors.Is(err, os.ErrNotExist) {
			continue // a kernel without SysV IPC
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reading SysV %s objects: %w", k.file, err))
			continue
		}
		objs, err := parseSysvipc(string(data), k.idCol)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s/sysvipc/%s: %w", s.proc(), k.file, err))
			continue
		}
		for _, o := range objs {
			if !rs.hasAny(o.ids) {
				continue
			}
			if err := k.rm(o.id); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EIDRM) {
				errs = append(errs, fmt.Errorf("removing SysV %s %d: %w", k.file, o.id, err))
				continue
			}
			removed++
		}
	}
	return removed, errors.Join(errs...)
}

func (rs Ranges) hasAny(ids []uint64) bool {
	for _, id := range ids {
		if rs.has(id) {
			return true
		}
	}
	return false
}
