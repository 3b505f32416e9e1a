"""A session from a capsule directory, a file and a few commands in it, then its end.

Run from the repository's root, with roostd running (make build && sudo bin/roostd):

    PYTHONPATH=sdk/python /usr/bin/python3 sdk/python/examples/hello.py [CAPSULE]

CAPSULE is a capsule directory or a pushed name@version; sdk/examples/sandbox by default.
ROOST_SOCKET names another socket than /run/roost/roostd.sock.
"""

import sys

from roost import Roost, RoostError


def main() -> int:
    capsule = sys.argv[1] if len(sys.argv) > 1 else "sdk/examples/sandbox"
    try:
        with Roost.connect() as roost, roost.sessions.create(capsule=capsule) as s:
            print(f"session {s.id}: {s.state}, {s.record.containment.achieved}")

            r = s.exec("echo hello from $(uname -n) in $(pwd); ls -a", timeout=10)
            print(f"exit {r.exit_code}:\n{r.stdout}")

            s.files.write("task.txt", "count these words\n")
            print(f"task.txt in the session: {s.exec('cat task.txt').stdout.strip()}")

            refused = s.exec(["/usr/bin/id"])
            print(f"id: exit {refused.exit_code}: {refused.detail}")

            s.kill()
            print(f"ended: {s.wait().detail}")
        # Leaving the with block removed the session.
    except RoostError as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
