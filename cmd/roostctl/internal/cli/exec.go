package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func (a *app) execCommand() *cobra.Command {
	var opts struct {
		interactive, tty, raw, detach bool
		env                           []string
		workdir                       string
	}
	cmd := &cobra.Command{
		Use:   "exec [flags] SESSION -- COMMAND [ARG...]",
		Short: "Run a command inside a running session",
		Long: `exec runs one more command inside a running session, with exactly the session's
containment: its namespaces, cgroup, uid, seccomp filter, capabilities, Landlock rules and
exec allowlist (shell.allow). A command the allowlist refuses does not run (exit 126); one
that cannot be found does not either (127). A paused session must be resumed first.
The command starts in the session's workdir, with the session's environment; roostctl
exits with its code (128+N when signal N ended it), or 1 when it could not be run at all;
exec's own usage errors (an unknown flag, no SESSION or COMMAND) exit 125, as run's do.
Each exec is recorded in the session's events and its trace.
With -d the command runs in the background: exec prints its exec id and returns, the
command's stdin is empty, and its output is kept in the session's records (each stream
held to a sixty-fourth of resources.log_max_bytes, at least 64 KiB: its first bytes and its
newest). exec attach follows it, exec wait waits for its end, exec kill signals it, exec ls
lists them. A session runs at most 64 detached execs at once; they end with the session,
and with roostd (one running when roostd stopped is listed as lost). A session named attach,
wait, kill or ls is given to exec by its id.
On a terminal, control characters in the command's output other than newline, tab and
carriage return (escape sequences that would set the clipboard or the window title, clear
or move about the screen) are shown as text, \x1b for ESC; --raw passes them through as
they are. With -t they always pass: a command given a terminal of its own draws on yours
(a shell's line editing, an editor's screen). Piped or redirected, the output is always
the command's bytes as they are.`,
		Example: `  roostctl exec ses_0193 -- ls -la
  roostctl exec -w src -e DEBUG=1 ses_0193 -- make test
  roostctl exec -i ses_0193 -- sh -c 'wc -l' < notes.txt
  roostctl exec -it ses_0193 -- sh
  roostctl exec -d ses_0193 -- make test     # prints exec_4f2a9c01b7de
  roostctl exec attach --from-start ses_0193 exec_4f2a9c01b7de`,
		Args: minArgs(2, "a SESSION and a COMMAND"),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Flags stop at SESSION, so a "--" after it is still an argument here.
			argv := args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return usageError{errors.New("exec takes a COMMAND after SESSION; see roostctl exec --help")}
			}
			if opts.detach {
				if opts.interactive {
					return usageError{errors.New("exec -d takes no -i: a detached command's stdin is empty")}
				}
				if err := checkEnv(opts.env); err != nil {
					return err
				}
				start := &roostv1.ExecStart{Id: args[0], Command: argv, Tty: opts.tty, Env: opts.env, Cwd: opts.workdir}
				if opts.tty {
					start.Size = terminalSize()
				}
				return a.execDetach(cmd.Context(), cmd.OutOrStdout(), start)
			}
			return a.exec(cmd.Context(), args[0], argv, execFlags{
				stdin: opts.interactive, tty: opts.tty, raw: opts.raw, env: opts.env, workdir: opts.workdir,
			})
		},
	}
	// Flags after SESSION belong to the command: roostctl exec S ls -la.
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().BoolVarP(&opts.interactive, "interactive", "i", false, "keep stdin open and send it to the command")
	cmd.Flags().BoolVarP(&opts.tty, "tty", "t", false, "run the command on a terminal of its own (output then comes on stdout)")
	cmd.Flags().BoolVar(&opts.raw, "raw", false, "on a terminal, pass control characters and escape sequences through rather than show them as text (always so with -t)")
	cmd.Flags().StringArrayVarP(&opts.env, "env", "e", nil, "set NAME=VALUE over the session's environment (repeatable)")
	cmd.Flags().StringVarP(&opts.workdir, "workdir", "w", "", "working directory in the session's view (default its workdir)")
	cmd.Flags().BoolVarP(&opts.detach, "detach", "d", false, "run the command in the background and print its exec id (see exec attach, wait, kill, ls)")
	cmd.AddCommand(a.execSubcommands()...)
	return cmd
}

type execFlags struct {
	stdin, tty, raw bool
	env             []string
	workdir         string
}

// exec runs the command and returns its exit code as roostctl's.
func (a *app) exec(ctx context.Context, id string, argv []string, f execFlags) error {
	if err := checkEnv(f.env); err != nil {
		return err
	}
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
	// Sends come from the stdin copier, the resize watcher and here: gRPC allows one sender.
	var sendMu sync.Mutex
	send := func(req *roostv1.ExecRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(req)
	}

	in := int(os.Stdin.Fd())
	local := f.tty && term.IsTerminal(in)
	start := &roostv1.ExecStart{Id: id, Command: argv, Stdin: f.stdin, Tty: f.tty, Env: f.env, Cwd: f.workdir}
	if f.tty {
		start.Size = terminalSize()
	}
	if err := send(&roostv1.ExecRequest{Msg: &roostv1.ExecRequest_Start{Start: start}}); err != nil {
		return recvErr(stream, err)
	}
	if !f.stdin && !f.tty {
		// Nothing more to say: stdin stays empty, and no terminal resizes.
		_ = stream.CloseSend()
	}

	// With -t the command draws on the local terminal: its escapes are the point.
	stdout, flushOut := sessionOutput(os.Stdout, f.raw || f.tty)
	stderr, flushErr := sessionOutput(os.Stderr, f.raw || f.tty)
	defer func() {
		_ = flushOut()
		_ = flushErr()
	}()
	started := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("roostd ended the exec without saying how the command ended")
			}
			return err
		}
		switch m := resp.GetMsg().(type) {
		case *roostv1.ExecResponse_Started:
			if started {
				continue
			}
			started = true
			if local {
				// Keys go to the command as typed (^C included): its terminal interprets them.
				state, err := term.MakeRaw(in)
				if err == nil {
					defer term.Restore(in, state)
				}
				stopResize := watchResize(send)
				defer stopResize()
			}
			if f.stdin {
				go copyStdin(send)
			}
		case *roostv1.ExecResponse_Stdout:
			_, _ = stdout.Write(m.Stdout)
		case *roostv1.ExecResponse_Stderr:
			_, _ = stderr.Write(m.Stderr)
		case *roostv1.ExecResponse_Exit:
			code := int(m.Exit.GetExitCode())
			if !started {
				// It never ran: the detail says why (refused by shell.allow, not found).
				return withCode(max(code, exitFailure), errors.New(m.Exit.GetDetail()))
			}
			return withCode(code, nil)
		}
	}
}

// checkEnv refuses an -e that is not NAME=VALUE.
func checkEnv(env []string) error {
	for _, kv := range env {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			return usageError{fmt.Errorf("-e %q: want NAME=VALUE", kv)}
		}
	}
	return nil
}

// recvErr is the error that ended a stream whose send failed: gRPC reports the reason on
// the receiving side.
func recvErr(stream roostv1.SessionService_ExecClient, sendErr error) error {
	if _, err := stream.Recv(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return sendErr
}

// copyStdin sends roostctl's stdin to the command, then its end.
func copyStdin(send func(*roostv1.ExecRequest) error) {
	buf := make([]byte, 32<<10)
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 {
			if send(&roostv1.ExecRequest{Msg: &roostv1.ExecRequest_Stdin{Stdin: append([]byte(nil), buf[:n]...)}}) != nil {
				return
			}
		}
		if err != nil {
			_ = send(&roostv1.ExecRequest{Msg: &roostv1.ExecRequest_CloseStdin{CloseStdin: true}})
			return
		}
	}
}

// terminalSize is the local terminal's size (stdin's, else stdout's); nil when neither is
// one.
func terminalSize() *roostv1.TerminalSize {
	for _, fd := range []int{int(os.Stdin.Fd()), int(os.Stdout.Fd())} {
		if cols, rows, err := term.GetSize(fd); err == nil && rows > 0 && cols > 0 {
			return &roostv1.TerminalSize{Rows: uint32(rows), Cols: uint32(cols)}
		}
	}
	return nil
}

// watchResize sends the local terminal's new size on every SIGWINCH until stopped.
func watchResize(send func(*roostv1.ExecRequest) error) (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-sigs:
				if size := terminalSize(); size != nil {
					_ = send(&roostv1.ExecRequest{Msg: &roostv1.ExecRequest_Resize{Resize: size}})
				}
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
	}
}
