// Package cli is roostctl, the operator's CLI for roostd: its command tree, flags, output
// and exit codes. Every command is an RPC over the control socket, or over roostd's remote
// listener with --server. It is a package of its
// own so that what only builds roostctl's documentation (the man pages) is not linked into
// the CLI an operator starts for every command.
package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/version"
)

const defaultSocket = "/run/roost/roostd.sock"

// Exit codes, one table for every command (docs/cli.md's "Exit codes" repeats it). Commands
// that report a session's end (run, wait, stop, kill) exit with the capsule's own code, or
// one of the codes from 124 up; every other outcome is 0, 1, 2 or 69.
const (
	exitOK      = 0
	exitFailure = 1 // a roostctl operation failed: roostd refused it or it went wrong
	exitUsage   = 2 // roostctl was called wrongly: unknown command, bad flag or argument
	// exitUnavailable is sysexits' EX_UNAVAILABLE: roostd could not be reached, so nothing
	// is known of the session; distinct from any code a capsule's program can end with
	// through roost (its own codes are below 124 or 128+N).
	exitUnavailable = 69
	exitDeadline    = 124 // the session's deadline was reached
	// exitNoLaunch is docker run's 125: roost could not stage or launch the session, or
	// (for run, whose other codes are the program's) roostctl run itself was called wrongly
	// or failed; wait's and exec's usage errors too (programUsageCode).
	exitNoLaunch = 125
	exitLost     = 255 // roost lost track of how the session ended
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
	// server is roostd's remote listener, https://HOST:PORT; tlsCA, tlsCert and tlsKey
	// are the files its TLS is dialled with.
	server, tlsCA, tlsCert, tlsKey string
	conn                           *grpc.ClientConn
}

// Execute runs roostctl with args (without the program name) and returns its exit code.
func Execute(args []string) int {
	code, msg := execute(args)
	if msg != "" {
		fmt.Fprintln(os.Stderr, "roostctl:", msg)
	}
	return code
}

// execute runs roostctl with args and returns its exit code and what to say on stderr.
func execute(args []string) (int, string) {
	a := &app{}
	root := a.rootCommand()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(context.Background())
	if a.conn != nil {
		a.conn.Close()
	}
	if err == nil {
		return exitOK, ""
	}
	code, msg := a.classify(err)
	if cmd != nil && cmd.Name() == "run" && cmd.Parent() == root {
		code = runCode(err, code)
	}
	code = programUsageCode(cmd, root, code)
	return code, msg
}

// classify is the one place an error becomes an exit code and the line that explains it.
// An unreachable roostd is 69 whatever the command would have exited with, since nothing
// is known of the session then.
func (a *app) classify(err error) (int, string) {
	var ee *exitError
	code := exitFailure
	if errors.As(err, &ee) {
		if ee.err == nil {
			return ee.code, ""
		}
		code, err = ee.code, ee.err
	}
	if status.Code(err) == codes.Unavailable {
		return exitUnavailable, a.describe(err)
	}
	if isUsage(err) {
		return exitUsage, err.Error()
	}
	return code, a.describe(err)
}

// runCode is the exit code of run for err, classified as code. run exits with the
// program's own code, which may be 1 or 2: run's own usage errors and failures are 125, so
// they never pass for the program's. A code a session's end chose (an exitError) is kept.
func runCode(err error, code int) int {
	var ee *exitError
	if code == exitUsage || code == exitFailure && !errors.As(err, &ee) {
		return exitNoLaunch
	}
	return code
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
		why := st.Message()
		// gRPC wraps the dial error in its own words; the last "dial unix PATH: " is where
		// the system's reason (no such file, connection refused, permission denied) begins.
		if i := strings.LastIndex(why, ": connect: "); i >= 0 {
			why = strings.TrimSuffix(why[i+len(": connect: "):], `"`)
		}
		if a.server != "" {
			return fmt.Sprintf("cannot reach roostd at %s: %s; is it running and listening there (roostd --listen-tcp), and are --tls-ca, --tls-cert and --tls-key its CA's?", a.server, st.Message())
		}
		return fmt.Sprintf("cannot reach roostd at %s: %s; is it running? Set --socket or ROOST_SOCKET to its socket", a.socket, why)
	}
	return st.Message()
}

// Root is roostctl's command tree, for what documents it (cmd/roostctl/internal/mangen).
func Root() *cobra.Command {
	root := (&app{}).rootCommand()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	return root
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "roostctl",
		Short: "Run and inspect contained agent sessions through roostd",
		Long: `roostctl talks to roostd, roost's daemon, over its control socket.

A capsule is a directory holding capsule.yaml and the files it needs; roost runs it as a
session, in a containment class it decides from the manifest, and keeps a record of every
session in its registry.`,
		SilenceUsage:               true,
		SilenceErrors:              true,
		SuggestionsMinimumDistance: 2,
		// The root runs only to say that its argument is no command: cobra's own error for
		// that is not a usage error, and would exit 1 like a failed operation.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			return unknownCommand(cmd, args[0])
		},
		RunE:    func(cmd *cobra.Command, args []string) error { return cmd.Help() },
		Version: version.Version,
	}
	// --version is the first line of roostctl version: this binary's, without asking roostd.
	root.Flags().BoolP("version", "v", false, "print roostctl's version (roostctl version asks roostd's too)")
	root.SetVersionTemplate(fmt.Sprintf("roostctl %s %s %s\n", version.Version, version.Commit, runtime.Version()))
	root.PersistentFlags().StringVar(&a.socket, "socket", "", "roostd's control socket (default $ROOST_SOCKET, else "+defaultSocket+")")
	root.PersistentFlags().StringVar(&a.server, "server", "", "roostd's remote listener, https://HOST:PORT, instead of the socket (default $ROOST_SERVER)")
	root.PersistentFlags().StringVar(&a.tlsCA, "tls-ca", "", "with --server: the CA that signed roostd's certificate, PEM (default $ROOST_TLS_CA, else the system's)")
	root.PersistentFlags().StringVar(&a.tlsCert, "tls-cert", "", "with --server: this client's certificate, PEM (default $ROOST_TLS_CERT)")
	root.PersistentFlags().StringVar(&a.tlsKey, "tls-key", "", "with --server: this client's private key, PEM (default $ROOST_TLS_KEY)")
	root.SetFlagErrorFunc(flagError)
	root.AddGroup(&cobra.Group{ID: "run", Title: "Running sessions:"}, &cobra.Group{ID: "inspect", Title: "Inspecting:"}, &cobra.Group{ID: "host", Title: "The daemon and host:"})
	for _, c := range []*cobra.Command{a.runCommand(), a.stageCommand(), a.launchCommand(), a.waitCommand(), a.stopCommand(), a.killCommand(), a.pauseCommand(), a.resumeCommand(), a.execCommand(), a.cpCommand(), a.filesCommand(), a.rmCommand(), a.pruneCommand(), a.pushCommand()} {
		c.GroupID = "run"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.psCommand(), a.inspectCommand(), a.logsCommand(), a.statsCommand(), a.eventsCommand(), a.explainCommand(), a.artifactsCommand(), a.spendCommand(), a.fleetCommand()} {
		c.GroupID = "inspect"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.doctorCommand(), a.versionCommand(), certsCommand()} {
		c.GroupID = "host"
		root.AddCommand(c)
	}
	root.SetHelpCommandGroupID("host")
	root.SetCompletionCommandGroupID("host")
	root.SetUsageTemplate(usageTemplate)
	a.completeArgs(root)
	addDockerHelp(root)
	refuseUnknownSubcommands(root)
	return root
}

// refuseUnknownSubcommands makes every group of subcommands without a run of its own (files,
// certs) refuse a word that names none of them: cobra would print the group's help and exit
// 0, which a script takes for success.
func refuseUnknownSubcommands(root *cobra.Command) {
	for _, c := range root.Commands() {
		refuseUnknownSubcommands(c)
		if !c.HasSubCommands() || c.Runnable() {
			continue
		}
		c.Args = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				var names []string
				for _, s := range cmd.Commands() {
					if s.IsAvailableCommand() {
						names = append(names, s.Name())
					}
				}
				return usageError{fmt.Errorf("%s has no command %q (%s); see roostctl %s --help", cmd.Name(), args[0], strings.Join(names, ", "), cmd.Name())}
			}
			return nil
		}
		c.RunE = func(cmd *cobra.Command, args []string) error { return cmd.Help() }
	}
}

// connect dials roostd lazily: commands that fail on their arguments never touch the socket.
func (a *app) connect() (*grpc.ClientConn, error) {
	if a.conn != nil {
		return a.conn, nil
	}
	if a.server == "" && a.socket == "" {
		a.server = os.Getenv("ROOST_SERVER")
	}
	if a.server != "" {
		if a.socket != "" {
			return nil, usageError{errors.New("--socket and --server name two ways to reach roostd: give one")}
		}
		return a.connectRemote()
	}
	for _, f := range []struct{ flag, value string }{{"--tls-ca", a.tlsCA}, {"--tls-cert", a.tlsCert}, {"--tls-key", a.tlsKey}} {
		if f.value != "" {
			return nil, usageError{fmt.Errorf("%s is for roostd's remote listener: give --server https://HOST:PORT too", f.flag)}
		}
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

// connectRemote dials roostd's remote listener over TLS 1.3 with this client's certificate.
func (a *app) connectRemote() (*grpc.ClientConn, error) {
	u, err := url.Parse(a.server)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, usageError{fmt.Errorf("--server %q: expected https://HOST:PORT, roostd's --listen-tcp address", a.server)}
	}
	file := func(flag, env string, value *string) string {
		if *value == "" {
			*value = os.Getenv(env)
			return env
		}
		return flag
	}
	caFrom := file("--tls-ca", "ROOST_TLS_CA", &a.tlsCA)
	certFrom := file("--tls-cert", "ROOST_TLS_CERT", &a.tlsCert)
	keyFrom := file("--tls-key", "ROOST_TLS_KEY", &a.tlsKey)
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, ServerName: u.Hostname()}
	if a.tlsCA != "" {
		pem, err := os.ReadFile(a.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", caFrom, err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s: holds no PEM certificate", caFrom, a.tlsCA)
		}
	}
	switch {
	case a.tlsCert == "" && a.tlsKey == "":
		return nil, usageError{fmt.Errorf("--server %s: roostd lets in only clients with a certificate: give --tls-cert and --tls-key (or ROOST_TLS_CERT and ROOST_TLS_KEY)", a.server)}
	case a.tlsCert == "" || a.tlsKey == "":
		return nil, usageError{errors.New("--tls-cert and --tls-key go together: the certificate and its private key")}
	}
	pair, err := tls.LoadX509KeyPair(a.tlsCert, a.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("%s %s with %s %s: %w", certFrom, a.tlsCert, keyFrom, a.tlsKey, err)
	}
	cfg.Certificates = []tls.Certificate{pair}
	conn, err := grpc.NewClient("dns:///"+u.Host, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
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
