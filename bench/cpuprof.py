#!/usr/bin/env python3
"""Where a session's CPU goes: which process, user or kernel, and in which phase.

bench/sealed.sh (PROFILE=1) records the whole machine with perf while it runs N sessions one
after another: sched:sched_stat_runtime (every slice of CPU a task ran, exact to the
nanosecond), sched:sched_process_fork (who started whom) and cpu-clock samples (whether a
task was in the kernel or in user space). This script keeps the tasks that descend from the
bench's own shell (roostctl, roostd, what roostd starts, runc), sorts them by what they are
from their comm, and prints milliseconds of CPU per session for each.

  cpuprof.py snapshot BENCH_PID LABEL=PID...   tasks alive now, "tid label" lines
  cpuprof.py report --tasks FILE --n N --offset S [--spans FILE --events FILE] < perf script

The report reads `perf script -F comm,pid,tid,time,event,trace,ip` recorded with
-k CLOCK_MONOTONIC; --offset is CLOCK_REALTIME minus CLOCK_MONOTONIC, to place the registry's
event times (wall clock) on perf's clock.
"""
import argparse
import collections
import datetime
import json
import os
import re
import sys

# The bench's own work around a session: not the session's cost.
HARNESS = {"bash", "sh", "curl", "sleep", "seq", "sed", "mkdir", "rm", "xargs", "awk",
           "python3", "cat", "perf", "grep", "sort", "kill", "timeout"}
KTHREAD = re.compile(r"^(kworker|ksoftirqd|rcu|migration|kthreadd|kcompactd|khugepaged|kswapd|"
                     r"jbd2|writeback|irq/|kauditd|cpuhp|idle_inject|oom_reaper|kblockd|"
                     r"ext4|scsi|watchdog|kintegrityd|khungtaskd|card|psimon|hwrng)")
HEAD = re.compile(r"^\s*(.*?)\s+(\d+)/(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)$")
RUNTIME = re.compile(r"comm=(.*) pid=(\d+) runtime=(\d+)")
FORK = re.compile(r"comm=(.*) pid=(\d+) child_comm=(.*) child_pid=(\d+)")


def snapshot(bench, labels):
    """Every task below the bench's shell now, labelled by the root it descends from."""
    parent = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read()
        except OSError:
            continue
        parent[int(p)] = int(st[st.rindex(")") + 2:].split()[1])
    roots = {int(pid): label for label, pid in (x.split("=") for x in labels)}
    for pid in parent:
        label, q = None, pid
        while q > 1:
            if q in roots:
                label = roots[q]
                break
            if q == bench:
                label = "bench"
                break
            q = parent.get(q, 1)
        if label is None:
            continue
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                print(tid, label)
        except OSError:
            pass


def wall(s):
    s = s.rstrip("Z")
    base, _, frac = s.partition(".")
    d = datetime.datetime.fromisoformat(base).replace(tzinfo=datetime.timezone.utc)
    return d.timestamp() + float("0." + (frac or "0"))


def kind(comm, label, own):
    """What a task is, from its name and the root it descends from."""
    if comm in HARNESS:
        return None
    if comm == "roostd":
        return "roostd" if label == own else "the other roostd (idle)"
    if comm.startswith("runc:["):
        return "container init " + comm[5:]
    if comm in ("roostctl", "roost-sealer", "roost-init", "roost-exec", "runc", "apirun"):
        return comm
    if comm == "true":
        return "the program (/usr/bin/true)"
    return comm


PHASES = ["roostctl start + Stage", "Launch RPC", "container, roost-init, program start",
          "program, its end recorded", "Wait, roostctl exit", "after exit (teardown, refill)"]


def report(a):
    label = {}
    with open(a.tasks) as f:
        for line in f:
            tid, lab = line.split()
            label[int(tid)] = lab
    spans = []
    if a.spans:
        with open(a.spans) as f:
            spans = [tuple(int(x) / 1e6 - a.offset for x in line.split()) for line in f]
    bounds = []  # per session: t0, staged, launching, running, exited, t1, next t0
    if spans and a.events:
        ev = {}
        with open(a.events) as f:
            for line in f:
                e = json.loads(line)
                ev.setdefault(e["session_id"], {})[e["type"]] = wall(e["time"]) - a.offset
        first = min(t0 for t0, _ in spans)
        sess = sorted((v for v in ev.values()
                       if v.get("session.staged", 0) >= first and "session.exited" in v),
                      key=lambda v: v["session.staged"])
        for i, ((t0, t1), v) in enumerate(zip(spans, sess)):
            nxt = spans[i + 1][0] if i + 1 < len(spans) else float("inf")
            bounds.append([t0, v["session.staged"], v["session.launching"],
                           v["session.running"], v["session.exited"], t1, nxt])

    def phase(t):
        for b in bounds:
            if b[0] <= t < b[6]:
                for k in range(6):
                    if t < b[k + 1]:
                        return k
        return None

    cpu = collections.Counter()        # kind -> ns
    kern = collections.Counter()       # kind -> kernel samples
    samples = collections.Counter()    # kind -> samples
    byphase = collections.Counter()    # (phase, kind) -> ns
    machine = collections.Counter()    # outside the bench: kernel threads, others
    comm_of = {}                       # tgid -> its main thread's name
    tgid = {}                          # tid -> tgid, from the events' headers
    own = a.own
    pending = None  # a sample whose ip is the first line of its call graph (PROFILE_GRAPH)
    for line in sys.stdin:
        m = HEAD.match(line)
        if not m:
            if pending and line.strip():
                if int(line.split()[0], 16) >= 0xffff800000000000:
                    kern[pending] += 1
                pending = None
            continue
        pending = None
        hcomm, hpid, htid, t, event, rest = m.groups()
        hpid, htid, t = int(hpid), int(htid), float(t)
        tgid[htid] = hpid
        if htid == hpid:
            comm_of[htid] = hcomm
        if event == "sched:sched_process_fork":
            f = FORK.match(rest)
            if f and int(f.group(2)) in label:
                label[int(f.group(4))] = label[int(f.group(2))]
            continue
        if event == "sched:sched_stat_runtime":
            r = RUNTIME.match(rest)
            if not r:
                continue
            comm, tid, ns = r.group(1), int(r.group(2)), int(r.group(3))
            if tid == tgid.get(tid, tid):
                comm_of[tid] = comm
            # A process is named by its main thread: a Go program's runtime threads keep
            # the name they had before main renamed the process (roost-sealer, run from
            # its sealed copy, starts as "9").
            comm = comm_of.get(tgid.get(tid, tid), comm)
            if tid not in label:
                machine["kernel threads" if KTHREAD.match(comm) else "other"] += ns
                continue
            k = kind(comm, label[tid], own)
            if k is None:
                continue
            cpu[k] += ns
            p = phase(t)
            if p is not None:
                byphase[(p, k)] += ns
            continue
        if event.startswith("cpu-clock") and htid in label:
            k = kind(comm_of.get(hpid, hcomm), label[htid], own)
            if k is None:
                continue
            samples[k] += 1
            if not rest.split():
                pending = k
            elif int(rest.split()[0], 16) >= 0xffff800000000000:
                kern[k] += 1

    n = a.n
    total = sum(v for k, v in cpu.items() if k != "the other roostd (idle)")
    print(f"{'process (CPU per session, ms)':<44} {'total':>8} {'user':>7} {'sys':>7} {'samples':>8}")
    for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]):
        ms = v / 1e6 / n
        if ms < 0.005:
            continue
        ks = kern[k] / samples[k] if samples[k] else 0
        print(f"{k:<44} {ms:8.2f} {ms * (1 - ks):7.2f} {ms * ks:7.2f} {samples[k]:8d}")
    print(f"{'all of the above (the other roostd left out)':<44} {total / 1e6 / n:8.2f}")
    print(f"{'(machine-wide kernel threads, any cause)':<44} {machine['kernel threads'] / 1e6 / n:8.2f}")
    if bounds:
        kinds = [k for k, _ in sorted(cpu.items(), key=lambda kv: -kv[1])
                 if k != "the other roostd (idle)" and cpu[k] / 1e6 / n >= 0.3][:6]
        print()
        print(f"{'phase (CPU per session, ms)':<38} {'all':>6} " + " ".join(f"{k[:11]:>11}" for k in kinds))
        for p, name in enumerate(PHASES):
            row = [byphase[(p, k)] / 1e6 / len(bounds) for k in kinds]
            allp = sum(v for (q, k), v in byphase.items()
                       if q == p and k != "the other roostd (idle)") / 1e6 / len(bounds)
            print(f"{name:<38} {allp:6.2f} " + " ".join(f"{x:11.2f}" for x in row))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "snapshot":
        snapshot(int(sys.argv[2]), sys.argv[3:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("--tasks", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--offset", type=float, required=True)
    ap.add_argument("--own", default="", help="the label of the roostd under test")
    ap.add_argument("--spans")
    ap.add_argument("--events")
    report(ap.parse_args())


if __name__ == "__main__":
    main()
