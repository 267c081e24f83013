"""CPU time by component, read from /proc: where a benchmark's cycles went.

On the lab's two vCPUs kube-scheduler, the API server, etcd and the extenders share the
same cores, so what one spends is taken from the others. ``snapshot()`` sums user +
system time of every live process by component (kube-scheduler, kube-apiserver, etcd,
kube-controller-manager, our extender and its workers, the bare echo extender), and
the machine's busy time from /proc/stat; the difference of two snapshots says how
many CPU-milliseconds each component spent over a stretch of a run.

A process that exits between two snapshots takes its time with it: take the second
before stopping what was measured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

#: What a process is, from its command line: the lab's control plane is one binary
#: whose first argument names the component.
K8S_COMPONENTS = ("kube-scheduler", "kube-apiserver", "etcd", "kube-controller-manager")
OURS, BARE, BASE = "extender (ours)", "extender (bare)", "extender (base)"
#: The interpreter option (``-X``) that marks the extender of another tree
#: (e2e_throughput.py ``--base-tree``): ours as it was, beside ours as it is.
BASE_MARK = "gpu-scheduler-base"
TICKS = os.sysconf("SC_CLK_TCK")


def component(argv: list[str]) -> str | None:
    """The component a command line belongs to, or None for anything else."""
    if len(argv) >= 2 and argv[1] in K8S_COMPONENTS:
        return argv[1]
    if argv and argv[0].rsplit("/", 1)[-1] == "kube-scheduler":  # the plugins path's own
        return "kube-scheduler"
    if "gpu_scheduler.cli" in argv and "extender" in argv:
        return BASE if BASE_MARK in argv else OURS
    if any(arg.endswith("bare.py") for arg in argv):
        return BARE
    return None


def cpu_ticks(stat: str) -> int:
    """utime + stime of one ``/proc/<pid>/stat`` line (the command's name, in
    parentheses, may itself hold spaces and parentheses: fields count from the last)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


def machine_ticks(text: str) -> tuple[int, int]:
    """(busy, total) jiffies from /proc/stat's first line (idle and iowait are idle)."""
    values = [int(v) for v in text.splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


def stolen_ticks(text: str) -> int:
    """Jiffies /proc/stat's first line counts as stolen: the hypervisor ran something
    else on this VM's vCPUs. Busy by the count above, yet no process here ran."""
    values = text.splitlines()[0].split()[1:]
    return int(values[7]) if len(values) > 7 else 0


@dataclass
class Snapshot:
    by_component: dict[str, float] = field(default_factory=dict)  # CPU seconds
    busy: float = 0.0  # the machine's, in CPU seconds
    total: float = 0.0
    stolen: float = 0.0  # of busy: the hypervisor's (steal)

    def minus(self, earlier: Snapshot) -> Snapshot:
        keys = set(self.by_component) | set(earlier.by_component)
        return Snapshot(
            {k: self.by_component.get(k, 0.0) - earlier.by_component.get(k, 0.0) for k in keys},
            self.busy - earlier.busy,
            self.total - earlier.total,
            self.stolen - earlier.stolen,
        )


def snapshot(proc: Path = Path("/proc")) -> Snapshot:
    out: dict[str, float] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            name = component([a for a in argv if a])
            if name is None:
                continue
            ticks = cpu_ticks((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):  # gone meanwhile, or unreadable
            continue
        out[name] = out.get(name, 0.0) + ticks / TICKS
    stat = (proc / "stat").read_text()
    busy, total = machine_ticks(stat)
    return Snapshot(out, busy / TICKS, total / TICKS, stolen_ticks(stat) / TICKS)


def per_item_ms(spent: Snapshot, items: int) -> dict[str, float]:
    """CPU milliseconds per item (pod) by component, and ``machine busy`` and
    ``stolen`` (by the hypervisor: part of busy) as shares of all the cores' time over
    the stretch (0..1)."""
    out = {k: v * 1000 / items for k, v in sorted(spent.by_component.items()) if v > 0}
    if spent.total > 0:
        out[BUSY] = spent.busy / spent.total
        out[STOLEN] = spent.stolen / spent.total
    return out


#: The machine-wide shares per_item_ms adds, beside the components' milliseconds.
BUSY, STOLEN = "machine busy", "stolen"
SHARES = (BUSY, STOLEN)
