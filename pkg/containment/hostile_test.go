package containment

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Hostile capsules: each test is one escape a sealed session tries, and what holds it.
// perl is perl-base, essential on Debian, so it is there to make the raw syscalls.

func expectOutput(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func TestHostileHostPathsAbsent(t *testing.T) {
	state, _ := os.Getwd()
	// /root is the session's own home, empty at its start, never the host's.
	script := `for p in /home /var/lib/roost /run/roost/roostd.sock ` + state + ` /etc/shadow /proc/1/root/etc/shadow /root/.bashrc /root/.ssh; do
  if [ -e "$p" ]; then echo "PRESENT $p"; else echo "absent $p"; fi
done
[ -z "$(ls -A /root)" ] && echo "own empty home" || echo "PRESENT host home"`
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls]}}", script)
	if strings.Contains(out, "PRESENT") {
		t.Fatalf("host paths visible in the sealed root:\n%s", out)
	}
	expectOutput(t, out, "absent /home", "absent "+state, "absent /root/.ssh")
}

func TestHostileReadOnlyUsrEtc(t *testing.T) {
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [touch]}}",
		`for f in /usr/evil /etc/evil /capsule/evil /evil /.roost/evil; do touch $f 2>/dev/null && echo "WROTE $f" || echo "refused $f"; done
echo data > /.roost/roost-init 2>/dev/null && echo "WROTE init" || echo "refused init"`)
	if strings.Contains(out, "WROTE") {
		t.Fatalf("wrote outside /work and /tmp:\n%s", out)
	}
	expectOutput(t, out, "refused /usr/evil", "refused /etc/evil", "refused /capsule/evil", "refused init")
}

const unixSocketProbe = `perl -e 'use Socket; if (socket(my $s, PF_UNIX, SOCK_STREAM, 0)) { print "unix socket: allowed\n" } else { print "unix socket: $!\n" }
if (socketpair(my $a, my $b, AF_UNIX, SOCK_STREAM, PF_UNSPEC)) { print "socketpair: allowed\n" } else { print "socketpair: $!\n" }
if (socket(my $t, PF_INET, SOCK_STREAM, 0)) { print "inet socket: allowed\n" } else { print "inet socket: $!\n" }'`

func TestHostileUnixSocketsDenied(t *testing.T) {
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [perl]}}", unixSocketProbe)
	// A stream socketpair connects the process only to itself: it is allowed without unix_sockets.
	expectOutput(t, out, "unix socket: Permission denied", "socketpair: allowed", "inet socket: allowed")
}

func TestHostileUnixSocketsAllowedWhenGranted(t *testing.T) {
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [perl]}, network: {unix_sockets: true}}", unixSocketProbe)
	expectOutput(t, out, "unix socket: allowed", "socketpair: allowed")
}

func TestHostileOnlyLoopback(t *testing.T) {
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [cat]}}", `cat /proc/net/dev`)
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
	info, out, errOut, s := sealedRun(t, "capabilities: {containment: sealed, resources: {cgroup_pids_max: 24}, shell: {allow: [sleep]}}",
		`n=0; while [ $n -lt 200 ]; do sleep 30 & n=$((n+1)); echo $n > /work/count; done; echo "spawned all"`)
	// The kernel refuses the fork past the limit: the shell says so and gives up.
	if info.Code == 0 || strings.Contains(out, "spawned all") || !strings.Contains(errOut, "fork") {
		t.Fatalf("200 processes under a limit of 24: exit %+v\nstdout: %s\nstderr: %s", info, out, errOut)
	}
	if n, err := strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(s.Dir, "count")))); err != nil || n > 24 {
		t.Fatalf("%d background processes started under a limit of 24 (%v)", n, err)
	}
}

func TestHostileForkBombEnds(t *testing.T) {
	// A real bomb: every process forks two more, for ever. The pids limit holds it; the
	// session's end (here its own SIGKILL from a timer) reaps every one of them. The timer's
	// sleep is running before the bomb starts: forked once the pids are all taken, it would
	// fail, and the shell end at once.
	start := time.Now()
	info, _, _, _ := sealedRun(t, "capabilities: {containment: sealed, resources: {cgroup_pids_max: 32}, shell: {allow: [sleep]}}",
		`( sleep 2; kill -KILL 0 ) & sleep 0.2; b() { b | b & }; b; wait`)
	if info.Signal != int(syscall.SIGKILL) && info.Code == 0 {
		t.Fatalf("exit %+v", info)
	}
	if time.Since(start) < 2*time.Second {
		t.Fatalf("the bomb ended after %s, before its timer: it never ran", time.Since(start))
	}
}

func TestHostileMemoryBombKilled(t *testing.T) {
	info, _, _, _ := sealedRun(t, "capabilities: {containment: sealed, resources: {cgroup_memory_bytes: 67108864}, shell: {allow: [tail]}}",
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
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [perl, sleep]}}",
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
	expectOutput(t, out, "mount: refused", "mknod: refused", "ptrace_attach: refused", "process_vm_readv: refused", "unshare_user: refused",
		"unshare_mount: refused", "setns: refused", "init_module: refused", "kexec_load: refused", "bpf: refused")
}

func TestHostileOtherSessionsInvisible(t *testing.T) {
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls, cat, grep, tr]}}",
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
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls, cat, perl]}}",
		`for f in /proc/1/fd/*; do ls "$f/" >/dev/null 2>&1 && echo "READ dir $f"; cat "$f" >/dev/null 2>&1 && echo "READ $f"; done
for f in /proc/1/mem /proc/1/environ /proc/1/root/; do cat "$f" >/dev/null 2>&1 && echo "READ $f" || echo "$f refused"; done
perl -e '$r = syscall(101, 16, 1, 0, 0); print "ptrace pid1: ", ($r < 0 ? "refused" : "ALLOWED"), "\n"'`)
	if strings.Contains(out, "READ") || strings.Contains(out, "ALLOWED") {
		t.Fatalf("roost-init reachable:\n%s", out)
	}
	expectOutput(t, out, "/proc/1/mem refused", "/proc/1/environ refused", "ptrace pid1: refused")
}

func TestHostileTmpBounded(t *testing.T) {
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, resources: {workdir_max_bytes: 4194304}, shell: {allow: [head]}}",
		`head -c 16777216 /dev/zero 2>&1 >/tmp/flood; echo "rc=$?"`)
	expectOutput(t, out, "No space left on device")
}

func TestHostileScopeSymlinkRefused(t *testing.T) {
	needRoot(t)
	rt, err := NewSealedRuntime(reachableDir(t), staticInit(t), testIDs(), testSealer(t))
	if err != nil {
		t.Fatal(err)
	}
	s := spec(t, "/bin/true")
	s.SessionID = "ses_symlink"
	s.Policy = sealedPolicy(t, "capabilities: {containment: sealed, filesystem: {scope: src}}")
	s.CapsuleDir = t.TempDir()
	// A capsule that ran before in this workdir planted src -> /etc.
	if err := os.Symlink("/etc", filepath.Join(s.Dir, "src")); err != nil {
		t.Fatal(err)
	}
	_, err = rt.Start(t.Context(), s)
	if err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("a symlinked scope was mounted: %v", err)
	}
	if _, statErr := os.Stat(filepath.Join(rt.containers, s.SessionID)); !os.IsNotExist(statErr) {
		t.Fatalf("a refused start left its container state behind: %v", statErr)
	}
}

func TestHostileScopeHoldsWrites(t *testing.T) {
	_, out, _, s := sealedRun(t, "capabilities: {containment: sealed, filesystem: {scope: src, read_only: [src/tests]}, shell: {allow: [touch]}}",
		`touch /work/outside 2>/dev/null && echo "WROTE outside" || echo "refused outside"
touch /work/src/inside && echo "wrote inside"
touch /work/src/tests/t 2>/dev/null && echo "WROTE tests" || echo "refused tests"`)
	if strings.Contains(out, "WROTE") {
		t.Fatalf("a write escaped the scope:\n%s", out)
	}
	expectOutput(t, out, "refused outside", "wrote inside", "refused tests")
	if _, err := os.Stat(filepath.Join(s.Dir, "src", "inside")); err != nil {
		t.Fatalf("the scope's write did not reach the workdir: %v", err)
	}
}

func TestHostileWorkdirNoexec(t *testing.T) {
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [cp, chmod]}}",
		`cp /usr/bin/true /work/mytrue && chmod +x /work/mytrue && /work/mytrue && echo "RAN" || echo "refused"`)
	if strings.Contains(out, "RAN") {
		t.Fatalf("a binary copied into the workdir ran:\n%s", out)
	}
}
