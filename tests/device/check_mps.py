#!/usr/bin/env python3
"""On a machine with a real NVIDIA GPU: the agent's MPS supervisor against the driver.

    .venv/bin/python tests/device/check_mps.py [--gpu 0] [--limit-gib 2]

1. The agent's ``MpsSupervisor`` (agent/mps.py, as ``--mps-supervisor`` runs it) starts
   the MPS control daemon of one GPU (its UUID from ``nvidia-smi``) in a scratch
   directory, and reports it healthy.
2. Two client processes share the GPU through that daemon, as two containers given a
   share each would (``CUDA_MPS_PIPE_DIRECTORY`` and the limits the device plugin's
   Allocate sets, from ``agent.deviceplugin.devices.share_answer``): each creates a
   context and allocates 256 MiB while the other holds its own, and the daemon's
   ``get_server_list`` shows the server they use.
3. A client held to ``--limit-gib`` by ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` cannot
   allocate more than that (cuMemAlloc answers out of memory), and can allocate less.
4. The supervisor quits the daemon; nothing is left running.

The clients use the driver API through ctypes (libcuda.so.1, which the driver installs):
no CUDA toolkit or framework is needed. Prints each check; exits 1 on a failed check,
2 when the machine cannot run it (no GPU, no MPS control program). Under 5 minutes;
never part of ``make test`` (tests/device is outside pytest's testpaths).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# One client: a context on device 0 (the one the client sees), then allocations of the
# sizes given (MiB), each held; prints a JSON line per allocation: [size, CUresult].
CLIENT = r"""
import ctypes, json, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
def check(what, result):
    if result != 0:
        print(json.dumps({"error": what, "code": result}), flush=True)
        sys.exit(3)
check("cuInit", cuda.cuInit(0))
device = ctypes.c_int()
check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), 0))
context = ctypes.c_void_p()
check("cuCtxCreate", cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device))
held = []
for mib in map(int, sys.argv[1].split(",")):
    pointer = ctypes.c_uint64()
    result = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(mib << 20))
    if result == 0:
        held.append(pointer)
    print(json.dumps([mib, result]), flush=True)
time.sleep(float(sys.argv[2]))
"""
OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY


def gpu_uuid(index: int) -> str:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", f"--id={index}"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return out.strip()


def client(env: dict[str, str], sizes: list[int], hold_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, ",".join(map(str, sizes)), str(hold_s)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def results(proc: subprocess.Popen[str], timeout: float = 120) -> list:
    out, _ = proc.communicate(timeout=timeout)
    return [json.loads(line) for line in out.splitlines() if line.startswith(("[", "{"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0, help="nvidia-smi index of the GPU")
    parser.add_argument("--limit-gib", type=int, default=2)
    args = parser.parse_args()
    control = shutil.which("nvidia-cuda-mps-control")
    if shutil.which("nvidia-smi") is None or control is None:
        print("SKIP: needs nvidia-smi and nvidia-cuda-mps-control (the NVIDIA driver)")
        return 2
    from agent.deviceplugin.devices import MPS, GpuInfo, Options, share_answer
    from agent.mps import MpsSupervisor

    uuid = gpu_uuid(args.gpu)
    root = tempfile.mkdtemp(prefix="mps-check-")
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    supervisor = MpsSupervisor([uuid], root, os.path.join(root, "log"), (control, "-d"))
    try:
        supervisor.check()
        for _ in range(20):
            if not supervisor.unhealthy():
                break
            time.sleep(0.5)
            supervisor.check()
        check(
            supervisor.unhealthy() == {},
            f"the MPS daemon of {uuid} starts: {supervisor.unhealthy()}",
        )
        pipe = os.path.join(root, uuid)
        units = 80  # a share's env as Allocate writes it (the limit set per client below)
        answer = share_answer(GpuInfo(uuid, args.gpu, units), args.limit_gib, Options(mode=MPS))
        env = {**os.environ, **answer.envs, "CUDA_MPS_PIPE_DIRECTORY": pipe,
               "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log", uuid),
               "CUDA_VISIBLE_DEVICES": uuid}  # fmt: skip
        env.pop("NVIDIA_VISIBLE_DEVICES", None)  # the container's runtime reads that one
        first, second = client(env, [256], 8), client(env, [256], 8)
        time.sleep(3)
        pipe_env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe}
        servers = subprocess.run(
            [control], input="get_server_list\n", env=pipe_env,
            capture_output=True, text=True, timeout=30,
        ).stdout.split()  # fmt: skip
        got = results(first), results(second)
        check(all(r == [[256, 0]] for r in got), f"two processes share the GPU: {got}")
        check(len(servers) >= 1, f"the daemon serves them (get_server_list: {servers})")
        limit = args.limit_gib << 10
        over = results(client(env, [limit + 512], 0))
        check(
            over == [[limit + 512, OUT_OF_MEMORY]],
            f"{limit + 512} MiB over a {limit} MiB limit fails: {over}",
        )
        under = results(client(env, [limit // 2], 0))
        check(under == [[limit // 2, 0]], f"{limit // 2} MiB under the limit succeeds: {under}")
    finally:
        supervisor.stop()
        shutil.rmtree(root, ignore_errors=True)
    left = subprocess.run(["pgrep", "-f", root], capture_output=True, text=True).stdout.split()
    check(not left, f"nothing left running: {left}")
    print("PASS" if not failures else f"FAILED: {len(failures)} check(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
