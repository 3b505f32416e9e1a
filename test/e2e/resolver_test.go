package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"roost.dev/roost/internal/testenv"
)

// lookupC is a static musl program: getaddrinfo of each argument, printing the error's name
// (musl's own numbers) or the addresses found, sorted by family.
const lookupC = `#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
	for (int i = 1; i < argc; i++) {
		struct addrinfo hints, *res, *p;
		memset(&hints, 0, sizeof hints);
		hints.ai_socktype = SOCK_STREAM;
		int rc = getaddrinfo(argv[i], "443", &hints, &res);
		if (rc != 0) {
			const char *name = rc == EAI_NONAME ? "EAI_NONAME" : rc == EAI_AGAIN ? "EAI_AGAIN" : rc == EAI_FAIL ? "EAI_FAIL" : "other";
			printf("musl %s: %s (%d)\n", argv[i], name, rc);
			continue;
		}
		char v4[64] = "", v6[64] = "";
		for (p = res; p; p = p->ai_next) {
			if (p->ai_family == AF_INET)
				inet_ntop(AF_INET, &((struct sockaddr_in *)p->ai_addr)->sin_addr, v4, sizeof v4);
			else if (p->ai_family == AF_INET6)
				inet_ntop(AF_INET6, &((struct sockaddr_in6 *)p->ai_addr)->sin6_addr, v6, sizeof v6);
		}
		printf("musl %s: ok %s %s\n", argv[i], v4, v6);
		freeaddrinfo(res);
	}
	return 0;
}
`

// buildMuslLookup compiles lookupC, static, with musl-gcc (Debian's musl-tools).
func buildMuslLookup(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("musl-gcc")
	testenv.Need(t, "musl-gcc (musl-tools)", err)
	dir := t.TempDir()
	src := filepath.Join(dir, "lookup.c")
	if err := os.WriteFile(src, []byte(lookupC), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "lookup")
	if out, err := exec.Command(cc, "-static", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("musl-gcc: %v\n%s", err, out)
	}
	return bin
}

// resolverProbes is a session's script: glibc's getent (gethostbyname2, AAAA first) and
// Python's getaddrinfo on a name network.allow covers and on one it does not, and curl to
// the covered name past the proxy. (Not getent ahosts: its AI_ADDRCONFIG finds no address
// but loopback in the namespace, and so no family to ask for.)
const resolverProbes = `set +e
a=$(getent hosts allowed.test); echo "getent-allowed: exit=$? ${a%% *}"
getent hosts other.test; echo "getent-other: exit=$?"
python3 - <<'EOF'
import socket
for name in ("allowed.test", "x.wild.test", "other.test"):
    try:
        addrs = sorted({ai[4][0] for ai in socket.getaddrinfo(name, 443, type=socket.SOCK_STREAM)})
        print("py %s: ok %s" % (name, " ".join(addrs)))
    except socket.gaierror as e:
        print("py %s: %s" % (name, "EAI_NONAME" if e.errno == socket.EAI_NONAME else "EAI_AGAIN" if e.errno == socket.EAI_AGAIN else str(e.errno)))
EOF
curl -s --noproxy '*' --max-time 20 -o /dev/null http://allowed.test/; echo "curl-direct: exit=$?"
`

func resolverCaps(class, shell string) string {
	return fmt.Sprintf("capabilities:\n  containment: %s\n  network:\n    allow: [allowed.test, \"*.wild.test\"]\n%s  limits:\n    deadline_seconds: 120\n", class, shell)
}

// Inside a sealed and a scoped session, a name network.allow covers resolves to loopback
// and another is NXDOMAIN, at once, for glibc (getent, Python) and musl alike: musl gets
// EAI_NONAME, where with nothing answering 127.0.0.1:53 it waited out its timeout and
// failed EAI_AGAIN. A client past the proxy that connects to the covered name is refused at
// once by its own loopback (curl's exit 7). The musl program's positive control is the
// host, where it resolves localhost, and localhost in the session (from /etc/hosts).
func TestResolverInSessions(t *testing.T) {
	lookup := buildMuslLookup(t)
	if out, err := exec.Command(lookup, "localhost").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "musl localhost: ok 127.0.0.1") {
		t.Fatalf("the musl program on the host: %v\n%s", err, out)
	}
	d := newDaemon(t)
	for _, class := range []string{"sealed", "scoped"} {
		t.Run(class, func(t *testing.T) {
			res := d.ctlWithin(3*time.Minute, "run", capsule(t, "dns-"+class, resolverProbes, resolverCaps(class, "  shell:\n    allow: [getent, curl, \"@python\"]\n")))
			t.Logf("%s session:\n%s%s", class, res.stdout, res.stderr)
			for name, want := range map[string]string{
				"getent-allowed":  "getent-allowed: exit=0 ::1",
				"getent-other":    "getent-other: exit=2",
				"py allowed.test": "py allowed.test: ok 127.0.0.1 ::1",
				"py x.wild.test":  "py x.wild.test: ok 127.0.0.1 ::1",
				"py other.test":   "py other.test: EAI_NONAME",
				"curl-direct":     "curl-direct: exit=7",
			} {
				if l := probeLine(t, res.stdout, name); l != want {
					t.Errorf("got %q, want %q", l, want)
				}
			}

			dir := capsule(t, "musl-"+class, "", resolverCaps(class, ""))
			if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(lookup)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "bin", "lookup"), data, 0o755); err != nil {
				t.Fatal(err)
			}
			yaml := fmt.Sprintf("name: musl-%s\nversion: 0.1.0\nrun:\n  command: [bin/lookup, localhost, other.test, allowed.test, x.wild.test]\n%s", class, resolverCaps(class, ""))
			if err := os.WriteFile(filepath.Join(dir, "capsule.yaml"), []byte(yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			res = d.ctlWithin(3*time.Minute, "run", dir)
			t.Logf("%s musl session:\n%s%s", class, res.stdout, res.stderr)
			for name, want := range map[string]string{
				"musl localhost":    "musl localhost: ok 127.0.0.1",
				"musl other.test":   "musl other.test: EAI_NONAME (-2)",
				"musl allowed.test": "musl allowed.test: ok 127.0.0.1 ::1",
				"musl x.wild.test":  "musl x.wild.test: ok 127.0.0.1 ::1",
			} {
				if l := probeLine(t, res.stdout, name); !strings.HasPrefix(l, want) {
					t.Errorf("got %q, want it to begin %q", l, want)
				}
			}
		})
	}
}

// dnsIn asks the resolver at 127.0.0.1:53 in the network namespace at ns for name's A
// record; it returns the rcode and the first address.
func dnsIn(t *testing.T, ns, name string) (dnsmessage.RCode, string) {
	t.Helper()
	var c net.Conn
	err := inNetNS(ns, func() (err error) {
		c, err = net.Dial("udp", "127.0.0.1:53")
		return err
	})
	if err != nil {
		t.Fatalf("a socket to the resolver in %s: %v", ns, err)
	}
	defer c.Close()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	msg, _ := b.Finish()
	// Only keeps a missing resolver from hanging the test; the error fails it.
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("the resolver in %s: %v", ns, err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil {
		t.Fatal(err)
	}
	for _, a := range m.Answers {
		if b, ok := a.Body.(*dnsmessage.AResource); ok {
			return m.RCode, net.IP(b.A[:]).String()
		}
	}
	return m.RCode, ""
}

// udpInode is the socket inode of what listens on 127.0.0.1:53 in the namespace at ns
// (/proc/net/udp as seen from there); "" for nothing.
func udpInode(t *testing.T, ns string) string {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+ns, "cat", "/proc/net/udp").Output()
	if err != nil {
		t.Fatalf("/proc/net/udp in %s: %v", ns, err)
	}
	for _, l := range strings.Split(string(out), "\n")[1:] {
		// 0100007F:0035 is 127.0.0.1:53; field 9 is the inode.
		if f := strings.Fields(l); len(f) > 9 && f[1] == "0100007F:0035" {
			return f[9]
		}
	}
	return ""
}

// holds says whether process pid has the socket of inode open.
func holds(t *testing.T, pid int, inode string) bool {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); l == "socket:["+inode+"]" {
			return true
		}
	}
	return false
}

// A session's resolver is roostd's socket in the session's namespace: it answers while the
// session runs, again after roostd is killed and restarted (recovery reopens it as it
// reopens the endpoint), and once the session ends roostd holds it no more.
func TestResolverLifecycle(t *testing.T) {
	d := newDaemon(t)
	id := strings.TrimSpace(d.ok("run", "-d", capsule(t, "dns-sleeper", "sleep 300", resolverCaps("sealed", "  shell:\n    allow: [sleep]\n"))))
	ns := filepath.Join(d.stateDir, "netns", id)
	waitFor(t, "the session's namespace", func() bool { _, err := os.Stat(ns); return err == nil })
	check := func(when string) string {
		t.Helper()
		if rcode, a := dnsIn(t, ns, "allowed.test."); rcode != dnsmessage.RCodeSuccess || a != "127.0.0.1" {
			t.Fatalf("%s: allowed.test is %v %q; want 127.0.0.1", when, rcode, a)
		}
		if rcode, _ := dnsIn(t, ns, "other.test."); rcode != dnsmessage.RCodeNameError {
			t.Fatalf("%s: other.test is %v; want NXDOMAIN", when, rcode)
		}
		inode := udpInode(t, ns)
		if inode == "" || !holds(t, d.cmd.Process.Pid, inode) {
			t.Fatalf("%s: roostd (pid %d) does not hold the resolver's socket (inode %q)", when, d.cmd.Process.Pid, inode)
		}
		return inode
	}
	check("running")
	d.kill9()
	if inode := udpInode(t, ns); inode != "" {
		t.Fatalf("with roostd killed, socket %s still listens in the session's namespace", inode)
	}
	d.start()
	inode := check("after a restart")
	d.ok("kill", id)
	waitFor(t, "the session to end", func() bool { return d.inspect(id).State == "exited" })
	// What ending lets go of, it lets go of around the state change: wait for it, as long
	// as waitFor does.
	waitFor(t, "roostd to let go of the resolver's socket "+inode, func() bool { return !holds(t, d.cmd.Process.Pid, inode) })
	waitFor(t, "the session's namespace pin to go", func() bool { _, err := os.Stat(ns); return os.IsNotExist(err) })
}
