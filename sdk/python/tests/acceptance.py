"""The SDK's acceptance over roostd's remote listener, run as a client on another host (or
network namespace: TestSDKRemote in test/e2e runs it so).

Through the facade alone it creates a sealed session with labels, writes a file, execs a
command reading it with its output streamed, downloads the workdir as a tar, lists sessions
by label, detaches an exec and re-attaches to it from an offset, and removes the session;
then it is refused without a certificate (the SDK's own check, and a raw TLS handshake),
with another CA's, and as a reader calling Kill. It prints one JSON line per step,
{"step", "ok", ...what it saw}, and stops at the first step that fails, exiting 1.

Environment: ROOST_SERVER (https://host:port), ROOST_CA, ROOST_CERT and ROOST_KEY (an
operator's), ROOST_READER_CERT and ROOST_READER_KEY (a reader's), ROOST_OTHER_CERT and
ROOST_OTHER_KEY (a client of another CA), ROOST_CAPSULE (a pushed sealed capsule's
name@version whose allowlist holds sh, cat and sleep).
"""

import io
import json
import os
import re
import socket
import ssl
import sys
import tarfile
from urllib.parse import urlsplit

from roost import NotFoundError, PermissionDeniedError, Roost, UnavailableError

SDK = "python"
NOTE = f"written by the {SDK} SDK\n"


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"acceptance: {name} is not set")
    return value


SERVER = env("ROOST_SERVER")
CA = env("ROOST_CA")
CAPSULE = env("ROOST_CAPSULE")
OPERATOR = {"server": SERVER, "ca": CA, "cert": env("ROOST_CERT"), "key": env("ROOST_KEY")}


class StepFailed(Exception):
    pass


def step(name, fn):
    try:
        seen = fn()
    except Exception as err:
        print(json.dumps({"step": name, "ok": False, "error": f"{type(err).__name__}: {err}"}), flush=True)
        raise StepFailed(name) from err
    print(json.dumps({"step": name, "ok": True, **seen}), flush=True)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def raw_handshake() -> dict:
    """A TLS connection to the listener without a client certificate, and how it ended: TLS
    1.3 finishes the client's side of the handshake before the server has judged the client,
    so the server's refusal comes as an alert after it."""
    url = urlsplit(SERVER)
    ctx = ssl.create_default_context(cafile=CA)
    ctx.set_alpn_protocols(["h2"])
    handshake, answered = False, False
    with socket.create_connection((url.hostname, url.port), timeout=30) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname=url.hostname) as conn:
                handshake = True
                answered = conn.recv(1) != b""
                return {"handshake": handshake, "answered": answered, "error": ""}
        except ssl.SSLError as err:
            return {"handshake": handshake, "answered": answered, "error": err.reason or str(err)}
        except OSError as err:
            return {"handshake": handshake, "answered": answered, "error": type(err).__name__}


def main() -> int:
    roost = Roost.connect(**OPERATOR)
    made = {}
    try:
        def create():
            made["s"] = roost.sessions.create(capsule=CAPSULE, labels={"acceptance": SDK, "role": "main"})
            made["decoy"] = roost.sessions.create(capsule=CAPSULE, labels={"acceptance": SDK, "role": "decoy"})
            s = made["s"]
            check(s.state == "running", f"state {s.state}: {s.record.detail}")
            check(s.record.containment.achieved == "sealed", f"achieved {s.record.containment.achieved}")
            check(s.labels == {"acceptance": SDK, "role": "main"}, f"labels {s.labels}")
            return {"id": s.id, "decoy": made["decoy"].id, "state": s.state,
                    "achieved": s.record.containment.achieved, "labels": s.labels}

        step("create", create)
        s, decoy = made["s"], made["decoy"]

        def write():
            info = s.files.write("note.txt", NOTE)
            check(info.size == len(NOTE.encode()), f"size {info.size}")
            return {"path": "note.txt", "size": info.size}

        step("write", write)

        def exec_stream():
            # The command prints the note, then waits for a file the client writes only once
            # it has seen that first chunk: exec cannot end unless its output came as a stream.
            chunks, gate = [], []

            def on_stdout(data):
                chunks.append(data)
                if NOTE in "".join(chunks) and not gate:
                    gate.append(s.files.write("go", ""))

            r = s.exec("cat note.txt; while [ ! -e go ]; do sleep 0.05; done; echo done", timeout=120, on_stdout=on_stdout)
            check(r.exit_code == 0, f"{r.detail}: {r.stderr}")
            check(r.stdout == NOTE + "done\n", f"stdout {r.stdout!r}")
            check("".join(chunks) == r.stdout, f"chunks {chunks!r}")
            check(len(chunks) >= 2, f"the output came in {len(chunks)} chunk(s)")
            return {"chunks": chunks, "stdout": r.stdout, "exitCode": r.exit_code, "firstChunkBeforeEnd": bool(gate)}

        step("exec-stream", exec_stream)

        def download_tar():
            archive = b"".join(s.files.archive("."))
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
                names = sorted(tar.getnames())
                check("note.txt" in names, f"note.txt is not in the archive: {names}")
                member = tar.getmember("note.txt")
                check(member.isreg(), "note.txt is not a regular file in the archive")
                got = tar.extractfile(member).read().decode()
            check(got == NOTE, f"note.txt holds {got!r}")
            return {"names": names, "note": got}

        step("download-tar", download_tar)

        def labels():
            def ids(sel):
                return sorted(x.id for x in roost.sessions.list(labels=sel))

            main_ids, any_ids = ids({"acceptance": SDK, "role": "main"}), ids({"acceptance": SDK})
            check(main_ids == [s.id], f"role=main lists {main_ids}")
            check(any_ids == sorted([s.id, decoy.id]), f"acceptance={SDK} lists {any_ids}")
            return {"main": main_ids, "any": any_ids}

        step("labels", labels)

        def detach():
            h = s.exec("echo one; while [ ! -e go2 ]; do sleep 0.05; done; echo two; exit 3", background=True)
            made["exec_id"] = h.exec_id
            # exec returned while the command waits for go2: it runs on, detached.
            states = [x.state for x in s.execs() if x.exec_id == h.exec_id]
            check(states == ["running"], f"the detached exec is {states}")
            return {"execId": h.exec_id, "state": states[0]}

        step("detach", detach)

        def attach():
            s.files.write("go2", "")
            # A handle of its own, as another client's would be: from the exec's id alone.
            offset, chunks = len(b"one\n"), []
            r = s.attach_exec(made["exec_id"]).wait(stdout_offset=offset, on_stdout=chunks.append)
            check(r.stdout == "two\n", f"stdout {r.stdout!r}")
            check(r.exit_code == 3, r.detail)
            check("".join(chunks) == "two\n", f"chunks {chunks!r}")
            return {"execId": made["exec_id"], "offset": offset, "stdout": r.stdout, "exitCode": r.exit_code}

        step("attach", attach)

        def refuse_no_cert():
            # The SDK refuses before any call; a raw handshake without a certificate is refused by roostd.
            try:
                Roost.connect(server=SERVER, ca=CA)
                raise AssertionError("Roost.connect took a server without a certificate")
            except ValueError as err:
                check(re.search("cert is required", str(err)), str(err))
            raw = raw_handshake()
            check(not raw["answered"], "roostd answered a client without a certificate")
            check(raw["error"] != "", "the connection closed without the server's alert")
            return {"sdk": "ValueError", "raw": raw["error"], "rawHandshake": raw["handshake"]}

        step("refuse-no-cert", refuse_no_cert)

        def refuse_other_ca():
            with Roost.connect(server=SERVER, ca=CA, cert=env("ROOST_OTHER_CERT"), key=env("ROOST_OTHER_KEY")) as stranger:
                try:
                    stranger.version()
                except UnavailableError as err:
                    return {"error": type(err).__name__, "grpcCode": err.code.name.lower()}
            raise AssertionError("a client of another CA was served")

        step("refuse-other-ca", refuse_other_ca)

        def refuse_reader_kill():
            with Roost.connect(server=SERVER, ca=CA, cert=env("ROOST_READER_CERT"), key=env("ROOST_READER_KEY")) as reader:
                seen = reader.sessions.get(s.id)
                check(seen.state == "running", f"the reader sees {seen.state}")
                try:
                    seen.kill()
                    raise AssertionError("a reader killed a session")
                except PermissionDeniedError as err:
                    check("may not call /roost.v1.SessionService/Kill" in str(err), str(err))
                    after = s.refresh().state
                    check(after == "running", f"after the reader's Kill the session is {after}")
                    return {"error": type(err).__name__, "grpcCode": err.code.name.lower(), "message": str(err), "stateAfter": after}

        step("refuse-reader-kill", refuse_reader_kill)

        def remove():
            s.kill()
            s.wait()
            s.remove()
            decoy.remove(force=True)
            made.pop("s")
            made.pop("decoy")
            try:
                roost.sessions.get(s.id)
            except NotFoundError as err:
                return {"id": s.id, "get": type(err).__name__}
            raise AssertionError("the removed session is still there")

        step("remove", remove)
        return 0
    except StepFailed:
        return 1
    finally:
        for left in (made.get("s"), made.get("decoy")):
            if left is not None:
                try:
                    left.remove(force=True)
                except Exception:
                    pass
        roost.close()


if __name__ == "__main__":
    sys.exit(main())
