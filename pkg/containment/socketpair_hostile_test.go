package containment_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"roost.dev/roost/internal/testenv"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/containment/internal/testkit"
)

// socketpair is not a network: both ends are born in the calling process, so a session holds
// it without network.unix_sockets. Node's child_process and Python's asyncio need it. What
// reaches sockets outside the session, socket(AF_UNIX), stays refused, and so does a
// datagram pair, whose ends can sendto(2) or connect(2) any named socket.

// socketpairClasses runs a script in each class with a kernel sandbox.
var socketpairClasses = []struct {
	name string
	run  func(*testing.T, string, string) (containment.ExitInfo, string, string, containment.Spec)
}{
	{"scoped", kit.ScopedRun},
	{"sealed", kit.SealedRun},
}

// socketpairPython prints one line per probe: "works" (or "exit 0"), "allowed", or the error.
// argv[1] is socketpair's syscall number, for the raw call ctypes makes.
const socketpairPython = `
import asyncio, ctypes, errno, socket, sys

def show(name, f):
    try:
        print(name + ": " + f())
    except OSError as e:
        print(name + ": " + type(e).__name__ + " " + errno.errorcode.get(e.errno, str(e.errno)))

def pair(*args):
    a, b = socket.socketpair(*args)
    a.sendall(b"x")
    return "works" if b.recv(1) == b"x" else "lost the byte"

async def child():
    await asyncio.sleep(0)
    p = await asyncio.create_subprocess_exec("/bin/true")
    return "exit " + str(await p.wait())

def unix_socket():
    socket.socket(socket.AF_UNIX).close()
    return "allowed"

def raw_pair(family, kind):
    libc = ctypes.CDLL(None, use_errno=True)
    fds = (ctypes.c_int * 2)()
    if libc.syscall(ctypes.c_long(int(sys.argv[1])), ctypes.c_long(family), ctypes.c_long(kind), ctypes.c_long(0), fds) == 0:
        return "allowed"
    return errno.errorcode[ctypes.get_errno()]

show("stream pair", pair)
show("seqpacket pair", lambda: pair(socket.AF_UNIX, socket.SOCK_SEQPACKET))
show("nonblocking cloexec pair", lambda: pair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC))
show("asyncio subprocess", lambda: asyncio.run(child()))
show("unix socket", unix_socket)
show("dgram pair", lambda: pair(socket.AF_UNIX, socket.SOCK_DGRAM))
show("raw socketpair stream", lambda: raw_pair(socket.AF_UNIX, socket.SOCK_STREAM))
show("raw socketpair family with high bits", lambda: raw_pair((1 << 32) | socket.AF_UNIX, socket.SOCK_DGRAM))
`

func TestSocketpairWithoutUnixSockets(t *testing.T) {
	script := `/usr/bin/python3 -c '` + socketpairPython + `' ` + strconv.Itoa(unix.SYS_SOCKETPAIR)
	for _, c := range socketpairClasses {
		t.Run(c.name, func(t *testing.T) {
			_, out, errOut, _ := c.run(t, "capabilities: {containment: "+c.name+", shell: {allow: [/usr/bin/python3, /bin/true]}}", script)
			testkit.ExpectOutput(t, out,
				"stream pair: works",
				"seqpacket pair: works",
				"nonblocking cloexec pair: works",
				"asyncio subprocess: exit 0",
				"raw socketpair stream: allowed",
				// What connects outside the session stays refused.
				"unix socket: PermissionError EACCES",
				"dgram pair: PermissionError EACCES",
			)
			// A family with bits above the int the kernel reads is AF_UNIX to the kernel:
			// the filter must not take it for another family.
			if !strings.Contains(out, "raw socketpair family with high bits: E") {
				t.Errorf("a datagram pair with AF_UNIX in the low bits of the family was not refused:\n%s", out)
			}
			if t.Failed() {
				t.Logf("stderr:\n%s", errOut)
			}
		})
	}
}

func TestSocketpairNodeChildProcess(t *testing.T) {
	node, err := exec.LookPath("node")
	testenv.Need(t, "node", err)
	// A sealed root holds only /usr.
	if dir := filepath.Dir(node); dir != "/usr/bin" && dir != "/usr/local/bin" {
		testenv.Need(t, "node under /usr/bin or /usr/local/bin", fmt.Errorf("node is at %s", node))
	}
	script := node + ` -e 'require("child_process").execSync("/bin/true"); console.log("child_process: works")'`
	for _, c := range socketpairClasses {
		t.Run(c.name, func(t *testing.T) {
			_, out, errOut, _ := c.run(t, "capabilities: {containment: "+c.name+", shell: {allow: ["+node+", /bin/true]}}", script)
			testkit.ExpectOutput(t, out, "child_process: works")
			if t.Failed() {
				t.Logf("stderr:\n%s", errOut)
			}
		})
	}
}
