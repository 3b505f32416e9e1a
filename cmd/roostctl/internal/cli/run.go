package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/durationpb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/manifest"
)

// stageFlags are the options run and stage share.
type stageFlags struct {
	workdir     string
	deadline    time.Duration
	memory      sizeValue
	containment string
	json        bool
	name        string
	labels      labelsValue
	node        string
}

func (f *stageFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.workdir, "workdir", "", "use DIR as the session's working directory (created if missing; kept on rm)")
	cmd.Flags().DurationVar(&f.deadline, "deadline", 0, "end the session after DUR (whole seconds); can only lower limits.deadline_seconds")
	cmd.Flags().VarP(&f.memory, "memory", "m", "bound the session's cgroup memory to SIZE: bytes, or 64Mi, 4Gi (powers of 1024), 512M, 4G (of 1000); can only lower resources.cgroup_memory_bytes")
	cmd.Flags().StringVar(&f.containment, "containment", "", "require at least this class: unconfined, advisory, scoped or sealed")
	cmd.Flags().BoolVar(&f.json, "json", false, "print the session record as JSON")
	cmd.Flags().StringVar(&f.name, "name", "", "give the session a `NAME` every command takes: [a-z0-9][a-z0-9_.-]*, at most 64 bytes, unique until rm")
	cmd.Flags().StringVar(&f.node, "node", "", "on a fleet node: stage on the node `NAME` (roostctl fleet nodes lists them) instead of letting roost place the session")
	cmd.Flags().VarP(&f.labels, "label", "l", "label the session `KEY=VALUE` (repeatable; KEY alone: an empty value); ps --filter label=KEY=VALUE selects by it")
}

// sizeValue is a flag's size in bytes, written as capsule.yaml writes sizes
// (manifest.ParseSize): one that does not read is a usage error naming the flag and the
// units there are.
type sizeValue int64

func (v *sizeValue) Set(s string) error {
	n, err := manifest.ParseSize(s)
	if err != nil {
		return err
	}
	*v = sizeValue(n)
	return nil
}

func (v *sizeValue) String() string {
	if *v == 0 {
		return ""
	}
	return manifest.FormatSize(int64(*v))
}

func (v *sizeValue) Type() string { return "SIZE" }

// capsuleArg is what the daemon is told a CAPSULE argument names: a pushed capsule's
// name@version as it is, a directory as an absolute path (the daemon has another working
// directory).
func capsuleArg(arg string) (string, error) {
	if strings.Contains(arg, "@") && !strings.Contains(arg, "/") {
		if _, err := os.Stat(arg); err != nil {
			return arg, nil
		}
	}
	return treePath(arg)
}

// treePath is a capsule directory as roostd is told it: absolute, with the links on the
// way resolved here, as the operator. roostd, as root, follows only root's own links on
// the path to a tree (any other may have been planted), so `roostctl push ~/src/capsule`
// through a link of the operator's own still works. A path that does not resolve goes as
// it is, for roostd to say what is wrong with it.
func treePath(arg string) (string, error) {
	abs, err := filepath.Abs(arg)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real, nil
	}
	return abs, nil
}

// request resolves paths against roostctl's own working directory: the daemon has another.
func (f *stageFlags) request(capsule string) (*roostv1.StageRequest, error) {
	abs, err := capsuleArg(capsule)
	if err != nil {
		return nil, err
	}
	// roostd checks the name (and says what is wrong with it): one rule, in one place.
	req := &roostv1.StageRequest{Capsule: abs, Containment: f.containment, Name: f.name, MemoryBytes: int64(f.memory), Labels: f.labels, Node: f.node}
	if f.workdir != "" {
		if req.Workdir, err = filepath.Abs(f.workdir); err != nil {
			return nil, err
		}
	}
	if f.deadline != 0 {
		if f.deadline < time.Second || f.deadline%time.Second != 0 {
			return nil, usageError{fmt.Errorf("--deadline %s: give a whole number of seconds, at least 1s", f.deadline)}
		}
		req.Deadline = durationpb.New(f.deadline)
	}
	return req, nil
}

func (a *app) stageCommand() *cobra.Command {
	var f stageFlags
	cmd := &cobra.Command{
		Use:   "stage CAPSULE|NAME@VERSION",
		Short: "Validate a capsule and record a session for it, without starting it",
		Long: `stage reads CAPSULE (a directory holding capsule.yaml), validates it, decides its
containment and records a session in state "staged". It prints the session id.

Exit codes: 0 staged; 125 the capsule was refused (the reason is on stderr).`,
		Args: exactArgs(1, "one CAPSULE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkDeadline(cmd, &f); err != nil {
				return err
			}
			s, err := a.stage(cmd.Context(), &f, args[0])
			if err != nil {
				return stageFailed(err)
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), s)
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.GetId())
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

// checkDeadline refuses a --deadline that says nothing: left at zero, the flag would be
// taken as not given, and the manifest's deadline would apply unannounced.
func checkDeadline(cmd *cobra.Command, f *stageFlags) error {
	if cmd.Flags().Changed("deadline") && f.deadline <= 0 {
		return usageError{fmt.Errorf("--deadline %s: give a positive whole number of seconds, e.g. 30s or 5m", f.deadline)}
	}
	return nil
}

// stageFailed is the exit for a capsule roost would not stage: 125, unless roostctl itself
// was called wrongly or could not reach roostd.
func stageFailed(err error) error {
	if isUsage(err) {
		return err
	}
	return withCode(exitNoLaunch, err)
}

func (a *app) stage(ctx context.Context, f *stageFlags, capsule string) (*roostv1.Session, error) {
	req, err := f.request(capsule)
	if err != nil {
		return nil, err
	}
	c, err := a.sessions()
	if err != nil {
		return nil, err
	}
	resp, err := c.Stage(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.GetSession(), nil
}

func (a *app) launchCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "launch SESSION",
		Short: "Start a staged session",
		Long: `launch starts a session staged earlier and returns once its program runs.

Exit codes: 0 launched; 125 it could not be launched or its program did not start.`,
		Args: exactArgs(1, "one SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sessions()
			if err != nil {
				return err
			}
			resp, err := c.Launch(cmd.Context(), &roostv1.LaunchRequest{Id: args[0]})
			if err != nil {
				return withCode(exitNoLaunch, err)
			}
			s := resp.GetSession()
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), s); err != nil {
					return err
				}
			} else {
				fmt.Fprintln(cmd.OutOrStdout(), s.GetId())
			}
			if s.GetExitStatus() == "start_failed" {
				return withCode(exitNoLaunch, errors.New(s.GetDetail()))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the session record as JSON")
	return cmd
}

func (a *app) runCommand() *cobra.Command {
	var f stageFlags
	var detach, raw bool
	cmd := &cobra.Command{
		Use:   "run CAPSULE|NAME@VERSION",
		Short: "Stage and launch a capsule, stream its output and exit with its exit code",
		Long: `run stages and launches CAPSULE (a directory holding capsule.yaml), streams the
program's stdout and stderr to roostctl's own, and exits when the session ends (and,
for a parent, the children it spawned, stopped when it ends).

Ctrl-C (or SIGTERM to roostctl) stops the session: SIGTERM, then SIGKILL after 10s; a
second one kills it.

Exit codes: the capsule's exit code; 124 its deadline was reached; 125 roost could not
stage or launch it, or run itself was called wrongly or failed (the reason is on stderr);
128+N when signal N ended it (137 killed, 143 stopped); 255 roost lost track of how it
ended; 69 roostd could not be reached.

With --detach, run prints the session id and returns once the program runs. With --json,
it prints the session record as JSON instead of the program's output (the final record,
unless --detach).

On a terminal, control characters in the program's output other than newline, tab and
carriage return (escape sequences that would set the clipboard or the window title, clear
or move about the screen) are shown as text, \x1b for ESC; --raw passes them through as
they are. Piped or redirected, the output is always the program's bytes as they are.`,
		Example: `  roostctl run examples/hello
  roostctl run --deadline 30s --workdir ./out examples/hello
  roostctl run --memory 512Mi examples/hello
  roostctl run --detach examples/hello && roostctl ps
  roostctl run --name web -d examples/countdown && roostctl logs -f web`,
		Args: exactArgs(1, "one CAPSULE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.run(cmd, &f, detach, raw, args[0])
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "return once the session runs; print its id")
	cmd.Flags().BoolVar(&raw, "raw", false, "on a terminal, pass control characters and escape sequences through rather than show them as text")
	return cmd
}

func (a *app) run(cmd *cobra.Command, f *stageFlags, detach, raw bool, capsule string) error {
	ctx := cmd.Context()
	if err := checkDeadline(cmd, f); err != nil {
		return err
	}
	staged, err := a.stage(ctx, f, capsule)
	if err != nil {
		return stageFailed(err)
	}
	c, _ := a.sessions()
	// From here the session exists: interrupting roostctl stops it rather than leaving it
	// running unattended.
	interrupts := make(chan os.Signal, 2)
	signal.Notify(interrupts, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(interrupts)

	launched, err := launchShowingWait(ctx, c, cmd.ErrOrStderr(), &roostv1.LaunchRequest{Id: staged.GetId()})
	if err != nil {
		return withCode(exitNoLaunch, fmt.Errorf("session %s: %w", staged.GetId(), err))
	}
	s := launched.GetSession()
	if s.GetExitStatus() == "start_failed" {
		if f.json {
			_ = printJSON(cmd.OutOrStdout(), s)
		}
		return withCode(exitNoLaunch, fmt.Errorf("session %s did not start: %s", s.GetId(), s.GetDetail()))
	}
	if detach {
		if f.json {
			return printJSON(cmd.OutOrStdout(), s)
		}
		fmt.Fprintln(cmd.OutOrStdout(), s.GetId())
		return nil
	}

	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		count := 0
		for {
			select {
			case sig := <-interrupts:
				count++
				if count == 1 {
					fmt.Fprintf(os.Stderr, "roostctl: stopping session %s (Ctrl-C again to kill it)\n", s.GetId())
					go c.Stop(context.WithoutCancel(streamCtx), &roostv1.StopRequest{Id: s.GetId(), Reason: "interrupted (" + unix.SignalName(sig.(syscall.Signal)) + " to roostctl run)"})
				} else {
					go c.Kill(context.WithoutCancel(streamCtx), &roostv1.KillRequest{Id: s.GetId(), Signal: "KILL"})
				}
			case <-streamCtx.Done():
				return
			}
		}
	}()

	if !f.json {
		if err := a.copyLogs(streamCtx, s.GetId(), true, raw, cmd.OutOrStdout(), cmd.ErrOrStderr()); err != nil {
			return err
		}
	}
	final, err := c.Wait(ctx, &roostv1.WaitRequest{Id: s.GetId()})
	if err != nil {
		return err
	}
	end := final.GetSession()
	if f.json {
		if err := printJSON(cmd.OutOrStdout(), end); err != nil {
			return err
		}
		// The record says how it ended; stderr stays empty for a script reading both.
		return withCode(sessionExitCode(end), nil)
	}
	return sessionExit(end)
}

// sessionExit turns an ended session into roostctl's exit: the capsule's code, with what
// roost knows said on stderr when the code alone would not tell.
func sessionExit(s *roostv1.Session) error {
	code := sessionExitCode(s)
	switch s.GetExitStatus() {
	case "ok", "error":
		return withCode(code, nil)
	}
	return withCode(code, fmt.Errorf("session %s %s: %s", s.GetId(), s.GetExitStatus(), s.GetDetail()))
}
