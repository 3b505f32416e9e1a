package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ToStatus is the one place an error becomes a gRPC status: its errdefs class picks the
// code, and the class's own words are trimmed from the message (the code already says it).
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Unknown
	switch {
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errdefs.IsInvalidArgument(err):
		code = codes.InvalidArgument
	case errdefs.IsNotFound(err):
		code = codes.NotFound
	case errdefs.IsAlreadyExists(err):
		code = codes.AlreadyExists
	case errdefs.IsPermissionDenied(err):
		code = codes.PermissionDenied
	case errdefs.IsResourceExhausted(err):
		code = codes.ResourceExhausted
	case errdefs.IsFailedPrecondition(err), errdefs.IsConflict(err):
		code = codes.FailedPrecondition
	case errdefs.IsUnavailable(err):
		code = codes.Unavailable
	case errdefs.IsNotImplemented(err):
		code = codes.Unimplemented
	case errdefs.IsDataLoss(err):
		code = codes.DataLoss
	case errdefs.IsInternal(err):
		code = codes.Internal
	}
	msg := err.Error()
	if cls := errdefs.Resolve(err); cls != errdefs.ErrUnknown {
		msg = strings.TrimSuffix(msg, ": "+cls.Error())
	}
	return status.Error(code, msg)
}

// Interceptors map every error through ToStatus and turn a panic into an Internal error,
// so no input can take the daemon down.
func unaryInterceptor(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer recoverPanic(log, info.FullMethod, &err)
		resp, err = handler(ctx, req)
		return resp, ToStatus(err)
	}
}

func streamInterceptor(log *slog.Logger, streams *streamSet) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer recoverPanic(log, info.FullMethod, &err)
		ctx, release, err := streams.track(ss.Context(), info.FullMethod, clientOf(ss.Context()))
		defer release()
		if err != nil {
			return ToStatus(err)
		}
		err = handler(srv, &drainedStream{ServerStream: ss, ctx: ctx})
		// Ended by Shutdown, not by its client or its own end: say so with the code
		// followers resume on, not Canceled.
		if err != nil && errors.Is(context.Cause(ctx), errShuttingDown) {
			return shuttingDown
		}
		return ToStatus(err)
	}
}

func recoverPanic(log *slog.Logger, method string, err *error) {
	if r := recover(); r != nil {
		log.Error("panic in RPC", "method", method, "panic", r, "stack", string(debug.Stack()))
		*err = status.Error(codes.Internal, fmt.Sprintf("roostd failed handling %s: %v", method, r))
	}
}
