// roostctl is the operator's CLI for roostd. Every command is an RPC over the control
// socket; this package holds flags, output and exit codes only.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

const defaultSocket = "/run/roost/roostd.sock"

// Exit codes shared by every command; run and wait also exit with the capsule's code.
const (
	exitOK       = 0
	exitFailure  = 1
	exitUsage    = 2
	exitDeadline = 124
	exitNoLaunch = 125
	exitLost     = 255
)

// exitError carries the code a command wants roostctl to exit with. A nil err exits
// silently (the command printed what it had to).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func withCode(code int, err error) error {
	if err == nil && code == exitOK {
		return nil
	}
	return &exitError{code: code, err: err}
}

type app struct {
	socket string
	conn   *grpc.ClientConn
}

func main() {
	os.Exit(execute(os.Args[1:]))
}

func execute(args []string) int {
	a := &app{}
	root := a.rootCommand()
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	if a.conn != nil {
		a.conn.Close()
	}
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(os.Stderr, "roostctl:", a.describe(ee.err))
		}
		return ee.code
	}
	fmt.Fprintln(os.Stderr, "roostctl:", a.describe(err))
	if isUsage(err) {
		return exitUsage
	}
	return exitFailure
}

// usageError marks a mistake in how roostctl was called.
type usageError struct{ error }

func isUsage(err error) bool {
	var u usageError
	return errors.As(err, &u)
}

// describe turns an RPC error into words: the daemon's message, or how to reach a daemon
// that did not answer.
func (a *app) describe(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return err.Error()
	}
	if st.Code() == codes.Unavailable {
		return fmt.Sprintf("cannot reach roostd at %s (%s); is it running? Set --socket or ROOST_SOCKET to its socket", a.socket, st.Message())
	}
	return st.Message()
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "roostctl",
		Short: "Run and inspect contained agent sessions through roostd",
		Long: `roostctl talks to roostd, roost's daemon, over its control socket.

A capsule is a directory holding capsule.yaml and the files it needs; roost runs it as a
session, in a containment class it decides from the manifest, and keeps a record of every
session in its registry.`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.PersistentFlags().StringVar(&a.socket, "socket", "", "roostd's control socket (default $ROOST_SOCKET, else "+defaultSocket+")")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddGroup(&cobra.Group{ID: "run", Title: "Running sessions:"}, &cobra.Group{ID: "inspect", Title: "Inspecting:"}, &cobra.Group{ID: "host", Title: "The daemon and host:"})
	for _, c := range []*cobra.Command{a.runCommand(), a.stageCommand(), a.launchCommand(), a.waitCommand(), a.stopCommand(), a.killCommand(), a.pauseCommand(), a.resumeCommand(), a.execCommand(), a.rmCommand(), a.pruneCommand(), a.pushCommand()} {
		c.GroupID = "run"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.psCommand(), a.inspectCommand(), a.logsCommand(), a.statsCommand(), a.eventsCommand(), a.explainCommand(), a.artifactsCommand(), a.spendCommand()} {
		c.GroupID = "inspect"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.doctorCommand(), a.versionCommand()} {
		c.GroupID = "host"
		root.AddCommand(c)
	}
	return root
}

// connect dials roostd lazily: commands that fail on their arguments never touch the socket.
func (a *app) connect() (*grpc.ClientConn, error) {
	if a.conn != nil {
		return a.conn, nil
	}
	if a.socket == "" {
		a.socket = os.Getenv("ROOST_SOCKET")
	}
	if a.socket == "" {
		a.socket = defaultSocket
	}
	conn, err := grpc.NewClient("unix://"+a.socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// A local daemon that restarts is back within a second or two: retry the socket
		// often rather than backing off for minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return nil, err
	}
	a.conn = conn
	return conn, nil
}

func (a *app) sessions() (roostv1.SessionServiceClient, error) {
	conn, err := a.connect()
	if err != nil {
		return nil, err
	}
	return roostv1.NewSessionServiceClient(conn), nil
}

func (a *app) capsules() (roostv1.CapsuleServiceClient, error) {
	conn, err := a.connect()
	if err != nil {
		return nil, err
	}
	return roostv1.NewCapsuleServiceClient(conn), nil
}

func (a *app) system() (roostv1.SystemServiceClient, error) {
	conn, err := a.connect()
	if err != nil {
		return nil, err
	}
	return roostv1.NewSystemServiceClient(conn), nil
}

// exactArgs is cobra.ExactArgs that reports a usage error naming what is missing.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s takes %s (got %d arguments); see roostctl %s --help", cmd.Name(), what, len(args), cmd.Name())}
		}
		return nil
	}
}

func minArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return usageError{fmt.Errorf("%s takes %s; see roostctl %s --help", cmd.Name(), what, cmd.Name())}
		}
		return nil
	}
}
