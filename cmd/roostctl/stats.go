package main

import "github.com/spf13/cobra"

func (a *app) statsCommand() *cobra.Command {
	return &cobra.Command{Use: "stats [SESSION...]", Short: "Show live resource use of sessions"}
}
