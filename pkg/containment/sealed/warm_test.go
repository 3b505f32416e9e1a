package sealed_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/internal/cgtest"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
	"roost.dev/roost/pkg/containment/sealed"
)

// inspectScript prints what a program can tell of its container: its mounts (mount point,
// per-mount options, type, superblock options; not the ids that differ between any two
// containers), its ids, capabilities and seccomp mode, and the modes and owners of its trees.
const inspectScript = `awk '{ for (i = 7; $i != "-"; i++) ; print $5, $6, $(i+1), $(i+3) }' /proc/self/mountinfo | sort
grep -E '^(Uid|Gid|Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status
cat /proc/self/uid_map | awk '{print $1, $3}'
stat -c '%n %a %u %g' / /work /capsule /root /tmp /run /dev/shm
ls -A /run /work /root /tmp
[ -f /run/roost/task.md ] && cat /run/roost/task.md
ulimit -a
hostname
pwd
true`

// run starts s, cold (sb nil) or in sb, and returns its exit and stdout.
func runIn(t *testing.T, rt *sealed.Runtime, sb *sealed.Sandbox, s containment.Spec) (containment.ExitInfo, string) {
	t.Helper()
	var p containment.Process
	var err error
	if sb == nil {
		p, err = rt.Start(context.Background(), s)
	} else {
		p, err = rt.StartWarm(context.Background(), sb, s)
	}
	if err != nil {
		t.Fatalf("start (warm %v): %v", sb != nil, err)
	}
	info := testkit.WaitDone(t, p)
	t.Cleanup(func() { _ = rt.Release(s.SessionID) })
	return info, testkit.ReadFile(t, filepath.Join(s.RecordsDir, "stdout.log"))
}

// inodes are the inode numbers of the regular files in dir, by name.
func inodes(t *testing.T, dir string) map[string]uint64 {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			out[e.Name()] = info.Sys().(*syscall.Stat_t).Ino
		}
	}
	return out
}

// idNumbers are what differs between two containers of the same shape: their host uid
// ranges and sizes aside, everything a program sees must be equal.
var idNumbers = regexp.MustCompile(`\b(uid|gid|nr_inodes)=[0-9]+`)

// TestWarmStartMatchesCold runs the same program in a container made for it and in a
// sandbox made ahead, for several shapes of session, and finds no difference a program
// can see: mounts and their options, ids, capabilities, seccomp, limits, trees.
func TestWarmStartMatchesCold(t *testing.T) {
	testkit.NeedRoot(t)
	state := testkit.ReachableDir(t)
	rt, err := kit.NewSealedRuntime(state, kit.Init(t), kit.IDs(), kit.Sealer(t))
	if err != nil {
		t.Fatal(err)
	}
	// A shape of "" is the default capsule's; else it is the capsule's own (roostd
	// --warm-pool-capsule): seccomp variant, noexec trees, host_read and rlimits included.
	for _, tc := range []struct {
		name, caps, shape string
		task              bool
	}{
		{"default", "capabilities: {containment: sealed, shell: {allow: [awk, sort, grep, cat, stat, ls, find, hostname, ipcmk, ipcs]}}", "", false},
		{"task", "capabilities: {containment: sealed, shell: {allow: [awk, sort, grep, cat, stat, ls, find, hostname, ipcmk, ipcs]}}", "", true},
		{"scope", "capabilities: {containment: sealed, shell: {allow: [awk, sort, grep, cat, stat, ls, find, hostname, ipcmk, ipcs]}, filesystem: {scope: src, read_only: [src/vendor]}}", "", false},
		{"delegates", "capabilities: {containment: sealed, shell: {allow: [awk, sort, grep, cat, stat, ls, find, hostname, ipcmk, ipcs]}, spawn: {allow: [x]}}", "", false},
		{"limits", "capabilities: {containment: sealed, shell: {allow: [awk, sort, grep, cat, stat, ls, find, hostname, ipcmk, ipcs]}, resources: {cgroup_memory_bytes: 268435456, workdir_max_bytes: 134217728, max_open_files: 77, max_processes: 50, cpu_seconds: 30, max_file_size_bytes: 1048576, memory_bytes: 4294967296}}", "", false},
		{"unix_sockets", "capabilities: {containment: sealed, shell: {allow: [awk, sort, grep, cat, stat, ls, find, hostname, ipcmk, ipcs]}, network: {unix_sockets: true}}",
			"capabilities: {containment: sealed, network: {unix_sockets: true}}", false},
		{"own_shape", "capabilities: {containment: sealed, shell: {allow: [awk, sort, grep, cat, stat, ls, find, hostname, ipcmk, ipcs]}, filesystem: {workdir_exec: true, host_read: [/usr/share/common-licenses]}, resources: {max_open_files: 900000}}",
			"capabilities: {containment: sealed, filesystem: {workdir_exec: true, host_read: [/usr/share/common-licenses]}, resources: {max_open_files: 900000}}", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shape := sealed.DefaultWarmShape()
			if tc.shape != "" {
				shape = sealed.WarmShape{Name: "capsule " + tc.name, Policy: testkit.Policy(t, tc.shape)}
				// The shape is the capsule's, not the default's.
				if err := rt.Fits(sealed.DefaultWarmShape(), testkit.Policy(t, tc.caps), false); err == nil {
					t.Fatalf("a session of %s fits the default shape: the case tests nothing", tc.caps)
				}
			}
			if err := rt.Fits(shape, testkit.Policy(t, tc.caps), false); err != nil {
				t.Fatalf("Fits: %v", err)
			}
			var outs, limits, files [2]string
			for i, warm := range []bool{false, true} {
				var sb *sealed.Sandbox
				records := ""
				ids := kit.IDs()
				var premade map[string]uint64
				if warm {
					sb = kit.Prepare(t, rt, shape, tc.name)
					records, ids = sb.Records, sb.IDs
					// roost-init makes them as it sets up, after Prepare returns.
					for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
						if premade = inodes(t, sb.Records); premade["stderr.log.times"] != 0 && premade["init.json.tmp"] != 0 {
							break
						}
						if time.Now().After(deadline) {
							t.Fatalf("the sandbox's records directory holds %v, not the files its session opens", premade)
						}
					}
				}
				id := "ses_warm_" + tc.name + map[bool]string{false: "_cold", true: "_warm"}[warm]
				s := kit.SealedSpec(t, id, tc.caps, inspectScript)
				testkit.ClaimSandbox(t, &s, ids, records)
				s.Home = filepath.Join(testkit.ReachableDir(t), "home")
				if err := os.Mkdir(s.Home, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(s.Home, int(ids.First), int(ids.First)); err != nil {
					t.Fatal(err)
				}
				if tc.task {
					s.Task = filepath.Join(s.RecordsDir, "task.md")
					if err := os.WriteFile(s.Task, []byte("the task\n"), 0o444); err != nil {
						t.Fatal(err)
					}
				}
				if len(s.Policy.Spawn.Allow) > 0 {
					if err := os.Mkdir(filepath.Join(s.Dir, containment.ChildrenRoot), 0o755); err != nil {
						t.Fatal(err)
					}
				}
				info, out := runIn(t, rt, sb, s)
				if info.Code != 0 || info.StartError != "" {
					t.Fatalf("warm %v: exit %+v\n%s", warm, info, out)
				}
				outs[i] = idNumbers.ReplaceAllString(out, "$1=N")
				after := inodes(t, s.RecordsDir)
				files[i] = strings.Join(slices.Sorted(maps.Keys(after)), " ")
				// The claim opened the files the sandbox made for it: it made none of
				// them on its path (see roostinit's premake).
				for _, name := range []string{"stdout.log", "stdout.log.times", "stderr.log", "stderr.log.times"} {
					if warm && (premade[name] == 0 || after[name] != premade[name]) {
						t.Errorf("%s: inode %d after the claim, %d made with the sandbox", name, after[name], premade[name])
					}
				}
				// Its cgroup's limits, which a claim sets (or finds set, when they are the
				// sandbox's), are what a container made for it has.
				place := s.SessionID
				if sb != nil {
					place = sb.ID
				}
				limits[i] = cgroupFiles(rt.Cgroups().PlaceOf(place).Path)
				// A root composed for a sandbox (host_read) went to its session, which
				// Release removes.
				if left, _ := filepath.Glob(filepath.Join(state, "roots", sealed.WarmPrefix+"*")); len(left) > 0 {
					t.Errorf("a sandbox's root is left after its claim: %v", left)
				}
			}
			if files[0] != files[1] {
				t.Errorf("the warm session's records are not the cold one's:\n--- cold\n%s\n--- warm\n%s", files[0], files[1])
			}
			if limits[0] == "" || limits[0] != limits[1] {
				t.Errorf("the warm session's cgroup limits differ from the cold one's:\n--- cold\n%s--- warm\n%s", limits[0], limits[1])
			}
			if outs[0] != outs[1] {
				t.Errorf("a warm start differs from a cold one:\n--- cold\n%s\n--- warm\n%s", outs[0], outs[1])
			}
			if tc.task && !strings.Contains(outs[1], "the task") {
				t.Errorf("the warm session does not read its task:\n%s", outs[1])
			}
		})
	}
}

// TestWarmRefusesOtherShapes: a session whose container a sandbox cannot be, because its
// rlimits, /tmp or seccomp variant are fixed at creation, is told so, naming the field.
func TestWarmRefusesOtherShapes(t *testing.T) {
	testkit.NeedRoot(t)
	rt, err := kit.NewSealedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs())
	if err != nil {
		t.Fatal(err)
	}
	// workdir_exec changes the noexec mounts, and first how memfds are held: by the
	// annotation that sets vm.memfd_noexec, or where the kernel lacks it by seccomp.
	memfd := "annotations"
	if !containment.MemfdNoExec() {
		memfd = "linux.seccomp"
	}
	for caps, field := range map[string]string{
		"capabilities: {containment: sealed, shell: {allow: [awk, sort, grep, cat, stat, ls, find, hostname, ipcmk, ipcs]}, network: {unix_sockets: true}}":    "linux.seccomp",
		"capabilities: {containment: sealed, resources: {max_open_files: 900000}}":                                                                             "process.rlimits[RLIMIT_NOFILE]",
		"capabilities: {containment: sealed, shell: {allow: [awk, sort, grep, cat, stat, ls, find, hostname, ipcmk, ipcs]}, filesystem: {workdir_exec: true}}": memfd,
		// host_read beneath /usr is part of the session's view of the system trees, which it
		// brings when it claims a sandbox; one elsewhere is a mount the sandbox is made with.
		"capabilities: {containment: sealed, shell: {allow: [awk, sort, grep, cat, stat, ls, find, hostname, ipcmk, ipcs]}, filesystem: {host_read: [/srv]}}": "mounts",
	} {
		err := rt.Fits(sealed.DefaultWarmShape(), testkit.Policy(t, caps), false)
		var nw *sealed.NotWarmError
		if !errors.As(err, &nw) || !strings.HasPrefix(nw.Field, field) || !strings.Contains(err.Error(), "made with a default capsule's") {
			t.Errorf("%s: Fits = %v, want a difference at %s", caps, err, field)
		}
	}
	for _, caps := range []string{
		"capabilities: {containment: sealed, resources: {cgroup_cpu_percent: 50, cgroup_pids_max: 77, cgroup_memory_bytes: 268435456}}",
		"capabilities: {containment: sealed, resources: {max_open_files: 77, max_processes: 10, cpu_seconds: 5}}",
	} {
		if err := rt.Fits(sealed.DefaultWarmShape(), testkit.Policy(t, caps), false); err != nil {
			t.Errorf("%s: limits a claim sets (cgroup) or roost-exec lowers (rlimits), yet Fits = %v", caps, err)
		}
	}
	// A capsule's own shape refuses what differs from it, the default capsule included.
	unix := sealed.WarmShape{Name: "capsule sockets@1.0.0", Policy: testkit.Policy(t, "capabilities: {containment: sealed, network: {unix_sockets: true}}")}
	err = rt.Fits(unix, testkit.Policy(t, "capabilities: {containment: sealed}"), false)
	var nw *sealed.NotWarmError
	if !errors.As(err, &nw) || !strings.HasPrefix(nw.Field, "linux.seccomp") || !strings.Contains(err.Error(), "made with capsule sockets@1.0.0's seccomp filter") {
		t.Errorf("a default capsule in a unix_sockets shape: Fits = %v, want the seccomp filter named", err)
	}
}

// TestWarmNoCarryOver: a session writes into every place it can write; a session in the
// next sandbox sees none of it. Sandboxes serve one session each.
func TestWarmNoCarryOver(t *testing.T) {
	testkit.NeedRoot(t)
	rt, err := kit.NewSealedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs(), kit.Sealer(t))
	if err != nil {
		t.Fatal(err)
	}
	const caps = "capabilities: {containment: sealed, shell: {allow: [awk, sort, grep, cat, stat, ls, find, hostname, ipcmk, ipcs]}}"
	write := `for d in /work /tmp /dev/shm /root /run /dev /dev/mqueue /var/tmp /; do echo x > "$d/carried" 2>/dev/null && echo "wrote $d"; done
echo marker > /proc/self/comm; ipcmk -M 4096 >/dev/null 2>&1 && echo "wrote shm segment"; true`
	look := `find / -xdev -name carried 2>/dev/null; for d in /work /tmp /dev/shm /root /run /dev; do ls -A "$d" | grep -q carried && echo "found in $d"; done
ipcs -m | grep -c '^0x' ; true`
	var outs []string
	for i, script := range []string{write, look} {
		sb := kit.Prepare(t, rt, sealed.DefaultWarmShape(), "carry"+string(rune('a'+i)))
		s := kit.SealedSpec(t, "ses_carry"+string(rune('a'+i)), caps, script)
		testkit.ClaimSandbox(t, &s, sb.IDs, sb.Records)
		s.Home = filepath.Join(testkit.ReachableDir(t), "home")
		if err := os.Mkdir(s.Home, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(s.Home, int(sb.IDs.First), int(sb.IDs.First)); err != nil {
			t.Fatal(err)
		}
		_, out := runIn(t, rt, sb, s)
		outs = append(outs, out)
	}
	if !strings.Contains(outs[0], "wrote /tmp") || !strings.Contains(outs[0], "wrote /work") {
		t.Fatalf("the first session could not write where it should:\n%s", outs[0])
	}
	if strings.Contains(outs[1], "carried") || strings.Contains(outs[1], "found in") || strings.TrimSpace(outs[1]) != "0" {
		t.Errorf("the second sandbox sees the first session's writes:\n%s", outs[1])
	}
}

// TestHeldCountsComposedRoots: a root composed for a session or sandbox whose container was
// never made (roostd killed in between) is held, so that the leftover sweep frees it; the
// shared base root is not.
func TestHeldCountsComposedRoots(t *testing.T) {
	testkit.NeedRoot(t)
	state := testkit.ReachableDir(t)
	rt, err := kit.NewSealedRuntime(state, kit.Init(t), kit.IDs())
	if err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(state, "roots", sealed.WarmPrefix+"orphan")
	if err := os.MkdirAll(filepath.Join(orphan, "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	held, err := rt.Held()
	if err != nil || !slices.Contains(held, sealed.WarmPrefix+"orphan") || slices.ContainsFunc(held, func(h string) bool { return strings.HasPrefix(h, "base-") }) {
		t.Fatalf("Held = %v, %v; want the orphaned root and no base", held, err)
	}
	if err := rt.Release(sealed.WarmPrefix + "orphan"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatalf("the orphaned root is still there after Release: %v", err)
	}
}

// cgroupFiles reads the limits a session's cgroup at place has, in every hierarchy.
func cgroupFiles(place string) string {
	var b strings.Builder
	for _, mnt := range cgtest.Hierarchies() {
		for _, f := range []string{"pids.max", "memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "cpu.cfs_quota_us", "cpu.cfs_period_us", "memory.max", "memory.swap.max", "cpu.max"} {
			if data, err := os.ReadFile(filepath.Join(mnt, place, f)); err == nil {
				fmt.Fprintf(&b, "%s/%s %s", filepath.Base(mnt), f, data)
			}
		}
	}
	return b.String()
}

// A warm session's records directory holds, while its program runs, files roost-init made
// for it ahead (the end records' temporary files among them): the program cannot reach
// them through roost-init's descriptors to forge its end. Controls: the program reads its own
// descriptors and writes its own /tmp, and its real exit is what is recorded.
func TestWarmRecordsOutOfReach(t *testing.T) {
	testkit.NeedRoot(t)
	rt, err := kit.NewSealedRuntime(testkit.ReachableDir(t), kit.Init(t), kit.IDs(), kit.Sealer(t))
	if err != nil {
		t.Fatal(err)
	}
	const caps = "capabilities: {containment: sealed, shell: {allow: [ls, cat]}}"
	script := testkit.TryScript + `for f in /proc/1/fd/*; do
  ls "$f/" >/dev/null 2>&1 && echo "READ dir $f"
  for name in exit.json.tmp exit.json logs.json.tmp init.json.tmp; do
    (echo '{"code":0,"forged":true}' > "$f/$name") 2>/dev/null && echo "WROTE $f/$name"
  done
done
try own-fd0 ls -L /proc/$$/fd/0
try own-tmp sh -c 'echo x > /tmp/x'
try init-fd0 ls -L /proc/1/fd/0
exit 3`
	sb := kit.Prepare(t, rt, sealed.DefaultWarmShape(), "forge")
	s := kit.SealedSpec(t, "ses_warm_forge", caps, script)
	testkit.ClaimSandbox(t, &s, sb.IDs, sb.Records)
	s.Home = filepath.Join(testkit.ReachableDir(t), "home")
	if err := os.Mkdir(s.Home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(s.Home, int(sb.IDs.First), int(sb.IDs.First)); err != nil {
		t.Fatal(err)
	}
	info, out := runIn(t, rt, sb, s)
	if strings.Contains(out, "READ") || strings.Contains(out, "WROTE") {
		t.Fatalf("the records directory was reachable from the warm session:\n%s", out)
	}
	testkit.ExpectAllowed(t, out, "own-fd0", "own-tmp")
	testkit.ExpectDenied(t, out, syscall.EACCES, "init-fd0")
	if info.Code != 3 || info.StartError != "" {
		t.Errorf("the session's end is %+v, want its own exit 3", info)
	}
	exit := testkit.ReadFile(t, filepath.Join(s.RecordsDir, "exit.json"))
	if strings.Contains(exit, "forged") {
		t.Errorf("exit.json is the program's: %s", exit)
	}
}
