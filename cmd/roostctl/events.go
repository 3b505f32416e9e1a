package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// streamEvents prints events after since until the stream ends, keeping last current.
func (a *app) streamEvents(ctx context.Context, c roostv1.SessionServiceClient, since uint64, fromOldest, follow, asJSON bool, out io.Writer, tw *tabwriter.Writer, last *uint64, opts ...grpc.CallOption) error {
	// Without --since, from whatever the log still keeps; --since 0 asks for everything,
	// and roostd says so when retention has compacted the start away.
	stream, err := c.Events(ctx, &roostv1.EventsRequest{Since: since, Follow: follow, FromOldestKept: since == 0 && fromOldest}, opts...)
	if err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		ev := resp.GetEvent()
		*last = ev.GetSeq()
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
		if what == "" {
			what = ev.GetDetail()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", ev.GetSeq(), ev.GetTime().AsTime().Local().Format(time.RFC3339), ev.GetType(), ev.GetSessionId(), what)
		if follow {
			tw.Flush()
		}
	}
}

func (a *app) eventsCommand() *cobra.Command {
	var since uint64
	var follow, asJSON bool
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Print the registry's events",
		Long: `events prints every registry event with a sequence number above --since, oldest first,
and exits; --follow keeps printing new events as they happen. Sequence numbers survive
daemon restarts, so "events --since N --follow" resumes exactly after event N; a follower
that loses roostd (a restart, a crash) waits for it and resumes after the last event it
printed, so it sees every event exactly once.
With --json it prints one JSON object per line, each with its "seq".`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sessions()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			defer tw.Flush()
			last := since
			var opts []grpc.CallOption
			for {
				err := a.streamEvents(cmd.Context(), c, last, !cmd.Flags().Changed("since"), follow, asJSON, out, tw, &last, opts...)
				if err == nil || !follow || status.Code(err) != codes.Unavailable {
					return err
				}
				// roostd went away (a restart, a crash): the registry keeps every event, so
				// resuming after the last one seen loses none and repeats none.
				tw.Flush()
				fmt.Fprintf(cmd.ErrOrStderr(), "roostctl: lost roostd (%s); resuming after event %d once it is back\n", status.Convert(err).Message(), last)
				opts = []grpc.CallOption{grpc.WaitForReady(true)}
			}
		},
	}
	cmd.Flags().Uint64Var(&since, "since", 0, "print events after this sequence number")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing events as they happen")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per line")
	return cmd
}
