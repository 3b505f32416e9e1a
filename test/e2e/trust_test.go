package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The trust boundary, tried from inside sessions through roostd as an attacker would: read
// the daemon's secrets, drive its control socket, run as host root.

// trustDaemon is a roostd with an upstream whose key lives in /etc (where a scoped session's
// Landlock rules let it read the tree) and a capsule the operator lets run as root.
func trustDaemon(t *testing.T) (*daemon, string) {
	t.Helper()
	key := fmt.Sprintf("/etc/roost-e2e-%d.key", os.Getpid())
	if err := os.WriteFile(key, []byte("sk-operator-SECRET\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(key) })
	cfg := filepath.Join(t.TempDir(), "roostd.yaml")
	os.WriteFile(cfg, fmt.Appendf(nil, `inference:
  upstreams:
    - name: llm
      format: openai
      url: http://127.0.0.1:1
      api_key_file: %s
sessions:
  allow_root: [rooted]
`, key), 0o600)
	return newDaemon(t, "--config", cfg), key
}

// secrets are what no session may read: the credential key, the registry and the ledger,
// an upstream's key file, another session's output, /etc/shadow and a world-readable file
// under /srv.
func secrets(t *testing.T, d *daemon, key string) []string {
	t.Helper()
	other := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "talker", "echo SECRET-OUTPUT", "")))
	d.ok("wait", other)
	srv := fmt.Sprintf("/srv/roost-e2e-%d", os.Getpid())
	os.MkdirAll(srv, 0o755)
	os.WriteFile(filepath.Join(srv, "public.txt"), []byte("SECRET srv\n"), 0o644)
	t.Cleanup(func() { os.RemoveAll(srv) })
	return []string{
		filepath.Join(d.stateDir, "credential.key"),
		filepath.Join(d.stateDir, "roost.db"),
		filepath.Join(d.stateDir, "ledger.db"),
		filepath.Join(d.stateDir, "artifacts", "refs.db"),
		key,
		filepath.Join(d.inspect(other).RecordsDir, "stdout.log"),
		d.inspect(other).RecordsDir,
		"/etc/shadow",
		filepath.Join(srv, "public.txt"),
	}
}

// probe is a script that tries to read each of paths (ls of a directory, cat of anything
// else) and prints "READ <path>" or "refused <path>: <what ls or cat said>".
func probe(paths []string) string {
	var b strings.Builder
	for _, p := range paths {
		fmt.Fprintf(&b, "if [ -d %[1]q ]; then e=$(ls %[1]q 2>&1 >/dev/null); else e=$(cat %[1]q 2>&1 >/dev/null); fi && echo \"READ %[1]s\" || echo \"refused %[1]s: $e\"\n", p)
	}
	return b.String()
}

// probeVerdicts reads probe's output: for each path, "" when it was read, else what the
// refusal said.
func probeVerdicts(t *testing.T, out string, paths []string) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if p, ok := strings.CutPrefix(line, "READ "); ok {
			got[p] = ""
		}
		for _, p := range paths {
			if why, ok := strings.CutPrefix(line, "refused "+p+": "); ok {
				got[p] = why
			}
		}
	}
	for _, p := range paths {
		if _, ok := got[p]; !ok {
			t.Errorf("no verdict for %s:\n%s", p, out)
		}
	}
	return got
}

// readable are what every session may read, a directory and a file: the probe read them,
// so cat and ls ran and a refusal of the rest is the boundary's, not a missing tool's.
var readable = []string{"/usr/bin", "/usr/bin/cat"}

// refusedBy reports whether why is cat or ls failing to open path with errno: not the
// shell failing to run them (which says "cat: Permission denied" of an exec refused).
func refusedBy(why, path, errno string) bool {
	return why == "cat: "+path+": "+errno || why == "ls: cannot open directory '"+path+"': "+errno
}

const (
	eacces = "Permission denied"
	enoent = "No such file or directory"
)

func TestTrustSecretsUnreadable(t *testing.T) {
	d, key := trustDaemon(t)
	paths := secrets(t, d, key)
	// The positive control: the same probe, as root on the host, reads every one of them;
	// were it not to, a refusal in a session would say nothing of the session.
	host, err := exec.Command("/bin/sh", "-c", probe(append(slices.Clone(readable), paths...))).CombinedOutput()
	if err != nil {
		t.Fatalf("the probe on the host: %v\n%s", err, host)
	}
	for p, why := range probeVerdicts(t, string(host), append(slices.Clone(readable), paths...)) {
		if why != "" {
			t.Fatalf("the probe on the host, as root, could not read %s: %s", p, why)
		}
	}
	// An advisory session has no Landlock: what DAC lets any uid read (the /srv file) it
	// reads; the daemon's own files it does not, for their modes.
	daemonOnly, srv := paths[:len(paths)-1], paths[len(paths)-1]
	for _, c := range []struct {
		name, caps string
		read       []string
		refused    []string
		// errno is what the kernel says of each path refused: Landlock and DAC say
		// EACCES; a sealed root holds none of them (ENOENT).
		errno string
	}{
		{"scoped", "capabilities:\n  containment: scoped\n  shell:\n    allow: [cat, ls]\n", readable, paths, eacces},
		{"scoped-unix", "capabilities:\n  containment: scoped\n  network:\n    unix_sockets: true\n  shell:\n    allow: [cat, ls]\n", readable, paths, eacces},
		{"sealed", "capabilities:\n  containment: sealed\n  shell:\n    allow: [cat, ls]\n", readable, paths, enoent},
		{"advisory", "capabilities:\n  containment: advisory\n", append(slices.Clone(readable), srv), daemonOnly, eacces},
	} {
		t.Run(c.name, func(t *testing.T) {
			all := append(slices.Clone(c.read), c.refused...)
			res := d.ctl("run", capsule(t, "prober", probe(all), c.caps))
			if res.code != 0 {
				t.Fatalf("run: %+v", res)
			}
			got := probeVerdicts(t, res.stdout, all)
			for _, p := range c.read {
				if why := got[p]; why != "" {
					t.Errorf("a %s session could not read %s, which it may: %s", c.name, p, why)
				}
			}
			for _, p := range c.refused {
				switch why, ok := got[p]; {
				case !ok:
				case why == "":
					t.Errorf("a %s session read %s", c.name, p)
				case !refusedBy(why, p, c.errno):
					t.Errorf("a %s session was refused %s, but not by cat or ls opening it with %q: %s", c.name, p, c.errno, why)
				}
			}
		})
	}
}

// The control socket serves no session: a scoped program allowed unix sockets cannot even
// connect (it is root's, 0660), and a program the operator lets run as root is refused by
// the peer check.
func TestTrustControlSocketRefusesSessions(t *testing.T) {
	d, _ := trustDaemon(t)
	res := d.ctl("run", capsule(t, "dialer", fmt.Sprintf(`python3 -c '
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(%q)
    print("CONNECTED")
except OSError as e:
    print("refused:", e.strerror)
'`, d.socket), "capabilities:\n  containment: scoped\n  network:\n    unix_sockets: true\n  shell:\n    allow: [python3]\n"))
	if res.code != 0 || strings.Contains(res.stdout, "CONNECTED") || !strings.Contains(res.stdout, "refused: Permission denied") {
		t.Fatalf("scoped session and the control socket: %+v", res)
	}
	// As host root (sessions.allow_root), through roostctl itself.
	rooted := filepath.Join(t.TempDir(), "rooted")
	os.Mkdir(rooted, 0o755)
	os.WriteFile(filepath.Join(rooted, "capsule.yaml"), fmt.Appendf(nil, `name: rooted
version: 0.1.0
run:
  command: [/bin/sh, -c, 'id -u; %s --socket %s run --containment unconfined %s; echo "rc=$?"']
capabilities:
  containment: unconfined
`, filepath.Join(binDir, "roostctl"), d.socket, filepath.Join(repoRoot(), "examples", "hello")), 0o644)
	res = d.ctl("run", rooted)
	if !strings.HasPrefix(res.stdout, "0\n") {
		t.Fatalf("the allow_root session did not run as root: %+v", res)
	}
	if strings.Contains(res.stdout, "hello from") || !strings.Contains(res.stdout+res.stderr, "serves no session's processes") || !strings.Contains(res.stdout, "rc=") || strings.Contains(res.stdout, "rc=0") {
		t.Fatalf("a root session drove the control socket: %+v", res)
	}
	if !strings.Contains(d.log.String(), "serves no session") && !strings.Contains(d.log.String(), "refus") {
		t.Errorf("roostd logged no refusal:\n%s", d.log)
	}
}

// hostUID is a live program's uid on the host, from the host's /proc.
func hostUID(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			return strings.Fields(rest)[0]
		}
	}
	t.Fatalf("no Uid line for pid %d", pid)
	return ""
}

type identity struct {
	Pid      int `json:"pid"`
	Identity struct {
		UID      uint32 `json:"uid"`
		Size     uint32 `json:"size"`
		HostRoot bool   `json:"host_root"`
	} `json:"identity"`
}

func (d *daemon) identity(id string) identity {
	d.t.Helper()
	var s identity
	if err := json.Unmarshal([]byte(d.ok("inspect", "--json", id)), &s); err != nil {
		d.t.Fatal(err)
	}
	return s
}

// Two live sessions of each class run as host uids that are neither root nor each other's,
// the ones inspect names; a restart keeps them (the registry holds the ranges), and a new
// session never gets a range a live one holds.
func TestTrustSessionsNeverHostRoot(t *testing.T) {
	d := newDaemon(t)
	seen := map[string]string{}
	var ids []string
	for _, class := range []string{"sealed", "sealed", "scoped", "scoped", "advisory", "unconfined"} {
		id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "sleeper", "touch /tmp/x 2>/dev/null; exec sleep 60",
			"capabilities:\n  containment: "+class+"\n  shell:\n    allow: [sleep, touch]\n")))
		ids = append(ids, id)
	}
	check := func() {
		t.Helper()
		for _, id := range ids {
			var s identity
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if s = d.identity(id); s.Pid != 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("session %s has no program pid after 30 s:\n%s\nroostd:\n%s", id, d.ok("inspect", id), d.log)
				}
			}
			uid := hostUID(t, s.Pid)
			if uid == "0" || uid != strconv.Itoa(int(s.Identity.UID)) || s.Identity.Size != 65536 {
				t.Fatalf("session %s runs as host uid %s; inspect says %+v", id, uid, s.Identity)
			}
			if prev, ok := seen[uid]; ok && prev != id {
				t.Fatalf("sessions %s and %s share host uid %s", prev, id, uid)
			}
			seen[uid] = id
		}
	}
	check()
	d.kill9()
	d.start()
	check()
	// A new session after the restart gets a range of its own.
	id := strings.TrimSpace(d.ok("run", "--detach", capsule(t, "late", "exec sleep 60", "capabilities:\n  containment: sealed\n  shell:\n    allow: [sleep]\n")))
	ids = append(ids, id)
	check()
	if len(seen) != len(ids) {
		t.Fatalf("%d sessions, %d distinct uids", len(ids), len(seen))
	}
	for _, id := range ids {
		d.ok("stop", "--grace", "1s", id)
	}
}

// A file's contents cannot widen the exec allowlist: a script whose #! names "/" would make
// every file executable; the launch is refused instead, naming the script and its
// interpreter, and nothing runs.
func TestTrustShebangDirectoryRefused(t *testing.T) {
	d := newDaemon(t)
	// Sealed: the script is only in shell.allow; /usr/bin/id is not, and must not run.
	sealed := capsule(t, "shebang", `/usr/bin/id && echo RAN`, "capabilities:\n  containment: sealed\n  shell:\n    allow: [/capsule/helper.sh]\n")
	// Scoped: the script is the program itself.
	scoped := filepath.Join(t.TempDir(), "shebang")
	os.MkdirAll(filepath.Join(scoped, "bin"), 0o755)
	os.WriteFile(filepath.Join(scoped, "capsule.yaml"), []byte("name: shebang\nversion: 0.1.0\nrun:\n  command: [bin/helper.sh]\ncapabilities:\n  containment: scoped\n"), 0o644)
	for _, c := range []struct{ class, dir, script string }{
		{"sealed", sealed, filepath.Join(sealed, "helper.sh")},
		{"scoped", scoped, filepath.Join(scoped, "bin", "helper.sh")},
	} {
		os.WriteFile(c.script, []byte("#!/\necho never\n"), 0o755)
		res := d.ctl("run", c.dir)
		if res.code != 125 || strings.Contains(res.stdout, "RAN") || strings.Contains(res.stdout, "never") {
			t.Fatalf("%s: a #!/ script did not stop the launch: %+v", c.class, res)
		}
		if !strings.Contains(res.stderr, "helper.sh") || !strings.Contains(res.stderr, `interpreter "/"`) {
			t.Fatalf("%s: the refusal does not name the script and its interpreter: %q", c.class, res.stderr)
		}
	}
}
