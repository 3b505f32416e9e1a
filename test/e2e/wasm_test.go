package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// WASM capsules: guests are Go programs built for wasip1 at test time (and one module
// written byte by byte, to trap), run as sessions by roost's runner under the capsule's class.

// guests are the Go guests' sources, by name.
var guests = map[string]string{
	"hello": `package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Println("hello from wasm", os.Args[1:], os.Getenv("GREETING"))
}
`,
	"exit3": `package main

import "os"

func main() { os.Exit(3) }
`,
	"files": `package main

import (
	"fmt"
	"os"
)

func try(what string, err error) {
	if err != nil {
		fmt.Println(what+": refused:", err)
		return
	}
	fmt.Println(what + ": ALLOWED")
}

func main() {
	try("write /work/out.txt", os.WriteFile("/work/out.txt", []byte("written by wasm\n"), 0o644))
	_, err := os.ReadFile("/capsule/capsule.yaml")
	try("read /capsule/capsule.yaml", err)
	_, err = os.ReadFile("/etc/passwd")
	try("read /etc/passwd", err)
	_, err = os.ReadFile("/work/../../etc/passwd")
	try("read /work/../../etc/passwd", err)
	try("write /capsule/x", os.WriteFile("/capsule/x", []byte("x"), 0o644))
	_, err = os.ReadDir("/")
	try("list /", err)
}
`,
	"loop": `package main

func main() {
	n := 0
	for {
		n++
	}
}
`,
	"hog": `package main

import "fmt"

var kept [][]byte

func main() {
	for i := 1; ; i++ {
		b := make([]byte, 1<<20)
		for j := range b {
			b[j] = byte(j)
		}
		kept = append(kept, b)
		if i%16 == 0 {
			fmt.Println("held MiB:", i)
		}
	}
}
`,
	"wait": `package main

import (
	"os"
	"time"
)

func main() {
	for {
		if _, err := os.Stat("/work/go"); err == nil {
			os.Exit(7)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
`,
}

// trapModule is a WASM module whose _start executes `unreachable`: a trap, by hand.
var trapModule = []byte{
	0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
	0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type: () -> ()
	0x03, 0x02, 0x01, 0x00, // function 0 has type 0
	0x07, 0x0a, 0x01, 0x06, '_', 's', 't', 'a', 'r', 't', 0x00, 0x00, // export _start
	0x0a, 0x05, 0x01, 0x03, 0x00, 0x00, 0x0b, // code: unreachable, end
}

// buildGuest builds a guest into a new capsule directory as module.wasm.
func buildGuest(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "main.go")
	if err := os.WriteFile(src, []byte(guests[name]), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "module.wasm"), src)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "GOFLAGS=", "CGO_ENABLED=0")
	cmd.Dir = filepath.Dir(src)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the %s guest: %v\n%s", name, err, out)
	}
	return dir
}

// wasmCapsule writes the capsule.yaml of a WASM capsule in dir.
func wasmCapsule(t *testing.T, dir, name, class, extra string) string {
	t.Helper()
	src := fmt.Sprintf("name: %s\nversion: 0.1.0\nrun:\n  wasm: module.wasm\n  args: [one, two]\nenv:\n  GREETING: hi\ncapabilities:\n  containment: %s\n%s", name, class, extra)
	if err := os.WriteFile(filepath.Join(dir, "capsule.yaml"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestWasmSessions(t *testing.T) {
	d := newDaemon(t)
	for _, class := range []string{"sealed", "scoped", "advisory"} {
		t.Run("hello "+class, func(t *testing.T) {
			dir := wasmCapsule(t, buildGuest(t, "hello"), "hello-wasm-"+class, class, "")
			if out := d.ok("explain", dir); !strings.Contains(out, "run.wasm") || !strings.Contains(out, "store limiter") {
				t.Errorf("explain shows no WASM grants:\n%s", out)
			}
			res := d.ctl("run", dir)
			if res.code != 0 || res.stdout != "hello from wasm [one two] hi\n" {
				t.Fatalf("run: %+v", res)
			}
			s := d.inspect(d.byCapsule("hello-wasm-" + class)[0].ID)
			if s.ExitStatus != "ok" || s.Containment.Achieved != class {
				t.Fatalf("inspect: %+v", s)
			}
			if insp := d.ok("inspect", s.ID); !strings.Contains(insp, "module.wasm (sha256 ") || !strings.Contains(insp, "wasmtime") {
				t.Errorf("inspect does not show the module and runtime:\n%s", insp)
			}
		})
	}

	t.Run("exit code", func(t *testing.T) {
		dir := wasmCapsule(t, buildGuest(t, "exit3"), "exit3", "sealed", "")
		if res := d.ctl("run", dir); res.code != 3 {
			t.Fatalf("run: %+v", res)
		}
		if s := d.inspect(d.byCapsule("exit3")[0].ID); s.ExitStatus != "error" || *s.ExitCode != 3 {
			t.Fatalf("inspect: %+v", s)
		}
	})

	t.Run("preopens", func(t *testing.T) {
		dir := wasmCapsule(t, buildGuest(t, "files"), "files", "sealed", "")
		res := d.ctl("run", dir)
		if res.code != 0 {
			t.Fatalf("run: %+v", res)
		}
		out := res.stdout
		for _, line := range []string{"write /work/out.txt: ALLOWED", "read /capsule/capsule.yaml: ALLOWED", "read /etc/passwd: refused",
			"read /work/../../etc/passwd: refused", "write /capsule/x: refused"} {
			if !strings.Contains(out, line) {
				t.Errorf("no %q in:\n%s", line, out)
			}
		}
		s := d.inspect(d.byCapsule("files")[0].ID)
		if data, err := os.ReadFile(filepath.Join(s.Workdir, "out.txt")); err != nil || string(data) != "written by wasm\n" {
			t.Errorf("the guest's file on the host: %q %v", data, err)
		}
	})

	t.Run("deadline", func(t *testing.T) {
		dir := wasmCapsule(t, buildGuest(t, "loop"), "loop", "sealed", "  limits:\n    deadline_seconds: 2\n")
		start := time.Now()
		res := d.ctl("run", dir)
		s := d.inspect(d.byCapsule("loop")[0].ID)
		if res.code != 124 || s.ExitStatus != "deadline_reached" || *s.ExitCode != 124 {
			t.Fatalf("run: %+v; inspect %+v", res, s)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("the deadline of 2s took %s to end the guest", took)
		}
	})

	t.Run("memory", func(t *testing.T) {
		dir := wasmCapsule(t, buildGuest(t, "hog"), "hog", "sealed", "  limits:\n    memory_bytes: 67108864\n")
		res := d.ctl("run", dir)
		s := d.inspect(d.byCapsule("hog")[0].ID)
		if s.ExitStatus == "ok" || !strings.Contains(res.stderr+d.ctl("logs", s.ID).stderr, "out of memory") {
			t.Fatalf("a guest past limits.memory_bytes: %+v\n%s", s, res.stderr)
		}
		// Go's runtime keeps some of the 64 MiB for itself: the guest held less.
		var held int
		for _, l := range strings.Split(res.stdout, "\n") {
			fmt.Sscanf(l, "held MiB: %d", &held)
		}
		if held == 0 || held >= 64 {
			t.Errorf("the guest held %d MiB under a 64 MiB cap:\n%s", held, res.stdout)
		}
	})

	t.Run("trap", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "module.wasm"), trapModule, 0o644); err != nil {
			t.Fatal(err)
		}
		wasmCapsule(t, dir, "trap", "sealed", "")
		d.ctl("run", dir)
		s := d.inspect(d.byCapsule("trap")[0].ID)
		if s.ExitStatus != "crashed" || !strings.Contains(s.Detail, "unreachable") {
			t.Fatalf("a trapping guest: %+v", s)
		}
	})

	t.Run("fuel", func(t *testing.T) {
		dir := wasmCapsule(t, buildGuest(t, "loop"), "fuel", "sealed", "  limits:\n    wasm_fuel: 1000000\n")
		d.ctl("run", dir)
		s := d.inspect(d.byCapsule("fuel")[0].ID)
		if s.ExitStatus != "crashed" || !strings.Contains(s.Detail, "limits.wasm_fuel") {
			t.Fatalf("a guest out of fuel: %+v", s)
		}
	})

	t.Run("spawned as a child", func(t *testing.T) {
		d.push(wasmCapsule(t, buildGuest(t, "hello"), "wasm-child", "sealed", "  limits:\n    deadline_seconds: 30\n"))
		parent := capsule(t, "wasm-parent", apiShell+`api -d '{"capsule":"wasm-child","version":"0.1.0","wait":true}' "$ROOST_ENDPOINT/v1/spawn"
`, sealedCaps("curl", "wasm-child", 60))
		if res := d.ctl("run", parent); res.code != 0 || !strings.Contains(res.stdout, `"status":"ok"`) {
			t.Fatalf("the parent: %+v", res)
		}
		kids := d.byCapsule("wasm-child")
		if len(kids) != 1 || d.ok("logs", kids[0].ID) != "hello from wasm [one two] hi\n" {
			t.Fatalf("the WASM child: %+v", kids)
		}
	})

	t.Run("not a module", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "module.wasm"), []byte("#!/bin/sh\necho no\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		wasmCapsule(t, dir, "notwasm", "sealed", "")
		res := d.ctl("run", dir)
		if res.code == 0 || !strings.Contains(res.stderr, "run.wasm") || !strings.Contains(res.stderr, "not a WASM module") {
			t.Fatalf("a capsule whose run.wasm is no module: %+v", res)
		}
	})
}

// kill -9 of roostd while a WASM session runs loses nothing: the restarted daemon finds
// the runner still holding its guest and records its exact end.
func TestWasmSurvivesDaemonKill(t *testing.T) {
	d := newDaemon(t)
	dir := wasmCapsule(t, buildGuest(t, "wait"), "waiter-wasm", "sealed", "")
	id := strings.TrimSpace(d.ok("run", "--detach", dir))
	s := d.inspect(id)
	d.kill9()
	d.start()
	if got := d.inspect(id); got.State != "running" {
		t.Fatalf("after the restart: %+v", got)
	}
	if err := os.WriteFile(filepath.Join(s.Workdir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if res := d.ctl("wait", id); res.code != 7 {
		t.Fatalf("wait: %+v", res)
	}
	if got := d.inspect(id); got.ExitStatus != "error" || *got.ExitCode != 7 {
		t.Fatalf("the end after the restart: %+v", got)
	}
}
