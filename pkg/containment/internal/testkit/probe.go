package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TryScript defines try, through which escape probes make their attempts: try LABEL CMD
// ARGS... runs CMD ARGS with its output discarded and says "ok LABEL", or "denied LABEL: "
// and what the command said on stderr (on one line), which names the errno. An attempt
// judged only by failing would pass for a command that was never found, or was refused for
// a reason other than the one the test is about.
const TryScript = `try() { l=$1; shift; if e=$("$@" 2>&1 >/dev/null); then echo "ok $l"; else printf 'denied %s:' "$l"; (set -f; printf ' %s' $e); echo; fi; }
`

// Attempt is what try said of one label.
type Attempt struct {
	OK  bool
	Msg string
}

// Attempts reads what try said, by label.
func Attempts(out string) map[string]Attempt {
	m := map[string]Attempt{}
	for _, line := range strings.Split(out, "\n") {
		if label, ok := strings.CutPrefix(line, "ok "); ok {
			m[label] = Attempt{OK: true}
		} else if rest, ok := strings.CutPrefix(line, "denied "); ok {
			label, msg, _ := strings.Cut(rest, ": ")
			m[label] = Attempt{Msg: msg}
		}
	}
	return m
}

// ExpectAllowed fails unless every labelled attempt succeeded: a probe's positive control,
// which shows the attempt works where nothing holds it.
func ExpectAllowed(t *testing.T, out string, labels ...string) {
	t.Helper()
	got := Attempts(out)
	for _, l := range labels {
		if a, ok := got[l]; !ok {
			t.Errorf("no attempt %q:\n%s", l, out)
		} else if !a.OK {
			t.Errorf("%s: denied (%s) where it must succeed:\n%s", l, a.Msg, out)
		}
	}
}

// ExpectDenied fails unless every labelled attempt failed with errno, as the C library words
// it in the command's message.
func ExpectDenied(t *testing.T, out string, errno syscall.Errno, labels ...string) {
	t.Helper()
	ExpectDeniedSaying(t, out, errno.Error(), labels...)
}

// ExpectDeniedSaying fails unless every labelled attempt failed saying why in words that
// hold want (case aside): for a command that names the failure without its errno.
func ExpectDeniedSaying(t *testing.T, out, want string, labels ...string) {
	t.Helper()
	got := Attempts(out)
	for _, l := range labels {
		switch a, ok := got[l]; {
		case !ok:
			t.Errorf("no attempt %q:\n%s", l, out)
		case a.OK:
			t.Errorf("%s: ESCAPED: the attempt succeeded:\n%s", l, out)
		case !strings.Contains(strings.ToLower(a.Msg), strings.ToLower(want)):
			t.Errorf("%s: denied with %q, want %q:\n%s", l, a.Msg, want, out)
		}
	}
}

// OnHost runs a probe script with /bin/sh on the host, as the test (root), with env added:
// the positive control of attempts that must all succeed there.
func OnHost(t *testing.T, script string, env ...string) string {
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

// UnixSocketProbe says whether a session may make an AF_UNIX socket, a stream socketpair and
// an AF_INET socket. perl is perl-base, essential on Debian, so it is there to make the raw
// syscalls.
const UnixSocketProbe = `perl -e 'use Socket; if (socket(my $s, PF_UNIX, SOCK_STREAM, 0)) { print "unix socket: allowed\n" } else { print "unix socket: $!\n" }
if (socketpair(my $a, my $b, AF_UNIX, SOCK_STREAM, PF_UNSPEC)) { print "socketpair: allowed\n" } else { print "socketpair: $!\n" }
if (socket(my $t, PF_INET, SOCK_STREAM, 0)) { print "inet socket: allowed\n" } else { print "inet socket: $!\n" }'`

// ReadProbe is a script that tries to read every path, each attempt labelled by its path. A
// directory is read by listing it, a file by reading its bytes (ls of a file only looks at
// its directory).
func ReadProbe(paths []string) string {
	var b strings.Builder
	b.WriteString(TryScript)
	b.WriteString(`readpath() { if [ -d "$1" ]; then ls "$1"; else cat "$1"; fi; }` + "\n")
	for _, p := range paths {
		fmt.Fprintf(&b, "try %[1]q readpath %[1]q\n", p)
	}
	return b.String()
}

// ExpectRefused fails unless the session was refused every path with errno, and the same
// probe on the host read every one: the paths are there, and readable to whoever may.
func ExpectRefused(t *testing.T, out string, paths []string, errno syscall.Errno) {
	t.Helper()
	ExpectDenied(t, out, errno, paths...)
	ExpectAllowed(t, OnHost(t, ReadProbe(paths)), paths...)
}

// DaemonSecrets lays out what a session must never read: a state directory as roostd keeps
// it (the key, the registry, another session's records and workdir), an upstream's key file
// in /etc, and a world-readable file under /srv. It returns the paths to probe.
func (k *Kit) DaemonSecrets(t *testing.T) []string {
	t.Helper()
	state := ReachableDir(t)
	files := map[string]os.FileMode{
		"credential.key":                  0o600,
		"roost.db":                        0o600,
		"ledger.db":                       0o600,
		"records/ses_other/stdout.log":    0o600,
		"records/ses_other/exit.json":     0o600,
		"work/ses_other/notes.txt":        0o644,
		"artifacts/refs.db":               0o600,
		"containers/ses_other/state.json": 0o600,
	}
	dirs := map[string]os.FileMode{"records": 0o711, "records/ses_other": 0o711, "work": 0o711, "work/ses_other": 0o700,
		"artifacts": 0o711, "containers": 0o700, "containers/ses_other": 0o700}
	for d, mode := range dirs {
		if err := os.MkdirAll(filepath.Join(state, d), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(state, d), mode); err != nil {
			t.Fatal(err)
		}
	}
	// Another session's workdir is its own uid's.
	other := k.IDs()
	if err := os.Chown(filepath.Join(state, "work/ses_other"), int(other.First), int(other.First)); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for f, mode := range files {
		p := filepath.Join(state, f)
		if err := os.WriteFile(p, []byte("SECRET "+f+"\n"), mode); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	key := fmt.Sprintf("/etc/roost-test-%d.key", os.Getpid())
	srv := fmt.Sprintf("/srv/roost-test-%d", os.Getpid())
	if err := os.WriteFile(key, []byte("sk-SECRET\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(srv, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(srv, "public.txt"), []byte("SECRET srv\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(key); os.RemoveAll(srv) })
	hostTmp, err := os.CreateTemp("", "roost-test-host-tmp-")
	if err != nil {
		t.Fatal(err)
	}
	hostTmp.WriteString("SECRET tmp\n")
	hostTmp.Close()
	os.Chmod(hostTmp.Name(), 0o644)
	t.Cleanup(func() { os.Remove(hostTmp.Name()) })
	return append(paths, key, filepath.Join(srv, "public.txt"), "/etc/shadow", hostTmp.Name(), filepath.Join(state, "records/ses_other"))
}
