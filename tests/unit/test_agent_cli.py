"""``gpu-scheduler agent`` as a process: one JSON document on stdout, exit codes,
SIGTERM, and the ops endpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from gpu_scheduler import contract
from tests.helpers import CLI, ROOT, free_port, skip_with_an_nvidia_driver, wait_for

FIXTURES = ROOT / "tests" / "fixtures" / "gpus"
# No cluster anywhere: a kubeconfig lookup must never be what makes a test pass.
ENV = {**os.environ, "KUBECONFIG": "/nonexistent", "NODE_NAME": ""}


def agent(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "agent", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        timeout=timeout,
    )


def test_once_dry_run_prints_exactly_one_json_document() -> None:
    result = agent(
        "--once", "--dry-run", "--capacity", "--fake-gpus", str(FIXTURES / "h100x8.yaml")
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)  # the whole of stdout is one document
    assert set(document) == {"labels", "annotations", "capacity"}
    assert document["capacity"] == {contract.RESOURCE_GPU: "8"}
    assert document["labels"][contract.LABEL_GPU_PRODUCT] == "NVIDIA-H100-80GB-HBM3"
    assert document["labels"][contract.LABEL_GPU_MEMORY] == "81559"
    assert len(json.loads(document["annotations"][contract.ANN_GPUS])) == 8


def test_once_dry_run_capacity_off_by_default_and_logs_on_stderr() -> None:
    result = agent(
        "--once",
        "--dry-run",
        "--fake-gpus",
        str(FIXTURES / "h100x8-unhealthy.yaml"),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["capacity"] == {}
    logs = [json.loads(line) for line in result.stderr.splitlines()]
    assert any(entry["msg"] == "unhealthy GPU" and entry["gpu"] == 3 for entry in logs)


def test_once_with_a_bad_inventory_exits_non_zero(tmp_path: Path) -> None:
    bad = tmp_path / "gpus.yaml"
    bad.write_text("driverVersion: '550.54.15'\ncudaDriverVersion: '12.4'\ngpus: [{name: x}]\n")
    started = time.monotonic()
    result = agent("--once", "--node-name", "gpu-1", "--fake-gpus", str(bad))
    assert result.returncode == 1
    assert time.monotonic() - started < 30  # at once: no backoff in --once
    assert result.stdout == ""
    assert "cannot read the GPUs" in result.stderr and "gpus[0].uuid: missing" in result.stderr


def test_once_with_nvml_absent_exits_non_zero() -> None:
    skip_with_an_nvidia_driver()
    result = agent("--once", "--dry-run")
    assert result.returncode == 1 and result.stdout == ""
    assert "NVML could not be initialised" in result.stderr


def test_bad_flags_exit_2() -> None:
    fake = str(FIXTURES / "l4x2.yaml")
    result = agent("--once", "--fake-gpus", fake)
    assert result.returncode == 2 and "--node-name" in result.stderr
    result = agent("--once", "--dry-run", "--interval", "soon", "--fake-gpus", fake)
    assert result.returncode == 2 and "not a duration" in result.stderr


def test_once_without_a_cluster_fails_clearly() -> None:
    result = agent(
        "--once",
        "--node-name",
        "gpu-1",
        "--kubeconfig",
        "/nonexistent",
        "--fake-gpus",
        str(FIXTURES / "l4x2.yaml"),
    )
    assert result.returncode == 1
    assert "Kubernetes configuration" in result.stderr or "nonexistent" in result.stderr


def test_long_running_dry_run_serves_ops_endpoints_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            *CLI,
            "agent",
            "--dry-run",
            "--capacity",
            "--interval",
            "60s",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--fake-gpus",
            str(FIXTURES / "l4x2.yaml"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=ENV,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: requests.get(f"{base}/readyz", timeout=1).status_code == 200,
            30,
            "agent /readyz",
        )
        assert requests.get(f"{base}/healthz", timeout=1).json() == {"status": "ok"}
        metrics = requests.get(f"{base}/metrics", timeout=1).text
        assert 'gpu_scheduler_agent_gpus{state="allocatable"} 2.0' in metrics
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert json.loads(out)["capacity"] == {contract.RESOURCE_GPU: "2"}
    assert "stopping" in err


def test_help_lists_the_agent() -> None:
    result = subprocess.run(
        [*CLI, "agent", "--help"], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=60
    )
    assert result.returncode == 0
    for flag in (
        "--node-name",
        "--interval",
        "--heartbeat-interval",
        "--once",
        "--dry-run",
        "--fake-gpus",
        "--kubeconfig",
        "--port",
        "--capacity",
        "--gfd-labels",
    ):
        assert flag in result.stdout
    assert sys.executable  # the same interpreter runs the CLI
