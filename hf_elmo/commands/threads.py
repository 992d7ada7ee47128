"""`--threads`, the intra-op threads of every command that computes, and the default when it is not given.

On a busy machine a multi-threaded operation waits at its end for its slowest thread, and a thread that shares its
core with another process is descheduled for whole time slices: training's thousands of small operations a step
then collapse (docs/performance.md). So the default counts the cores this process may use (its CPU affinity and its
cgroup's CPU quota) less those that other processes keep busy, at least one: all of them on an idle machine, one
where other work fills the cores. An `OMP_NUM_THREADS` set by the user is kept, as PyTorch keeps it.
"""

import math
import os
from pathlib import Path

import torch

HELP = (
    "intra-op threads; default: OMP_NUM_THREADS if set, else the cores this process may use that other processes do "
    "not keep busy (at least 1)"
)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, bounded by the cgroup v2 CPU quota (`cpu.max`)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def busy_cores() -> int:
    """The cores other processes keep busy: the larger of the last minute's load average (a process just started has
    added little to it) and the threads of other processes running now."""
    try:
        fields = Path("/proc/loadavg").read_text().split()
        running_now = int(fields[3].split("/")[0]) - own_running_threads()  # the count includes ours
        return max(0, round(max(float(fields[0]), running_now)))
    except (OSError, ValueError, IndexError):
        return round(os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0


def own_running_threads() -> int:
    """This process's threads that are running or waiting to run (state R), as the load average counts them."""
    running = 0
    for stat in Path("/proc/self/task").glob("*/stat"):
        try:
            running += stat.read_text().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            continue
    return running


def default_threads() -> int:
    if os.environ.get("OMP_NUM_THREADS", "").strip().isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"])
    return max(1, usable_cores() - busy_cores())


def use_threads(threads: int | None) -> int:
    """Sets PyTorch's intra-op threads to `threads` (None: `default_threads()`); returns the count."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a whole number >= 1, got {threads!r}.")
    threads = default_threads() if threads is None else threads
    torch.set_num_threads(threads)
    return threads
