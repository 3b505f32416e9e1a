package server

import (
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/session/exec"
)

// execChunk bounds one output message: well under the client's default receive limit.
const execChunk = 32 << 10

// execDrainGrace is how long output is still read once the command has ended.
const execDrainGrace = 2 * time.Second

// Exec runs one more command in a running session: the first request names the session and
// the command; later ones carry its stdin, stdin's end, or the terminal's new size. It
// answers ExecStarted, the output, then ExecExit. A command that could not start (refused by
// the exec allowlist, not found) is an ExecExit too, with its detail; a session that is
// missing or not running is an error. With detach it answers ExecStarted alone (see
// execDetached).
func (s *sessionService) Exec(stream roostv1.SessionService_ExecServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return fmt.Errorf("the first exec request must be its start: %w", errdefs.ErrInvalidArgument)
	}
	opts := containment.ExecOptions{
		Argv:  start.GetCommand(),
		Env:   start.GetEnv(),
		Dir:   start.GetCwd(),
		Stdin: start.GetStdin(),
		TTY:   start.GetTty(),
	}
	if size := start.GetSize(); size != nil {
		opts.Rows, opts.Cols = clampSize(size.GetRows()), clampSize(size.GetCols())
	}
	ctx := stream.Context()
	if start.GetDetach() {
		return s.execDetached(stream, start.GetId(), opts)
	}
	x, err := s.m.Exec(ctx, start.GetId(), opts)
	var refused *exec.NotStarted
	if errors.As(err, &refused) {
		return stream.Send(&roostv1.ExecResponse{Msg: &roostv1.ExecResponse_Exit{Exit: &roostv1.ExecExit{ExitCode: int32(refused.Code), Detail: refused.Detail}}})
	}
	if err != nil {
		return err
	}
	if err := stream.Send(&roostv1.ExecResponse{Msg: &roostv1.ExecResponse_Started{Started: &roostv1.ExecStarted{ExecId: x.ID, Pid: int32(x.Pid)}}}); err != nil {
		// The client has gone: the session layer kills the command as ctx ends.
		x.Wait()
		x.Close()
		return err
	}

	// Sends come from the output pumps and, at the end, from here: gRPC allows one sender.
	var sendMu sync.Mutex
	send := func(resp *roostv1.ExecResponse) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(resp)
	}
	var pumps sync.WaitGroup
	pump := func(r io.Reader, msg func([]byte) *roostv1.ExecResponse) {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			buf := make([]byte, execChunk)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					if send(msg(append([]byte(nil), buf[:n]...))) != nil {
						// Nobody reads on: drain, so the command is not blocked on a full pipe.
						_, _ = io.Copy(io.Discard, r)
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
	stdout := func(b []byte) *roostv1.ExecResponse {
		return &roostv1.ExecResponse{Msg: &roostv1.ExecResponse_Stdout{Stdout: b}}
	}
	stderr := func(b []byte) *roostv1.ExecResponse {
		return &roostv1.ExecResponse{Msg: &roostv1.ExecResponse_Stderr{Stderr: b}}
	}
	var stdin io.WriteCloser
	if x.Terminal != nil {
		pump(x.Terminal, stdout)
		if opts.Stdin {
			stdin = x.Terminal
		}
	} else {
		pump(x.Stdout, stdout)
		pump(x.Stderr, stderr)
		stdin = x.Stdin
	}
	go s.execInput(stream, x, stdin)

	code, detail := x.Wait()
	// Its output is read to the end, unless something it left behind (in a session without a
	// pid namespace of its own) holds the pipes open: that is cut off after a grace.
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(execDrainGrace):
	}
	x.Close()
	<-drained
	return send(&roostv1.ExecResponse{Msg: &roostv1.ExecResponse_Exit{Exit: &roostv1.ExecExit{ExitCode: int32(code), Detail: detail}}})
}

// execInput carries the client's stdin and terminal sizes to the command until the client
// has no more to send. A terminal's input never closes (its end would hang it up): an end
// of stdin there is the terminal's end-of-file character, as a typist's ^D.
func (s *sessionService) execInput(stream roostv1.SessionService_ExecServer, x *exec.Exec, stdin io.WriteCloser) {
	for {
		req, err := stream.Recv()
		if err != nil {
			if stdin != nil && x.Terminal == nil {
				stdin.Close()
			}
			return
		}
		switch m := req.GetMsg().(type) {
		case *roostv1.ExecRequest_Stdin:
			if stdin != nil {
				// A command that stopped reading: what it did not read is dropped.
				_, _ = stdin.Write(m.Stdin)
			}
		case *roostv1.ExecRequest_CloseStdin:
			if stdin == nil {
				continue
			}
			if x.Terminal != nil {
				_, _ = stdin.Write([]byte{4})
				continue
			}
			stdin.Close()
			stdin = nil
		case *roostv1.ExecRequest_Resize:
			_ = x.Resize(clampSize(m.Resize.GetRows()), clampSize(m.Resize.GetCols()))
		}
	}
}

// clampSize fits a terminal dimension in the kernel's 16 bits.
func clampSize(v uint32) uint16 { return uint16(min(v, math.MaxUint16)) }
