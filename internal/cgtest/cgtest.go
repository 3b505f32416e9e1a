// Package cgtest is what tests read and clear of the host's cgroup hierarchies: their mount
// points, a process's cgroups, and the trees tests leave behind. It is for _test.go files
// only, and imports nothing of roost's but testenv, so that the cgroups package's own tests,
// those of every package above it and the end-to-end tests share it.
package cgtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	"roost.dev/roost/internal/testenv"
)

// RequireRoot stops a test that makes cgroups unless it runs as root (a failure on CI).
func RequireRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t, "making cgroups")
}

// Hierarchies lists the mount point of every cgroup hierarchy mounted here: each v1
// controller's (and named ones such as name=systemd) and the unified one. It reads this
// thread's mounts, not the main thread's: libcontainer joins a container's mount namespace
// on a locked thread it lets end, and when that thread is the main one Go parks it instead,
// in that namespace, which /proc/self then shows.
func Hierarchies() []string {
	data, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		i := slices.Index(f, "-")
		if i < 0 || i+1 >= len(f) || len(f) < 5 {
			continue
		}
		if fstype := f[i+1]; (fstype == "cgroup" || fstype == "cgroup2") && !slices.Contains(out, f[4]) {
			out = append(out, f[4])
		}
	}
	return out
}

// RemoveTree ends what is left beneath the cgroup parent and removes it from every
// hierarchy.
func RemoveTree(parent string) error {
	var err error
	for range 50 {
		err = nil
		for _, mnt := range Hierarchies() {
			dir := filepath.Join(mnt, parent)
			if pids, perr := cgroups.GetAllPids(dir); perr == nil {
				for _, pid := range pids {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			err = errors.Join(err, cgroups.RemovePath(dir))
		}
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// ProcCgroups reads a process's cgroups, one entry per hierarchy ("" the unified one; the
// controllers of a v1 line joined by commas, as the kernel writes them).
func ProcCgroups(t *testing.T, pid int) map[string]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 {
			out[parts[1]] = parts[2]
		}
	}
	return out
}

// ExpectIn fails unless pid is in cgroup in every hierarchy.
func ExpectIn(t *testing.T, what string, pid int, cgroup string) {
	t.Helper()
	for h, p := range ProcCgroups(t, pid) {
		if p != cgroup {
			t.Errorf("%s (pid %d) is in %s in hierarchy %q, not in %s", what, pid, p, h, cgroup)
		}
	}
}

// ExpectDirs fails unless the cgroup's directory exists in every mounted hierarchy (want),
// or in none.
func ExpectDirs(t *testing.T, cgroup string, want bool) {
	t.Helper()
	mounts := Hierarchies()
	if len(mounts) == 0 {
		t.Fatal("no cgroup hierarchy is mounted")
	}
	for _, mnt := range mounts {
		_, err := os.Stat(filepath.Join(mnt, cgroup))
		if want && err != nil {
			t.Errorf("%s: %v", mnt, err)
		}
		if !want && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s%s is left behind (%v)", mnt, cgroup, err)
		}
	}
}
