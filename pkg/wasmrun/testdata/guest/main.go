// guest is a Go WASI (wasip1) program the runner's tests drive: its first argument names
// what it does.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: guest MODE [ARGS...]")
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "hello":
		fmt.Printf("hello from wasm: argv=%q\n", os.Args)
	case "exit":
		code, _ := strconv.Atoi(args[0])
		os.Exit(code)
	case "env":
		env := os.Environ()
		sort.Strings(env)
		for _, kv := range env {
			fmt.Println(kv)
		}
	case "write": // write PATH TEXT
		if err := os.WriteFile(args[0], []byte(args[1]), 0o644); err != nil {
			fail("write: %v", err)
		}
		fmt.Println("wrote", args[0])
	case "read": // read PATH
		data, err := os.ReadFile(args[0])
		if err != nil {
			fail("read: %v", err)
		}
		fmt.Printf("read %s: %s\n", args[0], data)
	case "ls": // ls DIR
		entries, err := os.ReadDir(args[0])
		if err != nil {
			fail("ls: %v", err)
		}
		for _, e := range entries {
			fmt.Println(e.Name())
		}
	case "stdin":
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			fail("stdin: %v", err)
		}
		fmt.Printf("stdin: %s\n", data)
	case "loop":
		fmt.Println("looping")
		for i := 0; ; i++ {
			sink = i
		}
	case "sleep": // sleep SECONDS: blocked in the host (poll_oneoff), not in wasm code
		d, _ := strconv.Atoi(args[0])
		fmt.Println("sleeping")
		time.Sleep(time.Duration(d) * time.Second)
		fmt.Println("woke")
	case "burn": // burn N: N iterations of arithmetic
		n, _ := strconv.Atoi(args[0])
		x := uint64(1)
		for i := 0; i < n; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
		fmt.Println("burned", x)
	case "hog": // hog STEP: keep allocating STEP bytes until the runtime gives up
		step, _ := strconv.Atoi(args[0])
		var kept [][]byte
		for total := 0; ; total += step {
			b := make([]byte, step)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			kept = append(kept, b)
			fmt.Printf("holding %d MiB\n", (total+step)>>20)
		}
	default:
		fail("unknown mode %q", os.Args[1])
	}
}

var sink int

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "guest: "+format+"\n", args...)
	os.Exit(1)
}
