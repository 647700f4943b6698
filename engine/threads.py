"""How many threads torch uses on the CPU: the cores free when the engine is built, or the user's --threads.

torch starts one thread per core. On a machine that is busy with other work those threads wait
for each other at every operation's barrier: on a loaded 2-core machine one thread decoded twice
as fast as two.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import UserError
from engine.options import omp_threads_chosen


@dataclass(frozen=True)
class CpuLoad:
    cores: int  # logical CPUs of the machine
    usable: int  # those this process may run on (affinity mask, container quota)
    load_1min: float  # runnable processes, averaged over the last minute

    @classmethod
    def now(cls) -> "CpuLoad":
        cores = os.cpu_count() or 1
        try:
            usable = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not on Linux
            usable = cores
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # Windows has no load average
            load = 0.0
        return cls(cores, min(usable, _cgroup_cpus() or usable), load)


def _cgroup_cpus() -> int | None:
    """The CPU quota of this container (cgroup v2 `cpu.max`, rounded up), or None without one."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1, -(-int(quota) // int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def free_cores(load: CpuLoad) -> int:
    """Cores nobody else is using: the usable ones, less the machine's load, at least one."""
    return max(1, min(load.usable, load.cores - round(load.load_1min)))


def choose_threads(requested: int | None, environ=None) -> int | None:
    """The thread count to give torch: `requested` (--threads) when given; None (torch's own
    choice) when OMP_NUM_THREADS is set, since the user chose there; else the free cores."""
    if requested is not None:
        if requested < 1:
            raise UserError(f"--threads must be at least 1, got {requested}")
        return requested
    if omp_threads_chosen(environ):
        return None
    return free_cores(CpuLoad.now())


def apply_threads(device_type: str, requested: int | None) -> int:
    """Sets torch's intra-op threads once, where an engine is built: the free cores on the CPU,
    `requested` on any device. Returns the count torch uses."""
    import torch

    n = choose_threads(requested) if requested is not None or device_type == "cpu" else None
    if n is not None and n != torch.get_num_threads():
        torch.set_num_threads(n)
    return torch.get_num_threads()
