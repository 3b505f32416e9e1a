"""Errors of calls to roostd, one class per gRPC status code a caller may act on."""

from __future__ import annotations

import grpc


class RoostError(Exception):
    """Every error a call to roostd ends in.

    ``code`` is the gRPC status code roostd answered with; the message is roostd's own words,
    which name the field, flag or session at fault.
    """

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.UNKNOWN):
        super().__init__(message)
        self.code = code
        self.message = message


class NotFoundError(RoostError):
    """No such session, capsule or file."""


class InvalidArgumentError(RoostError):
    """The request is wrong: a bad capsule, name, path or argument."""


class AlreadyExistsError(RoostError):
    """A name@version or session name already taken."""


class PermissionDeniedError(RoostError):
    """Refused: the caller may not do this."""


class UnauthenticatedError(RoostError):
    """A remote caller without a certificate roostd's client CA signed."""


class ResourceExhaustedError(RoostError):
    """A limit was reached: the machine's token budget, a session's share, a size."""


class FailedPreconditionError(RoostError):
    """The session is not in a state that allows it (not running, still live, ...)."""


class UnavailableError(RoostError):
    """roostd cannot be reached, or went away during the call."""


class DeadlineExceededError(RoostError):
    """The call's own timeout (exec's ``timeout``) ran out."""


_BY_CODE = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
}


def from_rpc(err: grpc.RpcError) -> RoostError:
    """The RoostError for what a gRPC call raised."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return _BY_CODE.get(code, RoostError)(details or str(code), code)
