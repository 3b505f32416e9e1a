// hello is the smallest Go WASI guest: the benchmark's module.
package main

import "os"

func main() {
	os.Stdout.WriteString("hello from wasm\n")
}
