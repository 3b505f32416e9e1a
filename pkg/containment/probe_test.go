package containment_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/cgroups"
)

func TestMapUserNS(t *testing.T) {
	testenv.NeedRoot(t, "mapping another range of host ids")
	if containment.Probe().UserNamespaces == 0 {
		testenv.Need(t, "user namespaces", errors.New("user.max_user_namespaces = 0"))
	}
	ctx := context.Background()
	if err := containment.MapUserNS(ctx, containment.IDs{First: 0x70000000, Size: 65536}); err != nil {
		t.Fatalf("a free range: %v", err)
	}
	// The kernel refuses a map that runs past the last id; the error must say which ids
	// and what to change.
	err := containment.MapUserNS(ctx, containment.IDs{First: 1<<32 - 1, Size: 65536})
	if err == nil {
		t.Fatal("a range past the last id was mapped")
	}
	for _, want := range []string{"4294967295–4295032830", "invalid argument", "past the last usable id, 4294967294", "sessions.ids.first"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// idFiles writes passwd, group, subuid and subgid contents into a directory of their own.
func idFiles(t *testing.T, passwd, group, subuid, subgid string) containment.IDFiles {
	t.Helper()
	dir := t.TempDir()
	f := containment.IDFiles{
		Passwd: filepath.Join(dir, "passwd"), Group: filepath.Join(dir, "group"),
		SubUID: filepath.Join(dir, "subuid"), SubGID: filepath.Join(dir, "subgid"),
	}
	for path, data := range map[string]string{f.Passwd: passwd, f.Group: group, f.SubUID: subuid, f.SubGID: subgid} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func TestIDConflicts(t *testing.T) {
	block := containment.IDs{First: 0x70000000, Size: 4094 * 65536} // 1879048192–2147352575
	const passwd = "# local accounts\nroot:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/usr/sbin/nologin\n+@nis::::::\n"
	const group = "root:x:0:\nnogroup:x:65534:\n"

	t.Run("disjoint", func(t *testing.T) {
		f := idFiles(t, passwd, group, "alice:100000:65536\nbob:165536:65536\n", "alice:100000:65536\n")
		if got := containment.IDConflicts(block, f); len(got) != 0 {
			t.Fatalf("conflicts in disjoint ranges: %q", got)
		}
		// The ids next to the block on either side are not in it.
		f = idFiles(t, "low:x:1879048191:1879048191::/:/bin/sh\nhigh:x:2147352576:100::/:/bin/sh\n", group,
			"edge:1879048191:1\n", "edge:2147352576:65536\n")
		if got := containment.IDConflicts(block, f); len(got) != 0 {
			t.Fatalf("conflicts for ids just outside the block: %q", got)
		}
	})

	t.Run("overlapping", func(t *testing.T) {
		f := idFiles(t,
			passwd+"intruder:x:1879048200:100::/home/intruder:/bin/sh\n",
			group+"squatters:x:2000000000:alice\n",
			"alice:100000:65536\ncarol:1879000000:100000\n",
			"1000:2147352575:10\n")
		got := containment.IDConflicts(block, f)
		want := []string{
			"user intruder has uid 1879048200 (" + f.Passwd + ")",
			"group squatters has gid 2000000000 (" + f.Group + ")",
			"user carol is delegated subordinate uids 1879000000–1879099999 (" + f.SubUID + "), of which 1879048192–1879099999 are session ids",
			"user 1000 is delegated subordinate gids 2147352575–2147352584 (" + f.SubGID + "), of which 2147352575–2147352575 are session ids",
		}
		if !slices.Equal(got, want) {
			t.Fatalf("conflicts:\n got %q\nwant %q", got, want)
		}
	})

	t.Run("missing and unreadable files", func(t *testing.T) {
		f := idFiles(t, passwd, group, "", "")
		f.SubUID = filepath.Join(t.TempDir(), "absent")
		f.SubGID = t.TempDir() // a directory cannot be read as a file
		got := containment.IDConflicts(block, f)
		if len(got) != 1 || !strings.Contains(got[0], f.SubGID) || !strings.Contains(got[0], "cannot tell whether it holds session ids") {
			t.Fatalf("conflicts: %q", got)
		}
	})
}

// The probe says where sessions' cgroups go by default, and why, and the doctor's checks say
// it too; a configured parent, reported in, replaces it (the cgroups package's
// TestDefaultCgroupParentDecision tests the decision itself).
func TestProbeReportsCgroups(t *testing.T) {
	parent, why := cgroups.DefaultParent()
	h := containment.Probe()
	if h.CgroupParent != parent || h.CgroupParentWhy != why || h.CgroupDriver != cgroups.DriverCgroupfs || h.SystemdDriverWhy == "" || h.Cgroups != cgroups.Mode() {
		t.Errorf("probe %+v", h)
	}
	var names []string
	for _, c := range h.Checks() {
		names = append(names, c.Name)
	}
	if !slices.Contains(names, "cgroup parent") || !slices.Contains(names, "systemd cgroup driver") || !slices.Contains(names, "memfd exec") {
		t.Errorf("checks %v", names)
	}
	c, err := cgroups.New(cgroups.Config{Parent: "/roost-report"})
	if err != nil {
		t.Fatal(err)
	}
	c.Report(&h)
	if h.CgroupParent != "/roost-report" || h.CgroupParentWhy != "--cgroup-parent /roost-report" || h.CgroupParentHint != "" {
		t.Errorf("report %+v", h)
	}
	h.CgroupParentHint = "add DelegateSubgroup=supervisor"
	for _, c := range h.Checks() {
		if c.Name == "cgroup parent" && (c.Status != "warn" || c.Hint != h.CgroupParentHint || !strings.HasPrefix(c.Detail, "/roost-report (cgroupfs driver): ")) {
			t.Errorf("check %+v", c)
		}
	}
}

// Doctor says which mechanism keeps memfds from executing here, and on a kernel without
// vm.memfd_noexec what the seccomp fallback leaves.
func TestMemfdCheck(t *testing.T) {
	memfd := func(h containment.Host) containment.Check {
		for _, c := range h.Checks() {
			if c.Name == "memfd exec" {
				return c
			}
		}
		t.Fatalf("no memfd exec check")
		return containment.Check{}
	}
	h := containment.Probe()
	if _, err := os.Stat("/proc/sys/vm/memfd_noexec"); err != nil && h.MemfdNoExecWhy == "" {
		t.Errorf("the probe finds vm.memfd_noexec usable where stat says %v", err)
	}
	h.MemfdNoExecWhy = ""
	if c := memfd(h); c.Status != "ok" || !strings.Contains(c.Detail, "vm.memfd_noexec=2 in each session's pid namespace") {
		t.Errorf("with the sysctl: %+v", c)
	}
	h.MemfdNoExecWhy = "this kernel has no vm.memfd_noexec (before 6.3)"
	if c := memfd(h); c.Status != "warn" || !strings.Contains(c.Detail, "/proc/self/fd") || !strings.Contains(c.Detail, "seccomp") || !strings.Contains(c.Hint, "6.3") {
		t.Errorf("without it: %+v", c)
	}
	h.MemfdNoExecWhy = "roostd cannot write /proc/sys/vm/memfd_noexec (read-only file system)"
	if c := memfd(h); c.Status != "warn" || !strings.HasPrefix(c.Detail, h.MemfdNoExecWhy) || !strings.Contains(c.Hint, "/proc/sys writable") {
		t.Errorf("unwritable: %+v", c)
	}
}

// Doctor says how refused execs are recorded here, and whether the kernel's own Landlock
// audit (ABI 7, Linux 6.15) exists, which roost does not turn on.
func TestChecksSayHowExecRefusalsAreRecorded(t *testing.T) {
	h := containment.Probe()
	var check *containment.Check
	for _, c := range h.Checks() {
		if c.Name == "exec refusals" {
			check = &c
		}
	}
	if check == nil {
		t.Fatal("no exec refusals check")
	}
	t.Logf("%+v", *check)
	wants := []string{"seccomp user notification on execve/execveat in each session, observed only — Landlock decides", "Landlock audit"}
	if h.LandlockABI == 0 {
		wants = []string{"not recorded", "Landlock"}
	}
	for _, w := range wants {
		if !strings.Contains(check.Detail, w) {
			t.Errorf("the check %q lacks %q", check.Detail, w)
		}
	}
	audit := "the kernel offers it"
	if h.LandlockABI < 7 {
		audit = "the kernel has none"
	}
	if h.LandlockABI > 0 && !strings.Contains(check.Detail, audit) {
		t.Errorf("the check %q does not say %q (Landlock ABI %d)", check.Detail, audit, h.LandlockABI)
	}
}
