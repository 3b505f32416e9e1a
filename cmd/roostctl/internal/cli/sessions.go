package cli

import (
	"context"
	"fmt"
	"strings"
	"text/template"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func (a *app) inspectCommand() *cobra.Command {
	var asJSON bool
	var format string
	cmd := &cobra.Command{
		Use:   "inspect SESSION",
		Short: "Show one session's whole record",
		Long: `inspect shows a session's record. SESSION is its name, its id or a unique prefix of it.

--json (or --format json) prints the record as JSON; -f/--format TEMPLATE prints a Go
template over that JSON object, with the functions ps --format has: -f '{{.state}}',
-f '{{.capsule.name}} {{.exit_code}}'. A key that is no field of the record is an error.`,
		Example: `  roostctl inspect -f '{{.state}}' web
  roostctl inspect --json web | jq .usage`,
		Args: exactArgs(1, "one SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if asJSON {
				if cmd.Flags().Changed("format") && format != "json" {
					return usageError{fmt.Errorf("--json and --format %q: give one (--json is --format json)", format)}
				}
				format = "json"
			}
			var tmpl *template.Template
			if format != "" && format != "json" {
				var err error
				if tmpl, err = sessionTemplate(format); err != nil {
					return err
				}
			}
			c, err := a.sessions()
			if err != nil {
				return err
			}
			resp, err := c.Get(cmd.Context(), &roostv1.GetRequest{Id: args[0]})
			if err != nil {
				return err
			}
			s := resp.GetSession()
			switch {
			case format == "json":
				return printJSON(cmd.OutOrStdout(), s)
			case tmpl != nil:
				return executeTemplate(cmd.OutOrStdout(), tmpl, []*roostv1.Session{s}, shortIDs([]*roostv1.Session{s}))
			}
			printSession(cmd.OutOrStdout(), s)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the record as JSON")
	cmd.Flags().StringVarP(&format, "format", "f", "", "print json, or a Go `TEMPLATE` over the JSON record, e.g. '{{.state}}'")
	return cmd
}

func (a *app) waitCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "wait SESSION",
		Short: "Block until a session ends; exit with its exit code",
		Long: `wait blocks until SESSION has ended and exits as run would: the capsule's exit code,
124 deadline reached, 125 never started, 255 lost. Like run's, wait's own usage errors (an
unknown flag, no SESSION) exit 125, so none passes for the program's 2.

A parent's children are stopped when it ends; wait returns once they have ended too.`,
		Args: exactArgs(1, "one SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sessions()
			if err != nil {
				return err
			}
			resp, err := c.Wait(cmd.Context(), &roostv1.WaitRequest{Id: args[0]})
			if err != nil {
				return err
			}
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), resp.GetSession()); err != nil {
					return err
				}
			}
			return sessionExit(resp.GetSession())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the final record as JSON")
	return cmd
}

// programUsageCode is the exit code for code of cmd, a command of root: wait and exec exit
// with a program's code, as run does, so their own usage errors are 125 as run's are, and
// never pass for the program's 2.
func programUsageCode(cmd, root *cobra.Command, code int) int {
	if code == exitUsage && cmd != nil && cmd.Parent() != nil && cmd.Parent().Parent() == root && cmd.Parent().Name() == "exec" {
		// exec's verbs for detached execs: attach and wait exit with the command's code too.
		return exitNoLaunch
	}
	if code == exitUsage && cmd != nil && cmd.Parent() == root && (cmd.Name() == "wait" || cmd.Name() == "exec") {
		return exitNoLaunch
	}
	return code
}

func (a *app) stopCommand() *cobra.Command {
	var grace time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stop SESSION...",
		Short: "Stop sessions: SIGTERM, then SIGKILL after the grace period",
		Long: `stop sends SIGTERM to every process of each SESSION, then SIGKILL once --grace has
passed, and returns once each end is recorded. Stopping an ended session does nothing and
is no failure. Exit codes: 0 every SESSION has ended; 1 one could not be stopped (each
failure is on stderr); 69 roostd could not be reached.`,
		Args: minArgs(1, "at least one SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if grace < 0 {
				return usageError{fmt.Errorf("--grace %s: must not be negative", grace)}
			}
			c, err := a.sessions()
			if err != nil {
				return err
			}
			return a.eachSession(cmd, args, func(id string) error {
				resp, err := c.Stop(cmd.Context(), &roostv1.StopRequest{Id: id, Grace: durationpb.New(grace)})
				if err != nil {
					return err
				}
				a.printEnded(cmd, resp.GetSession(), asJSON)
				return nil
			})
		},
	}
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "time between SIGTERM and SIGKILL")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the final records as JSON, one per line")
	return cmd
}

// eachSession runs one RPC per SESSION argument, printing each failure on stderr as it
// comes (the daemon's message names the session) and going on with the rest; it fails
// at once when roostd cannot be reached, since every later call would too.
func (a *app) eachSession(cmd *cobra.Command, args []string, do func(id string) error) error {
	failed := false
	for _, id := range args {
		err := do(id)
		if err == nil {
			continue
		}
		if status.Code(err) == codes.Unavailable || isUsage(err) {
			return err
		}
		fmt.Fprintln(cmd.ErrOrStderr(), "roostctl:", a.describe(err))
		failed = true
	}
	if failed {
		return withCode(exitFailure, nil)
	}
	return nil
}

func (a *app) printEnded(cmd *cobra.Command, s *roostv1.Session, asJSON bool) {
	if asJSON {
		_ = printJSONLine(cmd.OutOrStdout(), s)
		return
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.GetId(), outcome(s))
}

func (a *app) killCommand() *cobra.Command {
	var signal string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "kill SESSION...",
		Short: "Send a signal to every process of sessions (SIGKILL by default)",
		Long: `kill sends --signal to every process of each SESSION. For SIGKILL, or any signal that
ends the session, it returns once the end is recorded. A session that has already ended
is no failure: kill prints how it ended. Exit codes: 0 every SESSION was signalled or had
ended; 1 one could not be (each failure is on stderr); 2 an unknown signal; 69 roostd could
not be reached.`,
		Args: minArgs(1, "at least one SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sessions()
			if err != nil {
				return err
			}
			return a.eachSession(cmd, args, func(id string) error {
				resp, err := c.Kill(cmd.Context(), &roostv1.KillRequest{Id: id, Signal: signal})
				if status.Code(err) == codes.FailedPrecondition {
					// Like stop: a session that has already ended is where kill would take
					// it, so that is no failure; anything else (staged, paused) is.
					if got, gerr := c.Get(cmd.Context(), &roostv1.GetRequest{Id: id}); gerr == nil && got.GetSession().GetState() == "exited" {
						a.printEnded(cmd, got.GetSession(), asJSON)
						return nil
					}
				}
				if status.Code(err) == codes.InvalidArgument {
					return usageError{fmt.Errorf("--signal: %s", a.describe(err))}
				}
				if err != nil {
					return err
				}
				a.printEnded(cmd, resp.GetSession(), asJSON)
				return nil
			})
		},
	}
	cmd.Flags().StringVarP(&signal, "signal", "s", "KILL", "signal name (TERM, SIGHUP) or number")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the records as JSON, one per line")
	return cmd
}

func (a *app) rmCommand() *cobra.Command {
	var force, asJSON bool
	cmd := &cobra.Command{
		Use:   "rm SESSION...",
		Short: "Forget ended or staged sessions, with their children, and delete their records",
		Long: `rm forgets each SESSION and every session below it (its children, theirs, and so
on, children first), and deletes their records directories, homes and the workdirs roost
made (a --workdir given to run is kept). A live session anywhere in the tree refuses the
removal unless --force, which kills the live ones first. It prints each SESSION as given;
--json prints instead, one per line, each SESSION's record as it was just before removal.`,
		Args: minArgs(1, "at least one SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sessions()
			if err != nil {
				return err
			}
			return a.eachSession(cmd, args, func(id string) error {
				var rec *roostv1.Session
				if asJSON {
					got, err := c.Get(cmd.Context(), &roostv1.GetRequest{Id: id})
					if err != nil {
						return err
					}
					// By its id: the name may pass to another session between the two calls.
					rec, id = got.GetSession(), got.GetSession().GetId()
				}
				if _, err := c.Remove(cmd.Context(), &roostv1.RemoveRequest{Id: id, Force: force}); err != nil {
					if status.Code(err) == codes.FailedPrecondition && !force && !strings.Contains(err.Error(), "--force") && !strings.Contains(err.Error(), "-f") {
						return fmt.Errorf("%s; stop it first, or remove it with roostctl rm -f", a.describe(err))
					}
					return err
				}
				if asJSON {
					return printJSONLine(cmd.OutOrStdout(), rec)
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "kill the live sessions of the tree before removing it")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each removed session's record as JSON, one per line")
	return cmd
}

func (a *app) pauseCommand() *cobra.Command {
	return a.freezeCommand("pause", "Freeze every process of running sessions",
		`pause freezes each SESSION's cgroup: its processes stop where they are until resume.
The deadline does not run while a session is paused. Scoped and sealed sessions can be
paused; advisory and unconfined ones have no cgroup to freeze.`,
		func(ctx context.Context, c roostv1.SessionServiceClient, id string) (*roostv1.Session, error) {
			resp, err := c.Pause(ctx, &roostv1.PauseRequest{Id: id})
			return resp.GetSession(), err
		})
}

func (a *app) resumeCommand() *cobra.Command {
	return a.freezeCommand("resume", "Thaw paused sessions", `resume thaws each paused SESSION; its deadline moves on by the time it was paused.`,
		func(ctx context.Context, c roostv1.SessionServiceClient, id string) (*roostv1.Session, error) {
			resp, err := c.Resume(ctx, &roostv1.ResumeRequest{Id: id})
			return resp.GetSession(), err
		})
}

func (a *app) freezeCommand(name, short, long string, call func(context.Context, roostv1.SessionServiceClient, string) (*roostv1.Session, error)) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   name + " SESSION...",
		Short: short,
		Long:  long,
		Args:  minArgs(1, "at least one SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sessions()
			if err != nil {
				return err
			}
			return a.eachSession(cmd, args, func(id string) error {
				s, err := call(cmd.Context(), c, id)
				if err != nil {
					return err
				}
				a.printEnded(cmd, s, asJSON)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the records as JSON, one per line")
	return cmd
}
