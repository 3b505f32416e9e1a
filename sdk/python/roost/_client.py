"""The facade over roostd's generated gRPC stubs (roost.v1)."""

from __future__ import annotations

import codecs
import contextlib
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Optional, Sequence, Union

import grpc
from google.protobuf import duration_pb2

from roost._files import Files
from roost.errors import FailedPreconditionError, RoostError, from_rpc
from roost.v1 import (
    artifact_pb2,
    artifact_pb2_grpc,
    files_pb2,
    files_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    system_pb2,
    system_pb2_grpc,
)

#: The socket roostd listens on by default (roostd --socket).
DEFAULT_SOCKET = "/run/roost/roostd.sock"

#: A PEM file's path, or its contents as bytes.
Pem = Union[str, os.PathLike, bytes]


@contextlib.contextmanager
def _rpc() -> Iterator[None]:
    try:
        yield
    except grpc.RpcError as err:
        raise from_rpc(err) from None


def _pem(what: str, value: Optional[Pem]) -> bytes:
    if value is None:
        raise ValueError(f"Roost.connect: server is set, so {what} is required (a PEM file's path or its contents)")
    if isinstance(value, bytes):
        return value
    try:
        with open(value, "rb") as f:
            return f.read()
    except OSError as err:
        raise ValueError(f"Roost.connect: {what}: {err}") from None


def _streamed(fn: Optional[Callable[[str], None]]) -> Callable[[bytes], None]:
    """A callback of text over one stream's bytes: a character split between two chunks is
    passed whole, with the second."""
    if fn is None:
        return lambda chunk: None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(chunk: bytes) -> None:
        data = decoder.decode(chunk)
        if data:
            fn(data)

    return feed


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


@dataclass
class ExecResult:
    """What a command exec'd in a session did."""

    #: The command's exit code; 128+N when signal N ended it.
    exit_code: int
    stdout: str
    stderr: str
    #: stdout and stderr as they arrived, interleaved.
    output: str
    #: In words: "exited with code 3", "refused by shell.allow: ...".
    detail: str
    #: The exec's id in the session's events and trace; empty when it never started.
    exec_id: str


class Roost:
    """One connection to roostd.

    ``Roost.connect()`` opens nothing yet: the first call does, and raises UnavailableError
    when roostd cannot be reached. Used as a context manager it closes on exit.
    """

    def __init__(self, channel: grpc.Channel, local: bool):
        self._channel = channel
        self._local = local
        self._sessions = session_pb2_grpc.SessionServiceStub(channel)
        self._system = system_pb2_grpc.SystemServiceStub(channel)
        self._artifacts = artifact_pb2_grpc.ArtifactServiceStub(channel)
        self._files = files_pb2_grpc.FilesServiceStub(channel)
        self.sessions = Sessions(self)
        self.artifacts = Artifacts(self)

    @classmethod
    def connect(
        cls,
        socket: Optional[str] = None,
        server: Optional[str] = None,
        ca: Optional[Pem] = None,
        cert: Optional[Pem] = None,
        key: Optional[Pem] = None,
    ) -> "Roost":
        """Connect to roostd's unix socket (``socket``: $ROOST_SOCKET, else
        /run/roost/roostd.sock) or to its remote listener (``server``, "host:port", over TLS
        with the client certificate ``cert`` and ``key``, trusting ``ca``)."""
        if server:
            ca_pem, cert_pem, key_pem = _pem("ca", ca), _pem("cert", cert), _pem("key", key)
            creds = grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem)
            return cls(grpc.secure_channel(server.removeprefix("https://"), creds), local=False)
        path = socket or os.environ.get("ROOST_SOCKET") or DEFAULT_SOCKET
        return cls(grpc.insecure_channel("unix:" + path), local=True)

    def version(self) -> system_pb2.VersionResponse:
        """roostd's version and API version."""
        with _rpc():
            return self._system.Version(system_pb2.VersionRequest())

    def close(self) -> None:
        """End the connection; calls in flight fail."""
        self._channel.close()

    def __enter__(self) -> "Roost":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _capsule_ref(self, capsule: Union[str, os.PathLike]) -> str:
        capsule = os.fspath(capsule)
        if not capsule:
            raise ValueError("sessions.create: capsule is required (a directory or name@version)")
        if not self._local or ("@" in capsule and "/" not in capsule and not os.path.exists(capsule)):
            return capsule
        # roostd has another working directory; links of this user's own on the way are
        # resolved here, as roostctl does, since roostd follows only root's.
        return os.path.realpath(capsule)


class Sessions:
    def __init__(self, roost: Roost):
        self._roost = roost

    def create(
        self,
        capsule: Union[str, os.PathLike],
        name: str = "",
        workdir: str = "",
        deadline: Optional[float] = None,
        containment: str = "",
        memory_bytes: int = 0,
        labels: Optional[Mapping[str, str]] = None,
    ) -> "Session":
        """Stage the capsule and launch it.

        ``capsule`` is a capsule directory (or its capsule.yaml) on roostd's host, or a
        pushed capsule's name@version; over the unix socket a relative path is taken from
        this process's working directory. ``deadline`` (seconds) lowers the capsule's own;
        ``containment`` raises its floor; ``memory_bytes`` lowers its cgroup's ceiling;
        ``labels`` are kept in the session's record, for ``list`` to select by. The
        session returned is running (or, when its program could not start, ended: see
        ``state`` and ``record.detail``).
        """
        req = session_pb2.StageRequest(
            capsule=self._roost._capsule_ref(capsule),
            name=name,
            workdir=workdir,
            containment=containment,
            memory_bytes=memory_bytes,
            labels=labels or {},
        )
        if deadline is not None:
            req.deadline.CopyFrom(_duration(deadline))
        rpc = self._roost._sessions
        with _rpc():
            staged = rpc.Stage(req).session
            launched = rpc.Launch(session_pb2.LaunchRequest(id=staged.id)).session
        return Session(self._roost, launched)

    def get(self, id: str) -> "Session":
        """One session by id, unique id prefix or name."""
        with _rpc():
            return Session(self._roost, self._roost._sessions.Get(session_pb2.GetRequest(id=id)).session)

    def list(self, all: bool = False, labels: Optional[Mapping[str, str]] = None) -> list["Session"]:
        """The staged and live sessions, or every one with ``all``; with ``labels`` only those
        whose labels hold every one given (a key given "" must be there, with any value)."""
        selectors = [k if v == "" else f"{k}={v}" for k, v in (labels or {}).items()]
        with _rpc():
            res = self._roost._sessions.List(session_pb2.ListRequest(all=all, label=selectors))
        return [Session(self._roost, s) for s in res.sessions]


class Artifacts:
    def __init__(self, roost: Roost):
        self._roost = roost

    def push(self, dir: Union[str, os.PathLike]) -> artifact_pb2.Artifact:
        """Store a capsule directory on roostd's host under its manifest's name@version."""
        with _rpc():
            return self._roost._artifacts.Push(artifact_pb2.PushRequest(path=self._roost._capsule_ref(dir))).artifact

    def list(self) -> list[artifact_pb2.Artifact]:
        with _rpc():
            return list(self._roost._artifacts.ListArtifacts(artifact_pb2.ListArtifactsRequest()).artifacts)

    def remove(self, ref: str) -> artifact_pb2.Artifact:
        with _rpc():
            return self._roost._artifacts.RemoveArtifact(artifact_pb2.RemoveArtifactRequest(ref=ref)).artifact


class Session:
    """One session of roostd's.

    ``record`` is its last record seen (the message ``roostctl inspect --json`` prints); the
    methods that change it update it. Used as a context manager, the session is removed on
    exit, killed first when still live.
    """

    def __init__(self, roost: Roost, record: session_pb2.Session):
        self._roost = roost
        self.record = record
        #: The files of the session's workdir.
        self.files = Files(roost._files, record.id, _rpc)

    def __repr__(self) -> str:
        return f"Session({self.id!r}, state={self.state!r})"

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def state(self) -> str:
        """staged | launching | running | paused | stopping | exited"""
        return self.record.state

    @property
    def labels(self) -> dict[str, str]:
        """The labels given at stage."""
        return dict(self.record.labels)

    @property
    def exit_code(self) -> Optional[int]:
        """The program's exit code once it has ended; None before."""
        return self.record.exit_code if self.record.HasField("exit_code") else None

    @property
    def _rpc(self) -> session_pb2_grpc.SessionServiceStub:
        return self._roost._sessions

    def refresh(self) -> "Session":
        """Read the session's record again."""
        with _rpc():
            self.record = self._rpc.Get(session_pb2.GetRequest(id=self.id)).session
        return self

    def exec(
        self,
        cmd: Union[str, Sequence[str]],
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: str = "",
        stdin: Union[str, bytes, None] = None,
        background: bool = False,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
    ) -> Union[ExecResult, "ExecHandle"]:
        """Run a command in the running session, with exactly its containment.

        A string is run by /bin/sh -c (which the capsule's exec allowlist must let run); a
        list is argv. ``timeout`` is in seconds: past it roostd kills the command and
        DeadlineExceededError is raised. A non-zero exit is a result, not an error.

        ``on_stdout`` and ``on_stderr`` are called with the command's output as it arrives,
        chunk by chunk, before exec returns.

        With ``background`` it returns an ExecHandle once the command has started, and the
        command runs on, its output kept in the session's records; it reads no stdin, and
        ``timeout`` does not apply.
        """
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("exec: the command is empty")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        start = session_pb2.ExecStart(
            id=self.id,
            command=argv,
            env=[f"{k}={v}" for k, v in (env or {}).items()],
            cwd=cwd,
            stdin=data is not None,
            detach=background,
        )

        def requests() -> Iterator[session_pb2.ExecRequest]:
            yield session_pb2.ExecRequest(start=start)
            if data:
                yield session_pb2.ExecRequest(stdin=data)
            # The end of the requests closes the command's stdin.

        out, err, both = bytearray(), bytearray(), bytearray()
        exec_id, exit_msg = "", None
        stdout_cb, stderr_cb = _streamed(on_stdout), _streamed(on_stderr)
        with _rpc():
            for r in self._rpc.Exec(requests(), timeout=timeout):
                kind = r.WhichOneof("msg")
                if kind == "started":
                    exec_id = r.started.exec_id
                elif kind == "stdout":
                    out += r.stdout
                    both += r.stdout
                    stdout_cb(r.stdout)
                elif kind == "stderr":
                    err += r.stderr
                    both += r.stderr
                    stderr_cb(r.stderr)
                elif kind == "exit":
                    exit_msg = r.exit
        if background and (exec_id or exit_msg is not None):
            # A command that could not start (refused, not found) is a handle already ended.
            refused = None
            if exit_msg is not None:
                refused = ExecResult(exit_msg.exit_code, "", "", "", exit_msg.detail, exec_id)
            return ExecHandle(self._roost, self.id, exec_id, refused)
        if exit_msg is None:
            raise RoostError(f"exec in {self.id}: the stream ended without the command's exit")
        return ExecResult(
            exit_code=exit_msg.exit_code,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            output=both.decode(errors="replace"),
            detail=exit_msg.detail,
            exec_id=exec_id,
        )

    def attach_exec(self, exec_id: str) -> "ExecHandle":
        """A handle on one of the session's background execs by its id (an ExecHandle's
        exec_id, one of execs(), or one another client started): its wait re-attaches to the
        command's output, from an offset when given, and follows it to its end."""
        if not exec_id:
            raise ValueError("attach_exec: the exec's id is required")
        return ExecHandle(self._roost, self.id, exec_id, None)

    def execs(self) -> list[session_pb2.ExecInfo]:
        """The session's background execs, live and ended, oldest first."""
        with _rpc():
            return list(self._rpc.ListExecs(session_pb2.ListExecsRequest(id=self.id)).execs)

    def upload(self, local_dir: Union[str, os.PathLike], to: str = ".") -> files_pb2.UploadTreeResponse:
        """Copy a local directory's tree into the workdir's directory ``to``; see Files.upload."""
        return self.files.upload(local_dir, to)

    def download(self, path: str, local_dir: Union[str, os.PathLike]) -> None:
        """Copy the workdir's entry ``path`` into ``local_dir``; see Files.download."""
        self.files.download(path, local_dir)

    def wait(self) -> session_pb2.Session:
        """Block until the session has ended; its final record."""
        with _rpc():
            self.record = self._rpc.Wait(session_pb2.WaitRequest(id=self.id)).session
        return self.record

    def kill(self, signal: str = "") -> session_pb2.Session:
        """Send a signal (SIGKILL by default) to every process of the session."""
        with _rpc():
            self.record = self._rpc.Kill(session_pb2.KillRequest(id=self.id, signal=signal)).session
        return self.record

    def stop(self, grace: Optional[float] = None) -> session_pb2.Session:
        """SIGTERM, then SIGKILL after ``grace`` seconds (10 by default)."""
        req = session_pb2.StopRequest(id=self.id)
        if grace is not None:
            req.grace.CopyFrom(_duration(grace))
        with _rpc():
            self.record = self._rpc.Stop(req).session
        return self.record

    def pause(self) -> session_pb2.Session:
        with _rpc():
            self.record = self._rpc.Pause(session_pb2.PauseRequest(id=self.id)).session
        return self.record

    def resume(self) -> session_pb2.Session:
        with _rpc():
            self.record = self._rpc.Resume(session_pb2.ResumeRequest(id=self.id)).session
        return self.record

    def remove(self, force: bool = False) -> None:
        """Forget an ended session and delete its records, home and roost-made workdir; with
        ``force`` a live one is killed first."""
        with _rpc():
            self._rpc.Remove(session_pb2.RemoveRequest(id=self.id, force=force))

    def logs(self) -> tuple[str, str]:
        """What the session's program has written so far: (stdout, stderr)."""
        out, err = bytearray(), bytearray()
        with _rpc():
            for r in self._rpc.Logs(session_pb2.LogsRequest(id=self.id)):
                (err if r.stream == "stderr" else out).extend(r.data)
        return out.decode(errors="replace"), err.decode(errors="replace")

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.remove(force=True)


class ExecHandle:
    """A command exec'd in the background (exec's ``background``): it runs on whether or not
    anyone waits for it."""

    def __init__(self, roost: Roost, session_id: str, exec_id: str, refused: Optional[ExecResult]):
        self._roost = roost
        #: The session it runs in.
        self.session_id = session_id
        #: Its id in the session's events, trace and records; empty when it never started.
        self.exec_id = exec_id
        self._refused = refused

    def __repr__(self) -> str:
        return f"ExecHandle({self.session_id!r}, {self.exec_id!r})"

    def wait(
        self,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
    ) -> ExecResult:
        """Block until the command has ended; what exec returns: its exit and all its output
        the records kept.

        It attaches to the command's output, so ``on_stdout`` and ``on_stderr`` see it as it
        is written. ``stdout_offset`` and ``stderr_offset`` resume: only each stream's bytes
        from that offset on (the bytes of it already received), in the result too.
        """
        if self._refused is not None:
            return self._refused
        out, err, both = bytearray(), bytearray(), bytearray()
        exit_msg = None
        stdout_cb, stderr_cb = _streamed(on_stdout), _streamed(on_stderr)
        req = session_pb2.AttachExecRequest(
            id=self.session_id,
            exec_id=self.exec_id,
            follow=True,
            stdout_offset=stdout_offset,
            stderr_offset=stderr_offset,
        )
        with _rpc():
            for r in self._roost._sessions.AttachExec(req):
                if r.WhichOneof("msg") == "output":
                    is_err = r.output.stream == "stderr"
                    (err if is_err else out).extend(r.output.data)
                    both.extend(r.output.data)
                    (stderr_cb if is_err else stdout_cb)(r.output.data)
                elif r.WhichOneof("msg") == "exit":
                    exit_msg = r.exit
        if exit_msg is None:
            raise RoostError(f"exec {self.exec_id} in {self.session_id}: the stream ended without the command's exit")
        return ExecResult(
            exit_code=exit_msg.exit_code,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            output=both.decode(errors="replace"),
            detail=exit_msg.detail,
            exec_id=self.exec_id,
        )

    def kill(self, signal: str = "") -> session_pb2.ExecInfo:
        """Send a signal (SIGKILL by default) to the command and all it started."""
        if self._refused is not None:
            raise FailedPreconditionError(
                f"exec in {self.session_id} never started: {self._refused.detail}", grpc.StatusCode.FAILED_PRECONDITION
            )
        with _rpc():
            req = session_pb2.KillExecRequest(id=self.session_id, exec_id=self.exec_id, signal=signal)
            return self._roost._sessions.KillExec(req).exec
