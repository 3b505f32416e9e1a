"""A real roostd for the tests: started on a temporary state directory and socket, from
$ROOST_BIN (a directory holding roostd and roost-init), else the repository's bin/."""

from __future__ import annotations

import json
import os
import shutil
import socket as socketlib
import subprocess
import tempfile
import time

from roost import Roost, RoostError

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _bin(name: str) -> str:
    return os.path.join(os.environ.get("ROOST_BIN") or os.path.join(REPO, "bin"), name)


def _temp_dir() -> str:
    d = tempfile.mkdtemp(prefix="roost-sdk-py-")
    # Sessions' unprivileged uids pass through the state directory's parent, as /var/lib.
    os.chmod(d, 0o711)
    return d


class Daemon:
    #: The remote listener's address, when started with remote().
    server = ""

    @classmethod
    def remote(cls) -> "Daemon":
        """A roostd with its remote listener on a loopback port, certificates made by roostctl
        certs init: "sdk" an operator's, "viewer" a reader's, "stranger" one of another CA's."""
        d = _temp_dir()
        certs, other = os.path.join(d, "certs"), os.path.join(d, "other")
        for args in (["certs", "init", certs, "--client", "sdk", "--client", "viewer:reader"],
                     ["certs", "init", other, "--client", "stranger"]):
            subprocess.run([_bin("roostctl"), *args], check=True, capture_output=True)
        with socketlib.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = os.path.join(d, "roostd.yaml")
        with open(config, "w") as f:
            f.write(f"remote:\n  listen: 127.0.0.1:{port}\n  tls_cert: {certs}/server.pem\n"
                    f"  tls_key: {certs}/server-key.pem\n  client_ca: {certs}/ca.pem\n  clients:\n"
                    "    - {common_name: sdk, role: operator}\n    - {common_name: viewer, role: reader}\n"
                    "    - {common_name: stranger, role: operator}\n")
        daemon = cls("--config", config, dir=d)
        daemon.server = f"127.0.0.1:{port}"
        return daemon

    def as_client(self, client: str) -> dict:
        """Roost.connect's keywords that reach the remote listener as one of remote()'s clients."""
        where, name = {"sdk": ("certs", "client"), "viewer": ("certs", "viewer"), "stranger": ("other", "client")}[client]
        return {
            "server": self.server,
            "ca": os.path.join(self.dir, "certs", "ca.pem"),
            "cert": os.path.join(self.dir, where, f"{name}.pem"),
            "key": os.path.join(self.dir, where, f"{name}-key.pem"),
        }

    def __init__(self, *args: str, dir: str = ""):
        self.dir = dir or _temp_dir()
        self.socket = os.path.join(self.dir, "roostd.sock")
        self.log = open(os.path.join(self.dir, "roostd.log"), "w+b")
        self.proc = subprocess.Popen(
            [_bin("roostd"), "--state-dir", os.path.join(self.dir, "state"),
             "--socket", self.socket, "--metrics-addr", "", *args],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        try:
            self._await_up()
        except BaseException:
            self.stop()
            raise

    def _await_up(self) -> None:
        until = time.monotonic() + 15
        with Roost.connect(socket=self.socket) as roost:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"roostd exited with {self.proc.returncode}:\n{self.output()}")
                try:
                    roost.version()
                    return
                except RoostError as err:
                    if time.monotonic() > until:
                        raise RuntimeError(f"roostd did not come up ({err}):\n{self.output()}") from None
                time.sleep(0.05)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def capsule(self, name: str, script: str, extra: str = "capabilities:\n  containment: advisory\n") -> str:
        """A capsule directory running script under /bin/sh."""
        d = os.path.join(self.dir, "capsules", name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "capsule.yaml"), "w") as f:
            f.write(f"name: {name}\nversion: 0.1.0\nrun:\n  command: {json.dumps(['/bin/sh', '-c', script])}\n{extra}")
        return d

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()
        self.log.close()
        _unmount_under(self.dir)
        shutil.rmtree(self.dir, ignore_errors=False)


def _unmount_under(d: str) -> None:
    # roostd seals its session trees with binds it leaves for the next roostd; the directory
    # could not be removed with them there (EBUSY).
    with open("/proc/self/mountinfo") as f:
        points = [line.split(" ")[4] for line in f]
    for p in sorted((p for p in points if p == d or p.startswith(d + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", p], check=True)
