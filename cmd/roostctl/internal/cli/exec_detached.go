package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// execArgs refuses anything but n arguments, naming the exec verb that takes them.
func execArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s takes %s (got %d arguments); see roostctl %s --help", cmd.CommandPath()[len("roostctl "):], what, len(args), cmd.CommandPath()[len("roostctl "):])}
		}
		return nil
	}
}

// execDetach starts the command detached and prints its exec id.
func (a *app) execDetach(ctx context.Context, out io.Writer, start *roostv1.ExecStart) error {
	c, err := a.sessions()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.Exec(ctx)
	if err != nil {
		return err
	}
	start.Detach = true
	if err := stream.Send(&roostv1.ExecRequest{Msg: &roostv1.ExecRequest_Start{Start: start}}); err != nil {
		return recvErr(stream, err)
	}
	_ = stream.CloseSend()
	resp, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return errors.New("roostd ended the exec without saying whether the command started")
	}
	if err != nil {
		return err
	}
	switch m := resp.GetMsg().(type) {
	case *roostv1.ExecResponse_Started:
		_, err := fmt.Fprintln(out, m.Started.GetExecId())
		return err
	case *roostv1.ExecResponse_Exit:
		// It never ran: the detail says why (refused by shell.allow, not found).
		return withCode(max(int(m.Exit.GetExitCode()), exitFailure), errors.New(m.Exit.GetDetail()))
	}
	return fmt.Errorf("roostd answered the exec with %T", resp.GetMsg())
}

// execSubcommands are exec's verbs for detached execs.
func (a *app) execSubcommands() []*cobra.Command {
	return []*cobra.Command{a.execAttachCommand(), a.execWaitCommand(), a.execKillCommand(), a.execLsCommand()}
}

func (a *app) execAttachCommand() *cobra.Command {
	var fromStart, noFollow, raw bool
	cmd := &cobra.Command{
		Use:   "attach [flags] SESSION EXEC_ID",
		Short: "Follow a detached exec's output; exit with its code",
		Long: `attach follows the output of a detached exec (exec -d) from now on, or with
--from-start from its first byte the records keep, until it ends, and exits with its code
(128+N when signal N ended it, 255 when it was lost). An exec that has ended prints what
its records keep with --from-start and exits with its code at once. --no-follow prints what
is kept now and exits 0 while the command still runs. Interrupting attach leaves the
command running. Its stdout and stderr go to roostctl's; on a terminal, control characters
are shown as text unless --raw, as with exec.`,
		Example: `  roostctl exec attach ses_0193 exec_4f2a9c01b7de
  roostctl exec attach --from-start ses_0193 exec_4f2a9c01b7de`,
		Args: execArgs(2, "a SESSION and an EXEC_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sessions()
			if err != nil {
				return err
			}
			req := &roostv1.AttachExecRequest{Id: args[0], ExecId: args[1], Follow: !noFollow}
			if !fromStart {
				req.Tail = new(int64)
			}
			stream, err := c.AttachExec(cmd.Context(), req)
			if err != nil {
				return err
			}
			stdout, flushOut := sessionOutput(cmd.OutOrStdout(), raw)
			stderr, flushErr := sessionOutput(cmd.ErrOrStderr(), raw)
			defer func() {
				_ = flushOut()
				_ = flushErr()
			}()
			for {
				resp, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					// Without follow, a command that still runs.
					return nil
				}
				if err != nil {
					return err
				}
				switch m := resp.GetMsg().(type) {
				case *roostv1.AttachExecResponse_Output:
					w := stdout
					if m.Output.GetStream() == "stderr" {
						w = stderr
					}
					_, _ = w.Write(m.Output.GetData())
				case *roostv1.AttachExecResponse_Exit:
					return withCode(int(m.Exit.GetExitCode()), nil)
				}
			}
		},
	}
	cmd.Flags().BoolVar(&fromStart, "from-start", false, "print what the records keep of its output from the start, then follow")
	cmd.Flags().BoolVar(&noFollow, "no-follow", false, "print what is kept now and return, without waiting for the end")
	cmd.Flags().BoolVar(&raw, "raw", false, "on a terminal, pass control characters and escape sequences through rather than show them as text")
	return cmd
}

func (a *app) execWaitCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "wait [flags] SESSION EXEC_ID",
		Short: "Block until a detached exec ends; exit with its code",
		Long: `wait blocks until a detached exec (exec -d) has ended and exits with its code: 128+N
when signal N ended it, 255 when it was lost (roostd stopped while it ran). An exec that has
ended returns at once.`,
		Args: execArgs(2, "a SESSION and an EXEC_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sessions()
			if err != nil {
				return err
			}
			resp, err := c.WaitExec(cmd.Context(), &roostv1.WaitExecRequest{Id: args[0], ExecId: args[1]})
			if err != nil {
				return err
			}
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), resp.GetExec()); err != nil {
					return err
				}
			}
			return execExit(resp.GetExec())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the exec as JSON")
	return cmd
}

// execExit is roostctl's exit for an ended detached exec: its code, 255 when lost (with
// why).
func execExit(x *roostv1.ExecInfo) error {
	if x.ExitCode == nil {
		return withCode(exitLost, errors.New(x.GetDetail()))
	}
	return withCode(int(x.GetExitCode()), nil)
}

func (a *app) execKillCommand() *cobra.Command {
	var signal string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "kill [flags] SESSION EXEC_ID",
		Short: "Send a signal to a detached exec (SIGKILL by default)",
		Long: `kill sends --signal to a detached exec's command and what it started. For SIGKILL it
returns once the end is recorded. An exec that has already ended is no failure: kill says
how it ended. Exit codes: 0 signalled or ended; 1 it could not be; 125 a usage error (an
unknown signal among them).`,
		Args: execArgs(2, "a SESSION and an EXEC_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sessions()
			if err != nil {
				return err
			}
			resp, err := c.KillExec(cmd.Context(), &roostv1.KillExecRequest{Id: args[0], ExecId: args[1], Signal: signal})
			switch status.Code(err) {
			case codes.OK:
			case codes.FailedPrecondition:
				// Ended already: where kill would take it.
				_, err := fmt.Fprintln(cmd.ErrOrStderr(), "roostctl:", a.describe(err))
				return err
			case codes.InvalidArgument:
				return usageError{fmt.Errorf("--signal: %s", a.describe(err))}
			default:
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), resp.GetExec())
			}
			x := resp.GetExec()
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s  %s\n", x.GetExecId(), orDash(execOutcome(x)))
			return err
		},
	}
	cmd.Flags().StringVarP(&signal, "signal", "s", "KILL", "signal name (TERM, SIGHUP) or number")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the exec as JSON")
	return cmd
}

// execOutcome says how an exec is: running, or how it ended.
func execOutcome(x *roostv1.ExecInfo) string {
	if x.GetState() == "running" {
		return "running"
	}
	return x.GetDetail()
}

func (a *app) execLsCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls [flags] SESSION",
		Short: "List a session's detached execs",
		Long: `ls lists a session's detached execs (exec -d), oldest first: running ones, and the
64 newest that have ended, with their output's size (stdout and stderr written). A lost
exec was running when roostd stopped: what it wrote is kept, its end is not known.`,
		Args: execArgs(1, "one SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sessions()
			if err != nil {
				return err
			}
			resp, err := c.ListExecs(cmd.Context(), &roostv1.ListExecsRequest{Id: args[0]})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSONList(cmd.OutOrStdout(), resp.GetExecs())
			}
			rows := [][]string{{"EXEC ID", "STATE", "STARTED", "OUTPUT", "COMMAND", "DETAIL"}}
			for _, x := range resp.GetExecs() {
				detail := ""
				if x.GetState() != "running" {
					detail = x.GetDetail()
				}
				rows = append(rows, []string{x.GetExecId(), x.GetState(), ago(x.GetStartedAt()),
					bytesIEC(x.GetStdout().GetWrittenBytes() + x.GetStderr().GetWrittenBytes()), shellJoin(x.GetCommand()), detail})
			}
			return writeTable(cmd.OutOrStdout(), rows)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the execs as a JSON array")
	return cmd
}
