package main

import (
	"context"
	"errors"
	"io"
	"syscall"

	"github.com/spf13/cobra"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func (a *app) logsCommand() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs SESSION",
		Short: "Print a session's output",
		Long: `logs prints what the session's program wrote: stdout to stdout, stderr to stderr.
With -f it keeps printing until the session ends.
Each stream is kept within the capsule's resources.log_max_bytes: its first bytes and its
newest. Where bytes were dropped between them a line says how many:
  --- roost: 123456 bytes of stdout dropped here (resources.log_max_bytes 67108864) ---
inspect shows, per stream, the bytes written and dropped.`,
		Args: exactArgs(1, "one SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.copyLogs(cmd.Context(), args[0], follow, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing output until the session ends")
	return cmd
}

// copyLogs streams a session's output to stdout and stderr.
func (a *app) copyLogs(ctx context.Context, id string, follow bool, stdout, stderr io.Writer) error {
	c, err := a.sessions()
	if err != nil {
		return err
	}
	stream, err := c.Logs(ctx, &roostv1.LogsRequest{Id: id, Follow: follow})
	if err != nil {
		return err
	}
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		w := stdout
		if chunk.GetStream() == "stderr" {
			w = stderr
		}
		if _, err := w.Write(chunk.GetData()); err != nil {
			if errors.Is(err, syscall.EPIPE) {
				return nil
			}
			return err
		}
	}
}
