"""The files of a session's workdir (FilesService)."""

from __future__ import annotations

import io
import os
import tarfile
from typing import Iterator, Union

from roost.errors import NotFoundError
from roost.v1 import files_pb2, files_pb2_grpc

# One data message: well under roostd's default max_recv_message_bytes.
_CHUNK = 256 << 10

FileInfo = files_pb2.FileInfo
FileType = files_pb2.FileType


def _chunks(data: bytes) -> Iterator[bytes]:
    for i in range(0, len(data), _CHUNK):
        yield data[i : i + _CHUNK]


class Files:
    """The files of one session's workdir, live or ended (an ended session's are read-only).

    Every path is relative to the workdir; roostd refuses one that is absolute, climbs out
    with "..", or passes through a symlink.
    """

    def __init__(self, stub: files_pb2_grpc.FilesServiceStub, session: str, rpc):
        self._stub = stub
        self._session = session
        self._rpc = rpc

    def write(self, path: str, data: Union[str, bytes], mode: int = 0, create_only: bool = False) -> FileInfo:
        """Put data at path (its directory must exist), replacing the file whole."""
        body = data.encode() if isinstance(data, str) else data
        header = files_pb2.WriteFileHeader(session=self._session, path=path, mode=mode, create_only=create_only)

        def requests():
            yield files_pb2.WriteFileRequest(header=header)
            for c in _chunks(body):
                yield files_pb2.WriteFileRequest(data=c)

        with self._rpc():
            return self._stub.WriteFile(requests()).info

    def read_bytes(self, path: str, offset: int = 0, length: int = 0) -> bytes:
        """A regular file's bytes, from offset for length bytes (all by default)."""
        out = bytearray()
        with self._rpc():
            for r in self._stub.ReadFile(files_pb2.ReadFileRequest(session=self._session, path=path, offset=offset, length=length)):
                out += r.data
        return bytes(out)

    def read(self, path: str) -> str:
        """A regular file's contents as UTF-8 text."""
        return self.read_bytes(path).decode()

    def list(self, path: str = ".") -> list[FileInfo]:
        """A directory's entries (without "." and ".."), every page of them."""
        out, token = [], ""
        while True:
            with self._rpc():
                res = self._stub.ListDir(files_pb2.ListDirRequest(session=self._session, path=path, page_token=token))
            out.extend(res.entries)
            token = res.next_page_token
            if not token:
                return out

    def stat(self, path: str) -> FileInfo:
        """One entry; a symlink is described, not followed."""
        with self._rpc():
            return self._stub.StatFile(files_pb2.StatFileRequest(session=self._session, path=path)).info

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except NotFoundError:
            return False

    def remove(self, path: str, recursive: bool = False) -> None:
        """Remove a file, a symlink, an empty directory, or with recursive a tree."""
        with self._rpc():
            self._stub.RemoveFile(files_pb2.RemoveFileRequest(session=self._session, path=path, recursive=recursive))

    def mkdir(self, path: str, parents: bool = False, mode: int = 0) -> None:
        """Make a directory; with parents the missing ones above it, and an existing one is no error."""
        with self._rpc():
            self._stub.MakeDir(files_pb2.MakeDirRequest(session=self._session, path=path, parents=parents, mode=mode))

    def upload(self, local_dir: Union[str, os.PathLike], to: str = ".") -> files_pb2.UploadTreeResponse:
        """Copy a local directory's tree into the workdir's directory ``to`` (made when missing)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for entry in sorted(os.listdir(local_dir)):
                tar.add(os.path.join(local_dir, entry), arcname=entry)
        header = files_pb2.UploadTreeHeader(session=self._session, path=to)

        def requests():
            yield files_pb2.UploadTreeRequest(header=header)
            for c in _chunks(buf.getvalue()):
                yield files_pb2.UploadTreeRequest(data=c)

        with self._rpc():
            return self._stub.UploadTree(requests())

    def archive(self, path: str = ".") -> Iterator[bytes]:
        """The workdir's entry ``path`` (a directory's tree, or one file; the whole workdir by
        default) as a tar stream, chunk by chunk as roostd writes it: directories, regular
        files and symlinks, named relative to the directory (its own entry left out), or one
        file by its base name. Its file data are bounded by resources.workdir_max_bytes."""
        with self._rpc():
            for r in self._stub.DownloadTree(files_pb2.DownloadTreeRequest(session=self._session, path=path)):
                yield r.data

    def download(self, path: str, local_dir: Union[str, os.PathLike]) -> None:
        """Copy the workdir's entry ``path`` (a directory's tree, or one file) into
        ``local_dir`` (made when missing). Only directories, regular files and symlinks are
        made, with neither owners nor setuid bits; an entry named absolute or climbing out
        with "..", or whose way passes through a symlink, is refused."""
        buf = io.BytesIO()
        with self._rpc():
            for r in self._stub.DownloadTree(files_pb2.DownloadTreeRequest(session=self._session, path=path)):
                buf.write(r.data)
        buf.seek(0)
        _extract(buf, os.fspath(local_dir))


def _extract(archive: io.BytesIO, dest: str) -> None:
    os.makedirs(dest, exist_ok=True)
    root = os.path.realpath(dest)
    with tarfile.open(fileobj=archive, mode="r:") as tar:
        for m in tar:
            name = os.path.normpath(m.name)
            if os.path.isabs(m.name) or name == ".." or name.startswith("../"):
                raise ValueError(f"download: the archive's entry {m.name!r} climbs out of {dest}")
            target = os.path.join(root, name)
            # No entry may reach beyond dest through a link an earlier entry made: root is
            # resolved, so a link anywhere on the way makes the parent resolve elsewhere.
            parent = os.path.dirname(target)
            if os.path.realpath(parent) != parent:
                raise ValueError(f"download: the archive's entry {m.name!r} passes through a symlink")
            os.makedirs(parent, mode=0o755, exist_ok=True)
            if os.path.islink(target) and not m.issym():
                os.remove(target)
            if m.isdir():
                os.makedirs(target, mode=0o700, exist_ok=True)
                if target != root:
                    os.chmod(target, m.mode & 0o777)
            elif m.isreg():
                with tar.extractfile(m) as src, open(target, "wb") as dst:
                    dst.write(src.read())
                os.chmod(target, m.mode & 0o777)
            elif m.issym():
                if os.path.lexists(target):
                    os.remove(target)
                os.symlink(m.linkname, target)
