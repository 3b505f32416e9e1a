package main

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func (a *app) logsCommand() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs SESSION",
		Short: "Print a session's output",
		Long: `logs prints what the session's program wrote: stdout to stdout, stderr to stderr.
With -f it keeps printing until the session ends.`,
		Args: exactArgs(1, "one SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.copyLogs(cmd.Context(), args[0], follow, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing output until the session ends")
	return cmd
}

func (a *app) eventsCommand() *cobra.Command {
	var since uint64
	var follow, asJSON bool
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Print the registry's events",
		Long: `events prints every registry event with a sequence number above --since, oldest first,
and exits; --follow keeps printing new events as they happen. Sequence numbers survive
daemon restarts, so "events --since N --follow" resumes exactly after event N.
With --json it prints one JSON object per line, each with its "seq".`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sessions()
			if err != nil {
				return err
			}
			stream, err := c.Events(cmd.Context(), &roostv1.EventsRequest{Since: since, Follow: follow})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			for {
				resp, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					return tw.Flush()
				}
				if err != nil {
					tw.Flush()
					return err
				}
				ev := resp.GetEvent()
				if asJSON {
					if err := printJSONLine(out, ev); err != nil {
						return err
					}
					continue
				}
				what := ev.GetExitStatus()
				if ev.ExitCode != nil {
					what = fmt.Sprintf("%s (%d)", what, ev.GetExitCode())
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", ev.GetSeq(), ev.GetTime().AsTime().Local().Format(time.RFC3339), ev.GetType(), ev.GetSessionId(), what)
				if follow {
					tw.Flush()
				}
			}
		},
	}
	cmd.Flags().Uint64Var(&since, "since", 0, "print events after this sequence number")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing events as they happen")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per line")
	return cmd
}
