"""CPU time spent by the local stack's processes (Linux /proc), to say where a run's cores went.

On this kind of machine the end-to-end runs are CPU-bound: throughput is the cores divided by
the CPU one order costs across the dev host, Azurite and the simulator. Each is read from
/proc (user + system time of a process and its live descendants) before and after a run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from sas_local.processes import descendants, stat_fields

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants."""
    total = 0.0
    for member in (pid, *descendants(pid)):
        fields = stat_fields(member)
        if fields is not None:
            # After the command name: utime and stime are the 12th and 13th fields.
            total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total


def snapshot(pids: Mapping[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def per_order_ms(
    before: Mapping[str, float], after: Mapping[str, float], orders: int
) -> dict[str, float]:
    """Milliseconds of CPU per order, per process group, between two snapshots."""
    return {
        name: round(1000 * (after[name] - before.get(name, 0.0)) / max(orders, 1), 1)
        for name in after
    }
