package sealed_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"roost.dev/roost/pkg/containment/internal/testkit"
)

// Hostile capsules: each test is one escape a sealed session tries, and what holds it.
// perl is perl-base, essential on Debian, so it is there to make the raw syscalls.

func TestHostileHostPathsAbsent(t *testing.T) {
	state, _ := os.Getwd()
	paths := []string{"/home", "/var/lib/roost", "/run/roost/roostd.sock", state, "/etc/shadow", "/proc/1/root/etc/shadow", "/root/.bashrc", "/root/.ssh"}
	var script strings.Builder
	script.WriteString(testkit.TryScript)
	for _, p := range paths {
		fmt.Fprintf(&script, "try %[1]q ls -d %[1]q\n", p)
	}
	// /root is the session's own home, empty at its start, never the host's.
	script.WriteString(`[ -z "$(ls -A /root)" ] && echo "own empty home" || echo "PRESENT host home"`)
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls]}}", script.String())
	if strings.Contains(out, "PRESENT") {
		t.Fatalf("host paths visible in the sealed root:\n%s", out)
	}
	// roost-init's root, its own, is out of the program's reach (roost-init is not dumpable).
	testkit.ExpectDenied(t, out, syscall.ENOENT, slices.DeleteFunc(slices.Clone(paths), func(p string) bool { return strings.HasPrefix(p, "/proc/1/") })...)
	testkit.ExpectDenied(t, out, syscall.EACCES, "/proc/1/root/etc/shadow")
	testkit.ExpectOutput(t, out, "own empty home")
	// The control: the same probe on the host sees every one of them the host has (the
	// state directory and /etc/shadow always), and a home that is not empty.
	var present []string
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			present = append(present, p)
		} else {
			t.Logf("%s is absent on this host too: the probe proves nothing of it here", p)
		}
	}
	if !slices.Contains(present, state) || !slices.Contains(present, "/etc/shadow") {
		t.Fatalf("the host lacks the state directory or /etc/shadow: %v", present)
	}
	host := testkit.OnHost(t, script.String())
	testkit.ExpectAllowed(t, host, present...)
	if entries, _ := os.ReadDir("/root"); len(entries) > 0 {
		testkit.ExpectOutput(t, host, "PRESENT host home")
	}
}

func TestHostileReadOnlyUsrEtc(t *testing.T) {
	// The same attempts at /work and /tmp are the control: touch runs, and writes where the
	// session may. Writing the host's /usr to prove the point is not an option.
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [touch]}}", testkit.TryScript+
		`write() { echo data > "$1"; }
for f in /usr/evil /etc/evil /capsule/evil /evil /.roost/evil /work/evil /tmp/evil; do try $f touch $f; done
try init write /.roost/roost-init
try own write /work/own`)
	testkit.ExpectAllowed(t, out, "/work/evil", "/tmp/evil", "own")
	testkit.ExpectDenied(t, out, syscall.EROFS, "/usr/evil", "/etc/evil", "/capsule/evil", "/evil", "/.roost/evil", "init")
}

func TestHostileUnixSocketsDenied(t *testing.T) {
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [perl]}}", testkit.UnixSocketProbe)
	// A stream socketpair connects the process only to itself: it is allowed without unix_sockets.
	testkit.ExpectOutput(t, out, "unix socket: Permission denied", "socketpair: allowed", "inet socket: allowed")
}

func TestHostileUnixSocketsAllowedWhenGranted(t *testing.T) {
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [perl]}, network: {unix_sockets: true}}", testkit.UnixSocketProbe)
	testkit.ExpectOutput(t, out, "unix socket: allowed", "socketpair: allowed")
}

func TestHostileOnlyLoopback(t *testing.T) {
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [cat]}}", `cat /proc/net/dev`)
	var ifaces []string
	for _, line := range strings.Split(out, "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok && !strings.Contains(name, "|") {
			ifaces = append(ifaces, strings.TrimSpace(name))
		}
	}
	if len(ifaces) != 1 || ifaces[0] != "lo" {
		t.Fatalf("interfaces %v:\n%s", ifaces, out)
	}
}

func TestHostileForkBombHeld(t *testing.T) {
	info, out, errOut, s := kit.SealedRun(t, "capabilities: {containment: sealed, resources: {cgroup_pids_max: 24}, shell: {allow: [sleep]}}",
		`n=0; while [ $n -lt 200 ]; do sleep 30 & n=$((n+1)); echo $n > /work/count; done; echo "spawned all"`)
	// The kernel refuses the fork past the limit: the shell says so and gives up.
	if info.Code == 0 || strings.Contains(out, "spawned all") || !strings.Contains(errOut, "fork") {
		t.Fatalf("200 processes under a limit of 24: exit %+v\nstdout: %s\nstderr: %s", info, out, errOut)
	}
	if n, err := strconv.Atoi(strings.TrimSpace(testkit.ReadFile(t, filepath.Join(s.Dir, "count")))); err != nil || n > 24 {
		t.Fatalf("%d background processes started under a limit of 24 (%v)", n, err)
	}
}

func TestHostileForkBombEnds(t *testing.T) {
	// A real bomb: every process forks two more, for ever. The pids limit holds it; the
	// session's end (here its own SIGKILL from a timer) reaps every one of them. The timer's
	// sleep is running before the bomb starts: forked once the pids are all taken, it would
	// fail, and the shell end at once.
	start := time.Now()
	info, _, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, resources: {cgroup_pids_max: 32}, shell: {allow: [sleep]}}",
		`( sleep 2; kill -KILL 0 ) & sleep 0.2; b() { b | b & }; b; wait`)
	if info.Signal != int(syscall.SIGKILL) && info.Code == 0 {
		t.Fatalf("exit %+v", info)
	}
	if time.Since(start) < 2*time.Second {
		t.Fatalf("the bomb ended after %s, before its timer: it never ran", time.Since(start))
	}
}

func TestHostileMemoryBombKilled(t *testing.T) {
	info, _, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, resources: {cgroup_memory_bytes: 67108864}, shell: {allow: [tail]}}",
		`tail /dev/zero`)
	if info.Code != 128+int(syscall.SIGKILL) {
		t.Fatalf("memory bomb was not killed: %+v", info)
	}
	if !info.OOMKilled {
		t.Fatalf("the OOM kill was not detected: %+v", info)
	}
}

func TestHostilePrivilegedSyscallsRefused(t *testing.T) {
	// x86_64 syscall numbers: mount 165, mknodat 259, ptrace 101, unshare 272, setns 308,
	// init_module 175, kexec_load 246, bpf 321. Each is made for real (perl's syscall takes
	// the number first, then the arguments) and must fail with EPERM: refused by seccomp or
	// for want of a capability, never attempted and failing for another reason.
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [perl, sleep]}}",
		`sleep 30 & sib=$!
perl -e '
use Errno qw(EPERM);
my $tmp = "tmpfs"; my $none = "none"; my $dir = "/tmp"; my $node = "/tmp/null"; my $empty = "";
my @calls = (["mount", 165, $none, $dir, $tmp, 0, 0], ["mknod", 259, -100, $node, 0020666, 259],
  ["ptrace_attach", 101, 16, '$sib', 0, 0], ["process_vm_readv", 310, '$sib', 0, 0, 0, 0, 0], ["unshare_user", 272, 0x10000000], ["unshare_mount", 272, 0x00020000],
  ["setns", 308, 0, 0], ["init_module", 175, 0, 0, $empty], ["kexec_load", 246, 0, 0, 0, 0], ["bpf", 321, 0, 0, 0]);
for my $c (@calls) { my ($n, $nr, @args) = @$c; $! = 0; my $r = syscall($nr, @args);
  print "$n: ", ($r < 0 && $!{EPERM} ? "refused" : "NOT REFUSED r=$r errno=$!"), "\n" }'
kill $sib`)
	if strings.Contains(out, "NOT REFUSED") {
		t.Fatalf("a privileged syscall was not refused with EPERM:\n%s", out)
	}
	testkit.ExpectOutput(t, out, "mount: refused", "mknod: refused", "ptrace_attach: refused", "process_vm_readv: refused", "unshare_user: refused",
		"unshare_mount: refused", "setns: refused", "init_module: refused", "kexec_load: refused", "bpf: refused")
}

func TestHostileOtherSessionsInvisible(t *testing.T) {
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls, cat, grep, tr]}}",
		`ls /proc | grep -c '^[0-9]' ; cat /proc/1/cmdline | tr '\0' ' '; echo`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 {
		t.Fatalf("output:\n%s", out)
	}
	// roost-init, the shell and its pipeline: a handful, never the host's hundreds.
	if n := strings.TrimSpace(lines[0]); len(n) > 1 {
		t.Fatalf("%s processes visible:\n%s", n, out)
	}
}

func TestHostileInitUntouchable(t *testing.T) {
	// PID 1 is roost-init: the program may not read its memory, its descriptors (the records
	// directory among them) or trace it.
	// The same reads of the program's own /proc entries are the control: they work, so what
	// fails on PID 1's is its being out of reach. ptrace has no such control in the session
	// (seccomp refuses it whatever the target): its errno is seccomp's.
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls, cat, perl]}}", testkit.TryScript+
		`for f in /proc/1/fd/*; do ls "$f/" >/dev/null 2>&1 && echo "READ dir $f"; [ -e "$f" ] && echo "READ (followed) $f"; done
for p in 1 $$; do
  who=init; [ $p = 1 ] || who=own
  try $who-environ cat /proc/$p/environ
  try $who-root ls /proc/$p/root/
  for fd in 0 1 2; do try $who-fd$fd ls -L /proc/$p/fd/$fd; done
done
try init-mem cat /proc/1/mem
perl -e '$r = syscall(101, 16, 1, 0, 0); print $r < 0 ? "denied ptrace: $!\n" : "ok ptrace\n"'`)
	if strings.Contains(out, "READ") {
		t.Fatalf("roost-init reachable:\n%s", out)
	}
	// Its descriptors' numbers can be listed; none can be followed (stat through the link
	// tells, where a read could block on a pipe; its stdio is tried by name: the rest come
	// and go as it works).
	testkit.ExpectAllowed(t, out, "own-environ", "own-root", "own-fd0", "own-fd1", "own-fd2")
	testkit.ExpectDenied(t, out, syscall.EACCES, "init-fd0", "init-fd1", "init-fd2", "init-environ", "init-root", "init-mem")
	testkit.ExpectDenied(t, out, syscall.EPERM, "ptrace")
}

func TestHostileTmpBounded(t *testing.T) {
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, resources: {workdir_max_bytes: 4194304}, shell: {allow: [head]}}",
		`head -c 16777216 /dev/zero 2>&1 >/tmp/flood; echo "rc=$?"`)
	testkit.ExpectOutput(t, out, "No space left on device")
}

func TestHostileScopeSymlinkRefused(t *testing.T) {
	testkit.NeedRoot(t)
	state := testkit.ReachableDir(t)
	rt, err := kit.NewSealedRuntime(state, kit.Init(t), kit.IDs(), kit.Sealer(t))
	if err != nil {
		t.Fatal(err)
	}
	s := kit.Spec(t, "/bin/true")
	s.SessionID = "ses_symlink"
	s.Policy = testkit.Policy(t, "capabilities: {containment: sealed, filesystem: {scope: src}}")
	s.CapsuleDir = t.TempDir()
	// A capsule that ran before in this workdir planted src -> /etc.
	if err := os.Symlink("/etc", filepath.Join(s.Dir, "src")); err != nil {
		t.Fatal(err)
	}
	_, err = rt.Start(t.Context(), s)
	if err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("a symlinked scope was mounted: %v", err)
	}
	if _, statErr := os.Stat(filepath.Join(state, "containers", s.SessionID)); !os.IsNotExist(statErr) {
		t.Fatalf("a refused start left its container state behind: %v", statErr)
	}
}

func TestHostileScopeHoldsWrites(t *testing.T) {
	// The write inside the scope is the control: the same touch, where the session may.
	_, out, _, s := kit.SealedRun(t, "capabilities: {containment: sealed, filesystem: {scope: src, read_only: [src/tests]}, shell: {allow: [touch]}}", testkit.TryScript+
		`try outside touch /work/outside
try inside touch /work/src/inside
try tests touch /work/src/tests/t`)
	testkit.ExpectAllowed(t, out, "inside")
	testkit.ExpectDenied(t, out, syscall.EROFS, "outside", "tests")
	if _, err := os.Stat(filepath.Join(s.Dir, "src", "inside")); err != nil {
		t.Fatalf("the scope's write did not reach the workdir: %v", err)
	}
}

func TestHostileWorkdirNoexec(t *testing.T) {
	probe := testkit.TryScript + `try copy cp /usr/bin/true /work/mytrue
try chmod chmod +x /work/mytrue
try run /work/mytrue`
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [cp, chmod]}}", probe)
	testkit.ExpectAllowed(t, out, "copy", "chmod")
	testkit.ExpectDenied(t, out, syscall.EACCES, "run")
	// The control: the same probe, in a session whose workdir may exec, runs it.
	_, out, _, _ = kit.SealedRun(t, "capabilities: {containment: sealed, filesystem: {workdir_exec: true}, shell: {allow: [cp, chmod]}}", probe)
	testkit.ExpectAllowed(t, out, "copy", "chmod", "run")
}

// A sealed root holds none of them: ENOENT.
func TestHostileSealedCannotReadDaemonSecrets(t *testing.T) {
	paths := kit.DaemonSecrets(t)
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [cat, ls]}}", testkit.ReadProbe(paths))
	testkit.ExpectRefused(t, out, paths, syscall.ENOENT)
}

// Inside a sealed root, root is a user namespace's: the map names the session's range, and
// the workdir it wrote is owned on the host by the range's first uid.
func TestHostileSealedUserNamespace(t *testing.T) {
	_, out, _, s := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [cat, id, touch, ls]}}",
		`cat /proc/self/uid_map /proc/self/gid_map; id -u; touch /work/made; cat /capsule/ >/dev/null 2>&1; ls -ld /usr >/dev/null && echo usr-readable`)
	want := fmt.Sprintf("0 %d 65536", s.IDs.First)
	if strings.Count(strings.Join(strings.Fields(out), " "), want) != 2 {
		t.Fatalf("user namespace maps are not %q:\n%s", want, out)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(s.Dir, "made"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != s.IDs.First || st.Gid != s.IDs.First {
		t.Fatalf("a file the session made is owned by %d:%d on the host, want %d", st.Uid, st.Gid, s.IDs.First)
	}
}

// What helps a kernel exploit find its targets is masked in a sealed root: every read of
// these returns nothing.
//
// A masked file opens and reads empty. One that fails to open is not masked, only refused
// (/proc/slabinfo is root's alone): unmasked, a kernel bug could still reach it.
func TestHostileSealedProcMasked(t *testing.T) {
	files := []string{"/proc/kallsyms", "/proc/slabinfo", "/proc/vmallocinfo", "/proc/kcore", "/proc/keys", "/proc/interrupts", "/proc/timer_list", "/proc/sched_debug"}
	var script strings.Builder
	for _, f := range files {
		// The first 4 KiB tell empty from not: the host's /proc/kcore is its memory.
		fmt.Fprintf(&script, "if head -c 4096 %[1]s >\"$T/read\" 2>\"$T/err\"; then echo \"read %[1]s $(wc -c <\"$T/read\")\"; else echo \"denied %[1]s: $(cat \"$T/err\")\"; fi\n", f)
	}
	_, out, _, _ := kit.SealedRun(t, "capabilities: {containment: sealed, shell: {allow: [cat, wc, head]}}", "T=/tmp\n"+script.String())
	// The control: the host reads every one it has, and finds something in it.
	host := testkit.OnHost(t, script.String(), "T="+t.TempDir())
	probed := 0
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			t.Logf("%s: not on this kernel", f)
			continue
		}
		if strings.Contains(host, "read "+f+" 0\n") || !strings.Contains(host, "read "+f+" ") {
			t.Errorf("the host reads nothing of %s: the probe proves nothing of it:\n%s", f, host)
			continue
		}
		probed++
		if !strings.Contains(out, "read "+f+" 0\n") {
			t.Errorf("%s is not masked in a sealed session (want it to open and read empty):\n%s", f, out)
		}
	}
	if probed == 0 {
		t.Fatal("none of the files is on this kernel")
	}
}
