#!/usr/bin/env python3
"""Phases of each command `bench/run_overhead.sh` times, from `perf script`
output of its process tracepoints (PHASES=1 there): for every command the
benchmark's shell started, the times of the forks, execs and exits below
it, relative to the shell's fork; medians over the runs of each command.

Usage: run_phases.py PERF_SCRIPT_OUTPUT SHELL_PID
"""
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"\s*(\S+)\s+(\d+)/(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)")


def events(path):
    for line in open(path):
        m = LINE.match(line)
        if m:
            comm, pid, _tid, t, event, rest = m.groups()
            yield float(t) * 1e3, comm, int(pid), event, rest


def runs(path, shell):
    """Each command the shell forked: its events, as (ms, label)."""
    top = {}  # pid -> the shell's child it descends from
    out = defaultdict(list)
    for t, comm, pid, event, rest in events(path):
        if event == "sched:sched_process_fork":
            child = int(re.search(r"child_pid=(\d+)", rest).group(1))
            if pid == shell:
                top[child] = child
                out[child].append((t, "forked by the shell"))
            elif pid in top:
                top[child] = top[pid]
                out[top[pid]].append((t, f"{comm} forks"))
        elif pid in top and event == "sched:sched_process_exec":
            name = re.search(r"filename=(\S+)", rest).group(1).rsplit("/", 1)[-1]
            out[top[pid]].append((t, f"exec {name}"))
        elif pid in top and event == "sched:sched_process_exit" and "group_dead=true" in rest:
            out[top[pid]].append((t, f"{comm} exits"))
    return out


def main():
    path, shell = sys.argv[1], int(sys.argv[2])
    by_command = defaultdict(list)
    for evs in runs(path, shell).values():
        if len(evs) > 2:
            # The command is what the shell's child exec'd first.
            by_command[evs[1][1]].append(evs)
    for command, rs in sorted(by_command.items()):
        if len(rs) < 2:
            continue  # the shell's own helper (the `cat` on fd 9)
        shapes = defaultdict(list)
        for r in rs:
            shapes[tuple(label for _, label in r)].append(r)
        shape, same = max(shapes.items(), key=lambda kv: len(kv[1]))
        print(f"{command}: medians of {len(same)} of {len(rs)} runs (ms from the shell's fork)")
        before = 0.0
        for i, label in enumerate(shape):
            at = statistics.median(r[i][0] - r[0][0] for r in same)
            print(f"  {label:32s} {at:7.3f}  (+{at - before:.3f})")
            before = at


if __name__ == "__main__":
    main()
