package idsweep

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
)

// BenchmarkSweep is the sweep of one freed range that left 1,000 files (in 10
// directories) in a shared place and 10 SysV shared-memory segments, with this host's
// /proc scanned for its processes.
func BenchmarkSweep(b *testing.B) {
	testenv.NeedRoot(b, "sweeping host ids")
	place := b.TempDir()
	uid := int(swept.First + 3)
	s := Sweeper{Places: []string{place}}
	for b.Loop() {
		b.StopTimer()
		for d := range 10 {
			dir := filepath.Join(place, fmt.Sprint("d", d))
			if err := os.Mkdir(dir, 0o700); err != nil {
				b.Fatal(err)
			}
			for f := range 100 {
				p := filepath.Join(dir, fmt.Sprint("f", f))
				if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
					b.Fatal(err)
				}
				if err := os.Lchown(p, uid, uid); err != nil {
					b.Fatal(err)
				}
			}
			if err := os.Lchown(dir, uid, uid); err != nil {
				b.Fatal(err)
			}
		}
		for range 10 {
			id, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600)
			if err != nil {
				b.Fatal(err)
			}
			var d unix.SysvShmDesc
			if _, err := unix.SysvShmCtl(id, unix.IPC_STAT, &d); err != nil {
				b.Fatal(err)
			}
			d.Perm.Uid = uint32(uid)
			if _, err := unix.SysvShmCtl(id, unix.IPC_SET, &d); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		rep, err := s.Sweep(Ranges{swept})
		if err != nil || rep.Files != 1010 || rep.IPC != 10 {
			b.Fatalf("%+v %v", rep, err)
		}
	}
}
