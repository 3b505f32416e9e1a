// mangen writes roostctl's man pages, one per command, from its command tree, so they
// never drift from --help: make man and make build call it. It is a program of its own so
// roostctl does not link (nor initialise, on every start) the markdown and roff code it
// needs.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"roost.dev/roost/cmd/roostctl/internal/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: mangen DIR")
		os.Exit(2)
	}
	if err := WriteManPages(cli.Root(), os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "mangen:", err)
		os.Exit(1)
	}
}

// WriteManPages writes roostctl.1, roostctl-run.1, ... into dir. The date is
// SOURCE_DATE_EPOCH's when set (make passes the last commit's), so a tree gives the same
// pages every time.
func WriteManPages(root *cobra.Command, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root.DisableAutoGenTag = true
	header := &doc.GenManHeader{Title: "ROOSTCTL", Section: "1", Source: "roost", Manual: "roost manual"}
	return doc.GenManTree(root, header, dir)
}
