package endpoint_test

import (
	"errors"
	"io/fs"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/endpoint"
)

// nsID is the namespace a pin file holds, or the file's own identity when it holds none.
func nsID(t *testing.T, path string) [2]uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return [2]uint64{st.Dev, st.Ino}
}

// A claimed sandbox's network namespace moves to its session's pin: the same namespace
// (its lo up, as made), and nothing left pinned under the sandbox's name.
func TestMovePin(t *testing.T) {
	testenv.NeedRoot(t, "making and pinning a network namespace")
	dir := t.TempDir()
	e, err := endpoint.New(nil, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	from, err := e.Pin("warm-0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	before := nsID(t, from)
	if err := e.Move("warm-0123456789abcdef", "ses_moved"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Release("ses_moved") })
	to := e.NetNSPath("ses_moved")
	if after := nsID(t, to); after != before {
		t.Errorf("ses_moved pins namespace %v, the sandbox's was %v", after, before)
	}
	if _, err := os.Lstat(from); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the sandbox's pin is still there: %v", err)
	}
	// The pin is a namespace, not the empty file under it: setns takes it.
	f, err := os.Open(to)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		t.Errorf("%s is on filesystem %#x (%v), want nsfs", to, st.Type, err)
	}
	// A move onto a pin that exists is refused, and leaves both as they were.
	if _, err := e.Pin("warm-fedcba9876543210"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Release("warm-fedcba9876543210") })
	other := nsID(t, e.NetNSPath("warm-fedcba9876543210"))
	if err := e.Move("warm-fedcba9876543210", "ses_moved"); err == nil {
		t.Fatal("a move onto ses_moved's pin was accepted")
	}
	if got := nsID(t, to); got != before {
		t.Errorf("the refused move changed ses_moved's pin: %v, was %v", got, before)
	}
	if got := nsID(t, e.NetNSPath("warm-fedcba9876543210")); got != other {
		t.Errorf("the refused move lost the sandbox's pin: %v, was %v", got, other)
	}
}
