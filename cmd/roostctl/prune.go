package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func (a *app) pruneCommand() *cobra.Command {
	var until time.Duration
	var dryRun, asJSON bool
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Remove ended sessions now: all of them, or those ended before --until",
		Long: `prune removes every ended session, or with --until DUR those that ended more than DUR
ago, each as rm does: its registry entry, its records directory, its home and the workdir
roost made for it (a --workdir given to run is handed back, never removed). Staged and live
sessions stay, and so does an ended session a live session descends from. The registry's
event log is then compacted to the sessions that remain, so events --since an older
sequence number fails, naming the oldest event kept.
--dry-run removes nothing and lists what would go. With --json it prints the whole answer.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if until < 0 {
				return usageError{fmt.Errorf("--until %s: must not be negative", until)}
			}
			c, err := a.sessions()
			if err != nil {
				return err
			}
			req := &roostv1.PruneRequest{DryRun: dryRun}
			if until > 0 {
				req.Until = durationpb.New(until)
			}
			resp, err := c.Prune(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			out := cmd.OutOrStdout()
			if len(resp.GetRemoved()) > 0 {
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SESSION\tCAPSULE\tENDED\tSTATUS\tSIZE")
				for _, s := range resp.GetRemoved() {
					fmt.Fprintf(tw, "%s\t%s@%s\t%s\t%s\t%s\n", s.GetId(), s.GetCapsule().GetName(), s.GetCapsule().GetVersion(), ago(s.GetEndedAt()), orDash(s.GetExitStatus()), bytesIEC(s.GetBytes()))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			n := len(resp.GetRemoved())
			switch {
			case dryRun:
				fmt.Fprintf(out, "would remove %d ended %s, %s on disk\n", n, plural(n, "session"), bytesIEC(resp.GetBytes()))
			default:
				fmt.Fprintf(out, "removed %d ended %s, %s freed; %d %s compacted\n", n, plural(n, "session"), bytesIEC(resp.GetBytes()), resp.GetEventsCompacted(), plural(int(resp.GetEventsCompacted()), "event"))
			}
			for _, s := range resp.GetKept() {
				fmt.Fprintf(cmd.ErrOrStderr(), "kept %s: %s\n", s.GetId(), s.GetKeptBecause())
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&until, "until", 0, "only sessions that ended more than this long ago (e.g. 24h); default every ended session")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "remove nothing; list what would be removed")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the answer as JSON")
	return cmd
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
