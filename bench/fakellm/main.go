// Command fakellm serves internal/fakellm on loopback for the bench scripts: a model that
// answers every call with a short text and a fixed usage, so an agent's episode costs no
// paid key and no network. It prints its base URL on stdout and serves until killed.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"roost.dev/roost/internal/fakellm"
)

func main() {
	key := flag.String("api-key", "", "the only key accepted (empty: any)")
	flag.Parse()
	s, err := fakellm.Start(fakellm.Config{APIKey: *key, InputTokens: 900, OutputTokens: 40})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(s.URL())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	s.Close()
}
