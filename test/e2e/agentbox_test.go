package e2e

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
)

// A session looks like the Linux box an agent expects, with a default capsule's resources:
// its user has an entry with a real login shell (Codex runs the model's commands with the
// passwd shell), a sealed root says what it is in /etc/os-release, a preset's toolchain is on
// PATH, and a parallel build as wide as a 128-core host's fits.

// hostOSID is the host's os-release ID, which a sealed root's ID_LIKE names.
func hostOSID(t *testing.T) string {
	t.Helper()
	for _, path := range []string{"/etc/os-release", "/usr/lib/os-release"} {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "ID="); ok {
				return strings.Trim(v, `"'`)
			}
		}
	}
	t.Fatal("the host has no os-release ID")
	return ""
}

func TestAgentBox(t *testing.T) {
	d := newDaemon(t)
	for _, class := range []string{"sealed", "scoped"} {
		t.Run(class, func(t *testing.T) {
			t.Run("passwd-shell", func(t *testing.T) {
				// The shell is found as Codex finds it: the passwd entry of the uid it runs as.
				dir := workloadCapsule(t, "box-shell", class, "  shell: {allow: [\"@shell\", getent]}\n", "", `entry=$(getent passwd "$(id -u)")
echo "passwd entry found"
sh=$(echo "$entry" | cut -d: -f7)
echo "passwd shell: $sh"
echo "SHELL: $SHELL"
"$sh" -c '[[ 1 == 1 ]] && echo "bash-only: ok"'
`)
				_, stdout := runWorkload(t, d, dir, class)
				for _, want := range []string{"passwd entry found", "passwd shell: /bin/bash", "SHELL: /bin/bash", "bash-only: ok"} {
					if !hasLine(stdout, want) {
						t.Errorf("stdout lacks %q:\n%s", want, stdout)
					}
				}
			})
			t.Run("declared-shell", func(t *testing.T) {
				// A declared SHELL the session can run is its passwd shell too.
				dir := workloadCapsule(t, "box-dash", class, "  shell: {allow: [\"@shell\", getent]}\n", "env:\n  SHELL: /bin/dash\n", `echo "passwd shell: $(getent passwd "$(id -u)" | cut -d: -f7)"
echo "SHELL: $SHELL"
`)
				_, stdout := runWorkload(t, d, dir, class)
				for _, want := range []string{"passwd shell: /bin/dash", "SHELL: /bin/dash"} {
					if !hasLine(stdout, want) {
						t.Errorf("stdout lacks %q:\n%s", want, stdout)
					}
				}
			})
			t.Run("go-on-path", func(t *testing.T) {
				dir := workloadCapsule(t, "box-go", class, "  shell: {allow: [\"@go\"]}\n", "", "go version\n")
				_, stdout := runWorkload(t, d, dir, class)
				if !strings.HasPrefix(stdout, "go version go") {
					t.Errorf("go version under @go printed %q", stdout)
				}
			})
			t.Run("make-j128", func(t *testing.T) {
				dir := workloadCapsule(t, "box-make", class,
					"  filesystem: {workdir_exec: true}\n  shell: {allow: [\"@shell\", \"@make\", \"@gcc\", mkfifo]}\n", "",
					manyC+gatedMake)
				_, stdout := runWorkload(t, d, dir, class)
				for _, want := range []string{"compilers at once: 128", fmt.Sprintf("many: 150 objects linked, total %d", manyTotal())} {
					if !hasLine(stdout, want) {
						t.Errorf("stdout lacks %q:\n%s", want, stdout)
					}
				}
			})
			if class != "sealed" {
				return
			}
			t.Run("os-release", func(t *testing.T) {
				dir := workloadCapsule(t, "box-os", class, "  shell: {allow: [cat]}\n", "", "cat /etc/os-release\n")
				_, stdout := runWorkload(t, d, dir, class)
				for _, want := range []string{"ID=roost", "ID_LIKE=" + hostOSID(t)} {
					if !hasLine(stdout, want) {
						t.Errorf("/etc/os-release lacks %q:\n%s", want, stdout)
					}
				}
			})
		})
	}
}

// gatedMake builds manyC's project as make -j$(nproc) does on a 128-core host, however few
// cores this one has: every source includes a FIFO, so each compile (gcc, cc1 and as joined
// by -pipe) waits there until 128 cc1 run at once, some 400 of the session's processes with
// make and its shell. Then the FIFO gives way to an empty file and every compile goes on. A
// fork the session's limits refuse ends make with its error, which opens the gate too.
const gatedMake = `for f in f*.c; do { echo '#include "gate.h"'; cat "$f"; } > "$f.new" && mv "$f.new" "$f"; done
mkfifo gate.h
# A writer held open keeps every cc1 that opened the FIFO blocked in its read, not its open.
exec 3<>gate.h
make -s -j128 CC='gcc -pipe' >make.log 2>&1 3>&- &
mk=$!
n=0 tries=0
while [ "$n" -lt 128 ] && [ ! -s make.log ] && [ "$tries" -lt 600 ]; do
	sleep 0.1
	n=$(cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^cc1$' || true)
	tries=$((tries + 1))
done
echo "compilers at once: $n"
: > gate.tmp && mv gate.tmp gate.h
exec 3>&-
wait "$mk" || { cat make.log; exit 1; }
./prog
`
