"""A client of roostd that stays connected, for bench/sdk.sh: each line on stdin is one
measurement through the roost package, its result one line on stdout, timed by this
process's own clock (a connection's setup is not in it: the first call made it).

  rt          sessions.create, exec(["true"]), remove(force=True) of --capsule:
              "<total us> <session id> <create us> <exec us> <remove us>"
  files BYTES files.write then files.read_bytes of BYTES bytes in one session of --capsule
              (made at the first such line): "<write us> <read us>"

A failure is "error: <message>" and the next line is read. Run with the SDK on PYTHONPATH:
python3 roundtrip.py --socket PATH --capsule REF, or with --server HOST:PORT --ca FILE
--cert FILE --key FILE for roostd's mTLS listener.
"""

import argparse
import sys
import time

from roost import Roost


def us(since: int) -> int:
    return (time.perf_counter_ns() - since) // 1000


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--socket")
    p.add_argument("--server")
    p.add_argument("--ca")
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--capsule", required=True)
    a = p.parse_args()
    if not a.socket and not a.server:
        p.error("--socket or --server is required")
    if a.server:
        roost = Roost.connect(server=a.server, ca=a.ca, cert=a.cert, key=a.key)
    else:
        roost = Roost.connect(socket=a.socket)

    def round_trip() -> str:
        t0 = time.perf_counter_ns()
        s = roost.sessions.create(capsule=a.capsule)
        created = us(t0)
        if s.state != "running":
            raise RuntimeError(f"session {s.id} is {s.state} after create")
        t1 = time.perf_counter_ns()
        r = s.exec(["true"])
        execd = us(t1)
        if r.exit_code != 0:
            raise RuntimeError(f"exec true in {s.id}: {r.detail}")
        t2 = time.perf_counter_ns()
        s.remove(force=True)
        removed = us(t2)
        return f"{us(t0)} {s.id} {created} {execd} {removed}"

    files_session = None
    blobs: dict[int, bytes] = {}

    def files(size: int) -> str:
        nonlocal files_session
        if files_session is None:
            files_session = roost.sessions.create(capsule=a.capsule)
        data = blobs.setdefault(size, bytes(i % 251 for i in range(251)) * (size // 251) + bytes(i % 251 for i in range(size % 251)))
        t0 = time.perf_counter_ns()
        files_session.files.write("blob", data)
        wrote = us(t0)
        t1 = time.perf_counter_ns()
        back = files_session.files.read_bytes("blob")
        read = us(t1)
        if back != data:
            raise RuntimeError(f"read back {len(back)} bytes of the {size} written, or other bytes")
        return f"{wrote} {read}"

    for line in sys.stdin:
        what, _, arg = line.strip().partition(" ")
        try:
            if what == "rt":
                out = round_trip()
            elif what == "files" and arg.isdigit():
                out = files(int(arg))
            else:
                out = f'error: {line.strip()!r}: not "rt" or "files BYTES"'
        except Exception as err:  # noqa: BLE001 - the bench reports every failure and goes on
            out = "error: " + str(err).replace("\n", " ")
        print(out, flush=True)
    if files_session is not None:
        files_session.remove(force=True)
    roost.close()


if __name__ == "__main__":
    main()
