package server

import (
	"bytes"
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
	"roost.dev/roost/pkg/containment"
	"roost.dev/roost/pkg/records"
	"roost.dev/roost/pkg/session"
	"roost.dev/roost/pkg/session/exec"
)

// execDetached starts a detached exec and answers its ExecStarted, or the ExecExit of a
// command that could not start. The command runs on after the stream ends.
func (s *sessionService) execDetached(stream roostv1.SessionService_ExecServer, id string, opts containment.ExecOptions) error {
	d, err := s.m.ExecDetached(stream.Context(), id, opts)
	var refused *exec.NotStarted
	if errors.As(err, &refused) {
		return stream.Send(&roostv1.ExecResponse{Msg: &roostv1.ExecResponse_Exit{Exit: &roostv1.ExecExit{ExitCode: int32(refused.Code), Detail: refused.Detail}}})
	}
	if err != nil {
		return err
	}
	return stream.Send(&roostv1.ExecResponse{Msg: &roostv1.ExecResponse_Started{Started: &roostv1.ExecStarted{ExecId: d.ID, Pid: int32(d.Pid), Detached: true}}})
}

func (s *sessionService) AttachExec(req *roostv1.AttachExecRequest, stream grpc.ServerStreamingServer[roostv1.AttachExecResponse]) error {
	opts := records.LogOptions{Follow: req.GetFollow(), Tail: req.Tail, StdoutOffset: req.GetStdoutOffset(), StderrOffset: req.GetStderrOffset()}
	return sendBounded(s.sendTimeout, stream.Send, func(send func(*roostv1.AttachExecResponse) error) error {
		info, err := s.m.AttachExec(stream.Context(), req.GetId(), req.GetExecId(), opts, func(c records.LogChunk) error {
			// The reader reuses its buffer, and the chunk is sent after this returns.
			return send(&roostv1.AttachExecResponse{Msg: &roostv1.AttachExecResponse_Output{Output: &roostv1.ExecOutput{Stream: c.Stream, Data: bytes.Clone(c.Data), Offset: c.Offset}}})
		})
		if err != nil || info.State == exec.Running {
			return err
		}
		code, detail := exec.EndDetail(info.Record)
		return send(&roostv1.AttachExecResponse{Msg: &roostv1.AttachExecResponse_Exit{Exit: &roostv1.ExecExit{ExitCode: int32(code), Detail: detail}}})
	})
}

func (s *sessionService) WaitExec(ctx context.Context, req *roostv1.WaitExecRequest) (*roostv1.WaitExecResponse, error) {
	info, err := s.m.WaitExec(ctx, req.GetId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	return &roostv1.WaitExecResponse{Exec: execInfoProto(info)}, nil
}

func (s *sessionService) KillExec(ctx context.Context, req *roostv1.KillExecRequest) (*roostv1.KillExecResponse, error) {
	sig, err := ParseSignal(req.GetSignal())
	if err != nil {
		return nil, err
	}
	info, err := s.m.KillExec(ctx, req.GetId(), req.GetExecId(), sig)
	if err != nil {
		return nil, err
	}
	return &roostv1.KillExecResponse{Exec: execInfoProto(info)}, nil
}

func (s *sessionService) ListExecs(ctx context.Context, req *roostv1.ListExecsRequest) (*roostv1.ListExecsResponse, error) {
	infos, err := s.m.ListExecs(req.GetId())
	if err != nil {
		return nil, err
	}
	resp := &roostv1.ListExecsResponse{}
	for _, info := range infos {
		resp.Execs = append(resp.Execs, execInfoProto(info))
	}
	return resp, nil
}

// execInfoProto is a detached exec as the API says it.
func execInfoProto(info session.ExecInfo) *roostv1.ExecInfo {
	r := info.Record
	out := &roostv1.ExecInfo{
		ExecId:    r.ID,
		Command:   r.Command,
		State:     info.State,
		StartedAt: timestamppb.New(r.StartedAt),
		Signal:    exec.SignalName(r),
		Detail:    r.Detail,
		Pid:       int32(r.PID),
		Tty:       r.TTY,
	}
	if !r.EndedAt.IsZero() {
		out.EndedAt = timestamppb.New(r.EndedAt)
	}
	if r.Code != nil {
		code := int32(*r.Code)
		out.ExitCode = &code
	}
	if st := info.Logs; st != nil {
		out.Stdout, out.Stderr = logStatsProto(st.MaxBytes, st.Stdout), logStatsProto(st.MaxBytes, st.Stderr)
	}
	return out
}
