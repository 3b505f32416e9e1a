package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Coding agents' work, through roostd as an operator runs it: real toolchains (git, Python,
// Go, Node, C, the POSIX shell, make) doing what an agent does with them, in a sealed and in
// a scoped session, each capsule with at most six lines of grants. filesystem.workdir_exec
// lets a session run what it builds; the hostile half below shows that such a program is
// still held by its class.

// workload is one toolchain's capsule and what its output must prove.
type workload struct {
	name string
	// caps are the grant lines under capabilities: besides containment (two-space indent).
	caps string
	// top is further top-level manifest keys (a Go capsule's env).
	top string
	// script is run.sh's body; it runs under `set -eu` in the session's workdir.
	script string
	// want are lines stdout must hold, exactly.
	want []string
	// check, when set, checks what depends on the session (its id, class, workdir).
	check func(t *testing.T, s session, stdout string)
}

// maxGrantLines is what a coding capsule keeps to under capabilities:, containment included.
const maxGrantLines = 6

// workloadCapsule writes a capsule whose program is bin/run.sh (a relative command[0] with a
// slash is found in the capsule directory in every class: /capsule in a sealed root, the
// stored copy in scoped).
func workloadCapsule(t *testing.T, name, class, caps, top, script string) string {
	t.Helper()
	grants := "  containment: " + class + "\n" + caps
	if n := strings.Count(grants, "\n"); n > maxGrantLines {
		t.Fatalf("%s: %d lines of grants; a coding capsule keeps to %d", name, n, maxGrantLines)
	}
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	manifest := fmt.Sprintf("name: %s\nversion: 0.1.0\nrun:\n  command: [bin/run.sh]\n%scapabilities:\n%s", name, top, grants)
	if err := os.WriteFile(filepath.Join(dir, "capsule.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "run.sh"), []byte("#!/bin/sh\nset -eu\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// ctlWithin is ctl with room for a toolchain's cold start (ctl gives roostctl 60 s).
func (d *daemon) ctlWithin(timeout time.Duration, args ...string) result {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "roostctl"), args...)
	cmd.Env = append(os.Environ(), "ROOST_SOCKET="+d.socket)
	cmd.Dir = repoRoot()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	res := result{stdout: out.String(), stderr: errOut.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	case err != nil:
		d.t.Fatalf("roostctl %v: %v", args, err)
	}
	return res
}

// runWorkload runs a capsule to its end and returns the session and its output. It fails the
// test unless the program exited 0 in the class it asked for.
func runWorkload(t *testing.T, d *daemon, dir, class string) (session, string) {
	t.Helper()
	if out := d.ok("explain", dir); !strings.Contains(out, "achieved     "+class) {
		t.Fatalf("explain: the capsule does not run %s:\n%s", class, out)
	}
	start := time.Now()
	id := strings.TrimSpace(d.ok("run", "--detach", dir))
	waited := d.ctlWithin(5*time.Minute, "wait", id)
	logs := d.ctl("logs", id)
	t.Logf("%s %s: exit %d after %s", filepath.Base(dir), class, waited.code, time.Since(start).Round(time.Millisecond))
	s := d.inspect(id)
	if waited.code != 0 || s.ExitStatus != "ok" {
		t.Fatalf("exit %d (%s, %s)\nstdout:\n%s\nstderr:\n%s", waited.code, s.ExitStatus, s.Detail, logs.stdout, logs.stderr)
	}
	if s.Containment.Declared != class || s.Containment.Achieved != class {
		t.Fatalf("containment %+v, want %s", s.Containment, class)
	}
	return s, logs.stdout
}

func hasLine(stdout, want string) bool {
	for _, line := range strings.Split(stdout, "\n") {
		if line == want {
			return true
		}
	}
	return false
}

// PATH for a Go capsule: the go.dev toolchain at /usr/local/go (inside /usr, so in a sealed
// root too) ahead of the default.
const goPath = "/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// manyC generates 150 C files, a main.c calling each and a Makefile building one object per
// file, in the working directory. bench/workloads.sh generates the same tree.
const manyC = `i=0
while [ $i -lt 150 ]; do
	printf 'int f%d(int x) { int s = 0; for (int k = 0; k < x; k++) s += k * %d; return s %% 1000 + %d; }\n' $i $i $i > f$i.c
	i=$((i + 1))
done
{
	echo '#include <stdio.h>'
	i=0; while [ $i -lt 150 ]; do echo "int f$i(int);"; i=$((i + 1)); done
	echo 'int main(void) { long t = 0;'
	i=0; while [ $i -lt 150 ]; do echo "t += f$i(10);"; i=$((i + 1)); done
	printf '%s\n' 'printf("many: %d objects linked, total %ld\n", 150, t); return 0; }'
} > main.c
printf 'SRCS := $(wildcard f*.c) main.c\nOBJS := $(SRCS:.c=.o)\nprog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n%%.o: %%.c\n\t$(CC) -O2 -c $< -o $@\n' > Makefile
`

// manyTotal is what manyC's program prints: f_i(10) = (45*i) % 1000 + i.
func manyTotal() int {
	total := 0
	for i := range 150 {
		total += (45*i)%1000 + i
	}
	return total
}

var workloads = []workload{
	{
		name: "git",
		caps: "  shell: {allow: [\"@shell\", \"@git\"]}\n",
		script: `git config --global user.email agent@example.com
git config --global user.name agent
git config --global init.defaultBranch main
echo "gitconfig: $(git config --global --get user.name) in $HOME/.gitconfig"
git init -q --bare remote.git
git init -q repo
cd repo
echo one > a.txt && git add a.txt && git commit -qm "first commit"
git checkout -qb feature
echo two > b.txt && git add b.txt && git commit -qm "second commit on feature"
git checkout -q main
git merge -q --ff-only feature
git branch --format='branch: %(refname:short)'
git remote add origin ../remote.git
git push -q origin HEAD
cd ..
git clone -q remote.git clone
cd clone
echo "clone has: $(ls | tr '\n' ' ')"
echo three > c.txt && git add c.txt && git commit -qm "third commit from the clone"
git push -q origin HEAD
git --git-dir=../remote.git log --format='log: %s' main
echo "remote commits: $(git --git-dir=../remote.git rev-list --count main)"
`,
		want: []string{
			"branch: feature", "branch: main",
			"clone has: a.txt b.txt ",
			"log: third commit from the clone", "log: second commit on feature", "log: first commit",
			"remote commits: 3",
		},
		check: func(t *testing.T, s session, stdout string) {
			// Each session has a writable HOME of its own: /root in a sealed root; in scoped
			// a directory roostd made for this session, not its workdir.
			if s.Containment.Achieved == "sealed" {
				if !hasLine(stdout, "gitconfig: agent in /root/.gitconfig") {
					t.Errorf("git's global config is not in /root")
				}
				return
			}
			for _, line := range strings.Split(stdout, "\n") {
				if home, ok := strings.CutPrefix(line, "gitconfig: agent in "); ok {
					home = strings.TrimSuffix(home, "/.gitconfig")
					if !strings.Contains(home, s.ID) || strings.HasPrefix(home, s.Workdir) {
						t.Errorf("scoped HOME %s is not a directory of the session's own beside its workdir %s", home, s.Workdir)
					}
					return
				}
			}
			t.Errorf("no gitconfig line")
		},
	},
	{
		name: "python",
		caps: "  filesystem: {workdir_exec: true}\n  shell: {allow: [\"@shell\", \"@python\"]}\n",
		script: `python3 -m venv .venv
.venv/bin/python -c 'import sys; print("venv:", sys.prefix != sys.base_prefix)'
# A wheel with a console script, made by hand (a zip with its dist-info): building one
# offline needs the wheel package, which a fresh venv lacks.
.venv/bin/python - <<'PY'
import base64, hashlib, zipfile
files = {
    "greet/__init__.py": 'def main():\n    print("greet: hello from a console script")\n',
    "greet-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: greet\nVersion: 0.1\n",
    "greet-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    "greet-0.1.dist-info/entry_points.txt": "[console_scripts]\ngreet = greet:main\n",
}
record = []
with zipfile.ZipFile("greet-0.1-py3-none-any.whl", "w") as z:
    for name, text in files.items():
        data = text.encode()
        z.writestr(name, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("greet-0.1.dist-info/RECORD,,")
    z.writestr("greet-0.1.dist-info/RECORD", "\n".join(record) + "\n")
PY
.venv/bin/pip install -q --no-index --disable-pip-version-check ./greet-0.1-py3-none-any.whl
.venv/bin/pip show --disable-pip-version-check greet | sed -n 's/^Version: /pip show greet: /p'
.venv/bin/greet
cat > aio.py <<'PY'
import asyncio

async def main():
    proc = await asyncio.create_subprocess_exec("echo", "from a subprocess", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    results = await asyncio.gather(*(asyncio.sleep(0.01, result=n) for n in range(3)))
    print("asyncio:", out.decode().strip(), "exit", proc.returncode, "gathered", results)

asyncio.run(main())
PY
.venv/bin/python aio.py
cat > pool.py <<'PY'
import multiprocessing, os, time

def start(barrier):
    # Every worker is up before any task runs, so the tasks spread over them however
    # loaded the host is (a first worker alone could otherwise take all of them).
    barrier.wait(60)

def square(n):
    # Long enough that one worker cannot take every task before the others, woken by the
    # same barrier, are scheduled on a loaded host.
    time.sleep(0.01)
    return n * n, os.getpid()

if __name__ == "__main__":
    barrier = multiprocessing.Barrier(4)
    with multiprocessing.Pool(4, initializer=start, initargs=(barrier,)) as pool:
        results = pool.map(square, range(100), chunksize=1)
    print("pool: sum", sum(r for r, _ in results), "workers", len({p for _, p in results}) > 1)
PY
.venv/bin/python pool.py
cat > test_calc.py <<'PY'
import unittest

class Calc(unittest.TestCase):
    def test_add(self):
        self.assertEqual(2 + 2, 4)

    def test_upper(self):
        self.assertEqual("roost".upper(), "ROOST")
PY
.venv/bin/python -m unittest -v test_calc >unittest.log 2>&1 || { cat unittest.log; exit 1; }
sed 's/^/unittest: /' unittest.log
`,
		want: []string{
			"venv: True",
			"pip show greet: 0.1",
			"greet: hello from a console script",
			"asyncio: from a subprocess exit 0 gathered [0, 1, 2]",
			"pool: sum 328350 workers True",
			"unittest: test_add (test_calc.Calc.test_add) ... ok",
			"unittest: test_upper (test_calc.Calc.test_upper) ... ok",
			"unittest: OK",
		},
	},
	{
		name: "go",
		caps: "  filesystem: {workdir_exec: true}\n  shell: {allow: [\"@shell\", \"@go\"]}\n",
		top:  "env:\n  PATH: " + goPath + "\n  GOTOOLCHAIN: local\n",
		script: `mkdir hello && cd hello
cat > go.mod <<'EOF'
module example.com/hello

go 1.26
EOF
cat > main.go <<'EOF'
package main

import "fmt"

// Greeting greets name.
func Greeting(name string) string { return "hello, " + name }

func main() { fmt.Println("go run:", Greeting("roost")) }
EOF
cat > main_test.go <<'EOF'
package main

import "testing"

func TestGreeting(t *testing.T) {
	if got := Greeting("x"); got != "hello, x" {
		t.Fatalf("Greeting: %q", got)
	}
}
EOF
go build -o hello .
./hello | sed 's/^go run:/go build:/'
go vet ./... && echo "go vet: clean"
go test -count=1 ./... | sed 's/\t[0-9.]*s$//'
go run .
cache=$(go env GOCACHE)
case $cache in
"$HOME"/*) echo "gocache: under HOME" ;;
*) echo "gocache: $cache is not under HOME ($HOME)" ;;
esac
[ -d "$cache" ] && [ -n "$(ls "$cache")" ] && echo "gocache: populated"
echo "gopath: $(go env GOPATH | sed "s#^$HOME/#HOME/#")"
`,
		want: []string{
			"go build: hello, roost",
			"go vet: clean",
			"ok  \texample.com/hello",
			"go run: hello, roost",
			"gocache: under HOME",
			"gocache: populated",
			"gopath: HOME/go",
		},
	},
	{
		name: "node",
		caps: "  filesystem: {workdir_exec: true}\n  shell: {allow: [\"@shell\", \"@node\"]}\n",
		script: `mkdir app && cd app
npm init -y >/dev/null
echo "npm init: $(node -p 'require("./package.json").name')"
mkdir -p tool/bin
cat > tool/package.json <<'EOF'
{"name": "shout", "version": "1.0.0", "bin": {"shout": "bin/shout.js"}}
EOF
cat > tool/bin/shout.js <<'EOF'
#!/usr/bin/env node
console.log("shout: " + process.argv.slice(2).join(" ").toUpperCase());
EOF
chmod 755 tool/bin/shout.js
npm install --offline --no-audit --no-fund ./tool >npm.log 2>&1 || { cat npm.log; exit 1; }
echo "npm install: $(node -p 'require("./package.json").dependencies.shout')"
node_modules/.bin/shout local package
cat > main.js <<'EOF'
const { execSync } = require("child_process");
console.log("execSync: " + execSync("echo hi").toString().trim());
(async () => {
  const res = await fetch(process.env.ROOST_ENDPOINT + "/v1/self", {
    headers: { Authorization: "Bearer " + process.env.ROOST_CREDENTIAL },
  });
  const self = await res.json();
  console.log(["fetch:", res.status, res.headers.get("content-type"), self.session_id, self.containment].join(" "));
})().catch((e) => {
  console.error("fetch failed:", e);
  process.exit(1);
});
EOF
node main.js
`,
		want: []string{
			"npm init: app",
			"npm install: file:tool",
			"shout: LOCAL PACKAGE",
			"execSync: hi",
		},
		check: func(t *testing.T, s session, stdout string) {
			if want := fmt.Sprintf("fetch: 200 application/json %s %s", s.ID, s.Containment.Achieved); !hasLine(stdout, want) {
				t.Errorf("stdout lacks %q:\n%s", want, stdout)
			}
		},
	},
	{
		name: "c",
		caps: "  filesystem: {workdir_exec: true}\n  shell: {allow: [\"@shell\", \"@gcc\"]}\n",
		script: `cat > greet.h <<'EOF'
int add(int a, int b);
const char *who(void);
EOF
cat > greet.c <<'EOF'
#include "greet.h"
int add(int a, int b) { return a + b; }
const char *who(void) { return "a two-file program"; }
EOF
cat > main.c <<'EOF'
#include <stdio.h>
#include "greet.h"
int main(void) { printf("c: %s says 2+3=%d\n", who(), add(2, 3)); return 0; }
EOF
gcc -O2 -Wall -Werror -c greet.c
gcc -O2 -Wall -Werror -c main.c
gcc -o prog main.o greet.o
./prog
`,
		want: []string{"c: a two-file program says 2+3=5"},
	},
	{
		name: "shell",
		caps: "  shell: {allow: [\"@shell\", \"@make\"]}\n",
		script: `mkdir -p tree/a/b tree/c
echo "foo bar" > tree/a/one.txt
echo "nothing here" > tree/a/b/two.txt
echo "foo again" > tree/c/three.txt
echo "foo, but not a .txt" > tree/c/four.md
find . -name '*.txt' | xargs grep -l foo | sort | sed 's/^/match: /'
sed -i 's/foo/baz/g' tree/a/one.txt
echo "sed -i: $(cat tree/a/one.txt)"
printf 'alice 3\nbob 4\ncarol 5\n' > scores
awk '{ s += $2; n++ } END { print "awk:", n, "rows, total", s }' scores
tar czf tree.tgz tree
tar tzf tree.tgz | grep '\.txt$' | sort | sed 's/^/tar: /'
printf 'all: hello.out world.out\n\t@cat hello.out world.out\nhello.out:\n\t@echo "make: hello" > $@\nworld.out: hello.out\n\t@echo "make: world after $<" > $@\n' > Makefile
make
`,
		want: []string{
			"match: ./tree/a/one.txt", "match: ./tree/c/three.txt",
			"sed -i: baz bar",
			"awk: 3 rows, total 12",
			"tar: tree/a/b/two.txt", "tar: tree/a/one.txt", "tar: tree/c/three.txt",
			"make: hello", "make: world after hello.out",
		},
	},
	{
		name:   "make-j8",
		caps:   "  filesystem: {workdir_exec: true}\n  shell: {allow: [\"@shell\", \"@make\", \"@gcc\"]}\n",
		script: "mkdir many && cd many\n" + manyC + "make -j8 -s\necho \"objects: $(ls *.o | wc -l)\"\n./prog\n",
		want: []string{
			"objects: 151",
			fmt.Sprintf("many: 150 objects linked, total %d", manyTotal()),
		},
	},
}

// TestWorkloads runs each toolchain's work in a sealed and in a scoped session.
func TestWorkloads(t *testing.T) {
	d := newDaemon(t)
	for _, w := range workloads {
		t.Run(w.name, func(t *testing.T) {
			for _, class := range []string{"sealed", "scoped"} {
				t.Run(class, func(t *testing.T) {
					dir := workloadCapsule(t, "agent-"+w.name, class, w.caps, w.top, w.script)
					s, stdout := runWorkload(t, d, dir, class)
					for _, want := range w.want {
						if !hasLine(stdout, want) {
							t.Errorf("stdout lacks the line %q", want)
						}
					}
					if w.check != nil {
						w.check(t, s, stdout)
					}
					if t.Failed() {
						t.Logf("stdout:\n%s", stdout)
					}
				})
			}
		})
	}
}

// escapeC is a program a session builds and runs (workdir_exec) to leave its class: read a
// host file, drive roostd's control socket, move itself out of its cgroup. Each attempt
// prints "held WHAT PATH: ERROR" or "ESCAPED WHAT PATH".
const escapeC = `#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int escaped;

static void verdict(const char *what, const char *path, int rc) {
	if (rc >= 0) {
		printf("ESCAPED %s %s\n", what, path);
		escaped = 1;
	} else {
		printf("held %s %s: %s\n", what, path, strerror(errno));
	}
}

static int slurp(const char *path, char *buf, size_t n) {
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return -1;
	ssize_t r = read(fd, buf, n - 1);
	close(fd);
	buf[r > 0 ? r : 0] = 0;
	return r < 0 ? -1 : 0;
}

/* argv[1]: a host file; argv[2]: roostd's socket; argv[3...]: cgroup.procs files. */
int main(int argc, char **argv) {
	char buf[4096], before[4096], after[4096];
	verdict("read", argv[1], slurp(argv[1], buf, sizeof buf));

	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	if (s < 0) {
		verdict("socket", "AF_UNIX", -1);
	} else {
		struct sockaddr_un addr = {.sun_family = AF_UNIX};
		strncpy(addr.sun_path, argv[2], sizeof addr.sun_path - 1);
		verdict("connect", argv[2], connect(s, (struct sockaddr *)&addr, sizeof addr));
	}

	slurp("/proc/self/cgroup", before, sizeof before);
	for (int i = 3; i < argc; i++) {
		int fd = open(argv[i], O_WRONLY);
		if (fd < 0) {
			verdict("cgroup", argv[i], -1);
			continue;
		}
		int n = snprintf(buf, sizeof buf, "%d\n", getpid());
		verdict("cgroup", argv[i], write(fd, buf, n) == n ? 0 : -1);
		close(fd);
	}
	slurp("/proc/self/cgroup", after, sizeof after);
	printf("cgroup unchanged: %s\n", strcmp(before, after) == 0 ? "yes" : "NO");
	return escaped;
}
`

// TestWorkloadsHostile: a binary the session built in its workdir runs (workdir_exec), and is
// still held by its class, sealed or scoped: it cannot read a world-readable host file the
// class does not grant, connect to roostd's control socket (even with unix_sockets), or
// write its pid into a cgroup outside its own.
func TestWorkloadsHostile(t *testing.T) {
	d := newDaemon(t)
	srv := fmt.Sprintf("/srv/roost-e2e-workloads-%d", os.Getpid())
	if err := os.MkdirAll(srv, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(srv) })
	secret := filepath.Join(srv, "public.txt")
	if err := os.WriteFile(secret, []byte("SECRET srv\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The root cgroup's procs file and every v1 hierarchy's this host has.
	procs := []string{"/sys/fs/cgroup/cgroup.procs"}
	more, _ := filepath.Glob("/sys/fs/cgroup/*/cgroup.procs")
	procs = append(procs, more...)

	script := "cat > escape.c <<'EOF'\n" + escapeC + "EOF\n" +
		"gcc -O2 -Wall -Werror -o escape escape.c\n" +
		"echo \"built: $(pwd)/escape\"\n" +
		fmt.Sprintf("./escape %s %s %s\n", secret, d.socket, strings.Join(procs, " ")) +
		"[ -e /sys/fs/cgroup ] && echo '/sys/fs/cgroup: present' || echo '/sys/fs/cgroup: absent'\n"
	caps := "  filesystem: {workdir_exec: true}\n  network: {unix_sockets: true}\n  shell: {allow: [\"@shell\", \"@gcc\"]}\n"
	for _, class := range []string{"sealed", "scoped"} {
		t.Run(class, func(t *testing.T) {
			_, stdout := runWorkload(t, d, workloadCapsule(t, "escaper", class, caps, "", script), class)
			if strings.Contains(stdout, "ESCAPED") || !strings.Contains(stdout, "built: ") {
				t.Fatalf("a %s session's own binary left its class:\n%s", class, stdout)
			}
			// Sealed: none of it is in the root. Scoped: Landlock (the file, /sys) and the
			// socket's owner (root, 0660) refuse it.
			refused := []string{"No such file or directory"}
			if class == "scoped" {
				refused = append(refused, "Permission denied")
			}
			attempts := [][2]string{{"read", secret}, {"connect", d.socket}}
			for _, p := range procs {
				attempts = append(attempts, [2]string{"cgroup", p})
			}
			for _, a := range attempts {
				ok := false
				for _, errno := range refused {
					ok = ok || hasLine(stdout, fmt.Sprintf("held %s %s: %s", a[0], a[1], errno))
				}
				if !ok {
					t.Errorf("no refusal (%s) of %s %s", strings.Join(refused, " or "), a[0], a[1])
				}
			}
			if !hasLine(stdout, "cgroup unchanged: yes") {
				t.Error("the program's cgroup changed")
			}
			if class == "sealed" && !hasLine(stdout, "/sys/fs/cgroup: absent") {
				t.Error("a sealed root shows /sys/fs/cgroup")
			}
			if t.Failed() {
				t.Logf("stdout:\n%s", stdout)
			}
		})
	}
}
