"""roost: a Python client of roostd, over gRPC on its unix socket or its mTLS listener.

    from roost import Roost

    with Roost.connect() as roost:
        with roost.sessions.create(capsule="examples/hello") as s:
            print(s.exec("echo hi").stdout)

The stubs in roost.v1 are generated from api/proto (make sdk-gen).
"""

from roost._client import DEFAULT_SOCKET, Artifacts, ExecHandle, ExecResult, Roost, Session, Sessions
from roost._files import FileInfo, Files, FileType
from roost.errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    RoostError,
    UnauthenticatedError,
    UnavailableError,
)

__all__ = [
    "DEFAULT_SOCKET",
    "AlreadyExistsError",
    "Artifacts",
    "DeadlineExceededError",
    "ExecHandle",
    "ExecResult",
    "FileInfo",
    "FileType",
    "Files",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "Roost",
    "RoostError",
    "Session",
    "Sessions",
    "UnauthenticatedError",
    "UnavailableError",
]
