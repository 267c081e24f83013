#!/usr/bin/env python3
"""On a machine with a real NVIDIA GPU: do the agent's NVML labels match nvidia-smi?

    .venv/bin/python tests/device/check_nvml.py

Runs ``gpu-scheduler agent --once --dry-run`` as shipped (the NVML backend: no
--fake-gpus, no cluster; capacity is the device plugin's, so the agent writes none)
and compares its labels and per-GPU annotation with ``nvidia-smi --query-gpu=...
--format=csv,noheader,nounits``; then again with ``--capacity`` (the option for nodes
without a device plugin) and checks the capacity it would write. Then it runs the agent's
NVML event loop for a few seconds: every GPU registers, and a wait returns. Prints each
check and exits 1 on any mismatch, 2 if either command fails. Never part of ``make test``
(tests/device is outside pytest's testpaths).

Overrides for trying the script itself without a GPU: ``AGENT_CMD`` (the agent command
line, e.g. with --fake-gpus) and ``NVIDIA_SMI`` (a stand-in nvidia-smi).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = {  # compute capability → GPU Feature Discovery's family; written out again
    "6": "pascal",  # here on purpose, so the agent's table is checked, not reused
    "7.0": "volta",
    "7.2": "volta",
    "7.5": "turing",
    "8.0": "ampere",
    "8.6": "ampere",
    "8.7": "ampere",
    "8.9": "ada-lovelace",
    "9.0": "hopper",
    "10": "blackwell",
    "12": "blackwell",
}
P = "nvidia.com/"


def run(cmd: list[str]) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    if result.returncode != 0:
        print(f"FAILED: {shlex.join(cmd)} exited {result.returncode}\n{result.stderr}")
        sys.exit(2)
    return result.stdout


def main() -> int:
    agent_cmd = shlex.split(os.environ.get("AGENT_CMD", "")) or [
        sys.executable,
        "-m",
        "gpu_scheduler.cli",
        "agent",
        "--once",
        "--dry-run",
    ]
    smi = os.environ.get("NVIDIA_SMI", "nvidia-smi")
    document = json.loads(run(agent_cmd))
    labels, shipped = document["labels"], document["capacity"]
    capacity = json.loads(run([*agent_cmd, "--capacity"]))["capacity"]
    detail = json.loads(document["annotations"]["gpu-scheduler.io/gpus"])
    query = "index,uuid,name,memory.total,compute_cap,driver_version"
    rows = list(
        csv.reader(io.StringIO(run([smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"])))
    )
    gpus = [
        {
            "index": int(r[0]),
            "uuid": r[1].strip(),
            "name": r[2].strip(),
            "memory": int(float(r[3])),
            "cc": r[4].strip(),
            "driver": r[5].strip(),
        }
        for r in rows
        if r
    ]
    print(
        f"nvidia-smi: {len(gpus)} GPU(s): "
        + ", ".join(f"{g['index']}:{g['name']} {g['memory']}MiB cc{g['cc']}" for g in gpus)
    )

    failures = 0

    def check(what: str, got: object, want: object) -> None:
        nonlocal failures
        ok = got == want
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}: agent={got!r} nvidia-smi={want!r}")

    if not gpus:
        check("gpu.present", labels.get(P + "gpu.present"), "false")
        return 1 if failures else 0
    least = min(gpus, key=lambda g: g["memory"])
    ccs = sorted(tuple(int(x) for x in g["cc"].split(".")) for g in gpus)
    low = f"{ccs[0][0]}.{ccs[0][1]}"
    product = re.sub(
        r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$",
        "",
        re.sub(r"[^-A-Za-z0-9_.]", "_", "-".join(least["name"].split()))[:63],
    )
    check("gpu.present", labels.get(P + "gpu.present"), "true")
    check("gpu.count", labels.get(P + "gpu.count"), str(len(gpus)))
    check("gpu.memory (MiB, smallest GPU)", labels.get(P + "gpu.memory"), str(least["memory"]))
    if len({g["name"] for g in gpus}) == 1:
        check("gpu.product", labels.get(P + "gpu.product"), product)
    check("gpu.compute.major", labels.get(P + "gpu.compute.major"), str(ccs[0][0]))
    check("gpu.compute.minor", labels.get(P + "gpu.compute.minor"), str(ccs[0][1]))
    fam = FAMILIES.get(low) or FAMILIES.get(str(ccs[0][0]))
    if fam:
        check("gpu.family", labels.get(P + "gpu.family"), fam)
    driver = gpus[0]["driver"].split(".")
    check("cuda.driver-version.major", labels.get(P + "cuda.driver-version.major"), driver[0])
    check("cuda.driver-version.minor", labels.get(P + "cuda.driver-version.minor"), driver[1])
    if len(driver) > 2:
        check(
            "cuda.driver-version.revision",
            labels.get(P + "cuda.driver-version.revision"),
            driver[2],
        )
    check("capacity as shipped (the device plugin's)", shipped, {})
    have = int(capacity.get("nvidia.com/gpu", "-1"))
    healthy = sum(1 for g in detail if g["healthy"] and not g["migEnabled"])
    check("capacity with --capacity: nvidia.com/gpu (healthy, not MIG)", have, healthy)
    check("capacity <= GPUs", have <= len(gpus), True)
    by_index = {g["index"]: g for g in detail}
    for g in gpus:
        mine = by_index.get(g["index"], {})
        check(f"GPU {g['index']} uuid", mine.get("uuid"), g["uuid"])
        check(f"GPU {g['index']} name", mine.get("name"), g["name"])
        check(f"GPU {g['index']} memoryMiB", mine.get("memoryMiB"), g["memory"])
        check(f"GPU {g['index']} computeCapability", mine.get("computeCapability"), g["cc"])
    if not os.environ.get("AGENT_CMD"):  # the real NVML is here: smoke-test events
        registered, returned = event_loop_smoke()
        check("NVML event loop: GPUs registered", registered, len(gpus))
        check("NVML event loop: a wait returned and the session ended", returned, True)
    print(f"{failures} mismatch(es)" if failures else "all labels match nvidia-smi")
    return 1 if failures else 0


def event_loop_smoke() -> tuple[int | None, bool]:
    """The agent's NVML event loop on the real driver: it registers every GPU that
    supports events, and a wait (1 s) returns so that a stop ends the session."""
    import threading
    import time

    import pynvml

    sys.path.insert(0, str(ROOT))
    from agent.events import NvmlEvents
    from agent.health import HealthTracker

    stop, wake = threading.Event(), threading.Event()
    events = NvmlEvents(pynvml, HealthTracker(), wake, stop, wait_ms=1000)
    thread = threading.Thread(target=events.session, daemon=True)
    thread.start()
    time.sleep(2.5)
    registered = events.registered
    stop.set()
    thread.join(5)
    return registered, not thread.is_alive()


if __name__ == "__main__":
    sys.exit(main())
