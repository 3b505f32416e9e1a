package containment

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// tryScript defines try, through which escape probes make their attempts: try LABEL CMD
// ARGS... runs CMD ARGS with its output discarded and says "ok LABEL", or "denied LABEL: "
// and what the command said on stderr (on one line), which names the errno. An attempt
// judged only by failing would pass for a command that was never found, or was refused for
// a reason other than the one the test is about.
const tryScript = `try() { l=$1; shift; if e=$("$@" 2>&1 >/dev/null); then echo "ok $l"; else printf 'denied %s:' "$l"; (set -f; printf ' %s' $e); echo; fi; }
`

// attempt is what try said of one label.
type attempt struct {
	ok  bool
	msg string
}

func attempts(out string) map[string]attempt {
	m := map[string]attempt{}
	for _, line := range strings.Split(out, "\n") {
		if label, ok := strings.CutPrefix(line, "ok "); ok {
			m[label] = attempt{ok: true}
		} else if rest, ok := strings.CutPrefix(line, "denied "); ok {
			label, msg, _ := strings.Cut(rest, ": ")
			m[label] = attempt{msg: msg}
		}
	}
	return m
}

// expectAllowed fails unless every labelled attempt succeeded: a probe's positive control,
// which shows the attempt works where nothing holds it.
func expectAllowed(t *testing.T, out string, labels ...string) {
	t.Helper()
	got := attempts(out)
	for _, l := range labels {
		if a, ok := got[l]; !ok {
			t.Errorf("no attempt %q:\n%s", l, out)
		} else if !a.ok {
			t.Errorf("%s: denied (%s) where it must succeed:\n%s", l, a.msg, out)
		}
	}
}

// expectDenied fails unless every labelled attempt failed with errno, as the C library words
// it in the command's message.
func expectDenied(t *testing.T, out string, errno syscall.Errno, labels ...string) {
	t.Helper()
	expectDeniedSaying(t, out, errno.Error(), labels...)
}

// expectDeniedSaying fails unless every labelled attempt failed saying why in words that
// hold want (case aside): for a command that names the failure without its errno.
func expectDeniedSaying(t *testing.T, out, want string, labels ...string) {
	t.Helper()
	got := attempts(out)
	for _, l := range labels {
		switch a, ok := got[l]; {
		case !ok:
			t.Errorf("no attempt %q:\n%s", l, out)
		case a.ok:
			t.Errorf("%s: ESCAPED: the attempt succeeded:\n%s", l, out)
		case !strings.Contains(strings.ToLower(a.msg), strings.ToLower(want)):
			t.Errorf("%s: denied with %q, want %q:\n%s", l, a.msg, want, out)
		}
	}
}

// onHost runs a probe script with /bin/sh on the host, as the test (root), with env added:
// the positive control of attempts that must all succeed there.
func onHost(t *testing.T, script string, env ...string) string {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the probe on the host: %v\n%s", err, out)
	}
	return string(out)
}

func TestHostileHostPathsAbsent(t *testing.T) {
	state, _ := os.Getwd()
	paths := []string{"/home", "/var/lib/roost", "/run/roost/roostd.sock", state, "/etc/shadow", "/proc/1/root/etc/shadow", "/root/.bashrc", "/root/.ssh"}
	var script strings.Builder
	script.WriteString(tryScript)
	for _, p := range paths {
		fmt.Fprintf(&script, "try %[1]q ls -d %[1]q\n", p)
	}
	// /root is the session's own home, empty at its start, never the host's.
	script.WriteString(`[ -z "$(ls -A /root)" ] && echo "own empty home" || echo "PRESENT host home"`)
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls]}}", script.String())
	if strings.Contains(out, "PRESENT") {
		t.Fatalf("host paths visible in the sealed root:\n%s", out)
	}
	// roost-init's root, its own, is out of the program's reach (roost-init is not dumpable).
	expectDenied(t, out, syscall.ENOENT, slices.DeleteFunc(slices.Clone(paths), func(p string) bool { return strings.HasPrefix(p, "/proc/1/") })...)
	expectDenied(t, out, syscall.EACCES, "/proc/1/root/etc/shadow")
	expectOutput(t, out, "own empty home")
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
	host := onHost(t, script.String())
	expectAllowed(t, host, present...)
	if entries, _ := os.ReadDir("/root"); len(entries) > 0 {
		expectOutput(t, host, "PRESENT host home")
	}
}

func TestHostileReadOnlyUsrEtc(t *testing.T) {
	// The same attempts at /work and /tmp are the control: touch runs, and writes where the
	// session may. Writing the host's /usr to prove the point is not an option.
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [touch]}}", tryScript+
		`write() { echo data > "$1"; }
for f in /usr/evil /etc/evil /capsule/evil /evil /.roost/evil /work/evil /tmp/evil; do try $f touch $f; done
try init write /.roost/roost-init
try own write /work/own`)
	expectAllowed(t, out, "/work/evil", "/tmp/evil", "own")
	expectDenied(t, out, syscall.EROFS, "/usr/evil", "/etc/evil", "/capsule/evil", "/evil", "/.roost/evil", "init")
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
	// The same reads of the program's own /proc entries are the control: they work, so what
	// fails on PID 1's is its being out of reach. ptrace has no such control in the session
	// (seccomp refuses it whatever the target): its errno is seccomp's.
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [ls, cat, perl]}}", tryScript+
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
	expectAllowed(t, out, "own-environ", "own-root", "own-fd0", "own-fd1", "own-fd2")
	expectDenied(t, out, syscall.EACCES, "init-fd0", "init-fd1", "init-fd2", "init-environ", "init-root", "init-mem")
	expectDenied(t, out, syscall.EPERM, "ptrace")
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
	// The write inside the scope is the control: the same touch, where the session may.
	_, out, _, s := sealedRun(t, "capabilities: {containment: sealed, filesystem: {scope: src, read_only: [src/tests]}, shell: {allow: [touch]}}", tryScript+
		`try outside touch /work/outside
try inside touch /work/src/inside
try tests touch /work/src/tests/t`)
	expectAllowed(t, out, "inside")
	expectDenied(t, out, syscall.EROFS, "outside", "tests")
	if _, err := os.Stat(filepath.Join(s.Dir, "src", "inside")); err != nil {
		t.Fatalf("the scope's write did not reach the workdir: %v", err)
	}
}

func TestHostileWorkdirNoexec(t *testing.T) {
	probe := tryScript + `try copy cp /usr/bin/true /work/mytrue
try chmod chmod +x /work/mytrue
try run /work/mytrue`
	_, out, _, _ := sealedRun(t, "capabilities: {containment: sealed, shell: {allow: [cp, chmod]}}", probe)
	expectAllowed(t, out, "copy", "chmod")
	expectDenied(t, out, syscall.EACCES, "run")
	// The control: the same probe, in a session whose workdir may exec, runs it.
	_, out, _, _ = sealedRun(t, "capabilities: {containment: sealed, filesystem: {workdir_exec: true}, shell: {allow: [cp, chmod]}}", probe)
	expectAllowed(t, out, "copy", "chmod", "run")
}
