// roostctl is the operator's CLI for roostd; see package cli.
package main

import (
	"os"

	"roost.dev/roost/cmd/roostctl/internal/cli"
)

func main() { os.Exit(cli.Execute(os.Args[1:])) }
