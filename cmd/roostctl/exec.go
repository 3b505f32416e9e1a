package main

import "github.com/spf13/cobra"

func (a *app) execCommand() *cobra.Command {
	return &cobra.Command{Use: "exec SESSION -- COMMAND [ARG...]", Short: "Run a command inside a running session"}
}
