"""The MPS supervisor (agent/mps.py) against a stand-in for nvidia-cuda-mps-control: a
small Python script, written here and run as a real process, that daemonises with
``-d`` (writing its PID file in the pipe directory, as the real one does), answers
``get_server_list`` and ``quit`` on stdin, and can be told per GPU to refuse to start,
to hang, not to daemonise, to stop answering, or to refuse a setting. No GPU needed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent import mps
from agent.mps import (
    PID_FILE,
    DaemonState,
    MpsSupervisor,
    Policy,
    after_probe,
    after_start,
    due,
    pid_alive,
    read_pid,
    run_command,
)
from tests.helpers import ManualClock as Clock

A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"

FAKE = r"""
import json, os, signal, sys, time
STATE = {state!r}
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
uuid = os.environ.get("CUDA_VISIBLE_DEVICES", "")
pidfile = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
try:
    mode = open(os.path.join(STATE, uuid)).read().strip()
except OSError:
    mode = "ok"
command = "-d" if "-d" in sys.argv else sys.stdin.read().strip()
with open(os.path.join(STATE, "calls.log"), "a") as log:
    keys = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
    env = {{k: os.environ.get(k) for k in keys}}
    log.write(json.dumps({{"command": command, "env": env}}) + "\n")

def alive(pid):
    try:
        stat = open(f"/proc/{{pid}}/stat").read()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"

def running():
    try:
        pid = int(open(pidfile).read())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None

if command == "-d":
    if mode == "fail":
        sys.exit("An instance of this daemon is already running")
    if mode == "hang":
        time.sleep(30)
    if mode == "no-daemon" or running():
        sys.exit(0 if mode == "no-daemon" else "An instance of this daemon is already running")
    if os.path.exists(pidfile):
        os.unlink(pidfile)
    if os.fork():
        for _ in range(500):  # the parent returns once the daemon is up
            if running():
                sys.exit(0)
            time.sleep(0.01)
        sys.exit("daemon did not come up")
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    signal.signal(signal.SIGTERM, lambda *_: (os.unlink(pidfile), os._exit(0)))
    tmp = pidfile + ".tmp"
    open(tmp, "w").write(str(os.getpid()))
    os.rename(tmp, pidfile)
    while True:
        signal.pause()

pid = running()
if pid is None or mode == "mute":
    sys.exit("Cannot find MPS control daemon process")
if command == "get_server_list":
    sys.exit(0)
if command == "quit":
    os.kill(pid, signal.SIGTERM)
    while alive(pid):
        time.sleep(0.01)
    sys.exit(0)
if command.startswith("set_default_"):
    sys.exit("refused" if mode == "refuse-settings" else 0)
sys.exit(f"unknown command {{command}}")
"""


@dataclass
class Fake:
    """The stand-in's directories and what it was asked."""

    root: Path
    state: Path
    script: Path

    @property
    def command(self) -> tuple[str, ...]:
        return (sys.executable, str(self.script), "-d")

    def behave(self, uuid: str, mode: str | None) -> None:
        path = self.state / uuid
        if mode is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(mode)

    def calls(self, command: str | None = None) -> list[dict]:
        log = self.state / "calls.log"
        lines = log.read_text().splitlines() if log.exists() else []
        calls = [json.loads(line) for line in lines]
        return [c for c in calls if command is None or c["command"] == command]

    def pid(self, uuid: str) -> int | None:
        return read_pid(str(self.root / "pipe" / uuid / PID_FILE))

    def supervisor(self, gpus=(A, B), **options) -> MpsSupervisor:
        options.setdefault("clock", Clock())
        options.setdefault("ready_wait_s", 0.02)
        return MpsSupervisor(
            gpus, str(self.root / "pipe"), str(self.root / "log"), self.command, **options
        )


def kill(pid: int) -> None:
    """SIGKILL a daemon this test started, and wait until it is gone."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def fake() -> Iterator[Fake]:
    root = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
    state = root / "state"
    state.mkdir()
    script = root / "fake-mps-control.py"
    script.write_text(FAKE.format(state=str(state)))
    made = Fake(root, state, script)
    yield made
    for uuid in (A, B):  # end the daemons this test started, by their PID
        pid = made.pid(uuid)
        if pid is not None and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


def test_one_daemon_per_gpu_starts_with_its_own_devices_and_directories(fake):
    supervisor = fake.supervisor()
    assert supervisor.unhealthy() == {
        A: "MPS control daemon not started yet",
        B: mps.DaemonState().reason,
    }
    assert supervisor.start() == {}
    starts = fake.calls("-d")
    assert [c["env"] for c in starts] == [
        {
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(fake.root / "pipe" / uuid),
            "CUDA_MPS_LOG_DIRECTORY": str(fake.root / "log" / uuid),
        }
        for uuid in (A, B)
    ]
    pids = {fake.pid(A), fake.pid(B)}
    assert None not in pids and len(pids) == 2 and all(pid_alive(p) for p in pids)
    assert (fake.root / "log" / A).is_dir()
    assert supervisor.check() == {} and len(fake.calls("-d")) == 2  # alive: left alone


def test_a_killed_daemon_is_restarted_at_once_after_a_stable_run(fake):
    clock = Clock()
    supervisor = fake.supervisor(clock=clock)
    supervisor.start()
    first = fake.pid(A)
    kill(first)
    clock.now += 61  # it ran longer than stable_s
    assert supervisor.check() == {}
    assert len(fake.calls("-d")) == 3
    assert fake.pid(A) not in (None, first) and pid_alive(fake.pid(A))
    assert fake.pid(B) is not None


def test_a_daemon_that_keeps_dying_is_restarted_with_backoff(fake):
    clock = Clock()
    supervisor = fake.supervisor([A], clock=clock, policy=Policy(base_s=2, max_s=300))
    supervisor.start()
    kill(fake.pid(A))
    clock.now += 5  # died soon after it started: a failure
    assert supervisor.check() == {
        A: f"MPS control daemon died: its process (PID {fake.pid(A)}) is gone"
    }
    clock.now += 1
    supervisor.check()
    assert len(fake.calls("-d")) == 1  # still backing off
    clock.now += 1
    assert supervisor.check() == {}
    assert len(fake.calls("-d")) == 2 and supervisor.states()[A].failures == 1


def test_a_daemon_that_stops_answering_is_unhealthy(fake):
    supervisor = fake.supervisor([A])
    supervisor.start()
    fake.behave(A, "mute")
    reason = supervisor.check()[A]
    said = "get_server_list: exit 1: Cannot find MPS control daemon process"
    assert reason == f"MPS control daemon died: {said}"


def test_a_daemon_that_cannot_start_marks_its_gpu_with_the_reason(fake):
    clock = Clock()
    fake.behave(B, "fail")
    supervisor = fake.supervisor(clock=clock, policy=Policy(base_s=10))
    reason = (
        "MPS control daemon cannot start: exit 1: An instance of this daemon is already running"
    )
    assert supervisor.start() == {B: reason}
    assert supervisor.states()[B] == DaemonState(False, 1, clock.now + 10, None, reason)
    clock.now += 9
    supervisor.check()
    assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in fake.calls("-d")] == [A, B]
    clock.now += 1
    assert supervisor.check() == {B: reason}  # tried again, failed again: waits 20 s
    assert supervisor.states()[B].retry_at == clock.now + 20
    fake.behave(B, None)
    clock.now += 20
    assert supervisor.check() == {}


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("hang", "no answer within 0.5s"),
        ("no-daemon", "started, but its control pipe does not answer (get_server_list: exit 1: "),
        ("refuse-settings", "set_default_active_thread_percentage refused: exit 1: refused"),
    ],
)
def test_each_way_a_start_fails_is_said(fake, mode, reason):
    fake.behave(A, mode)
    supervisor = fake.supervisor([A], timeout_s=0.5, ready_tries=2, active_thread_percentage=50)
    started = time.monotonic()
    got = supervisor.start()[A]
    assert time.monotonic() - started < 5
    assert got.startswith(f"MPS control daemon cannot start: {reason}"), got
    pid = fake.pid(A)
    assert pid is None or not pid_alive(pid)  # none left half-started


def test_settings_go_through_the_control_pipe(fake):
    supervisor = fake.supervisor(
        [A, B], active_thread_percentage=25, pinned_mem_limit_mib={A: 4096}
    )
    assert supervisor.start() == {}
    sent = [(c["env"]["CUDA_VISIBLE_DEVICES"], c["command"]) for c in fake.calls()]
    assert (A, "set_default_active_thread_percentage 25") in sent
    assert (A, "set_default_device_pinned_mem_limit 0 4096M") in sent
    assert (B, "set_default_device_pinned_mem_limit 0 4096M") not in sent


def test_a_daemon_left_running_is_adopted_not_started_twice(fake):
    fake.supervisor().start()
    again = fake.supervisor()
    assert again.start() == {}
    assert len(fake.calls("-d")) == 2


def test_stop_quits_every_daemon_and_starts_none_after(fake):
    supervisor = fake.supervisor()
    supervisor.start()
    pids = [fake.pid(A), fake.pid(B)]
    assert supervisor.stop() == {}
    assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in fake.calls("quit")] == [A, B]
    assert not any(pid_alive(p) for p in pids)
    assert supervisor.check() == {A: "MPS control daemon stopped", B: "MPS control daemon stopped"}
    assert len(fake.calls("-d")) == 2


def test_a_missing_program_is_a_reason_not_a_crash(tmp_path):
    supervisor = MpsSupervisor(
        [A], str(tmp_path / "p"), str(tmp_path / "l"), (str(tmp_path / "no-such-mps"), "-d")
    )
    assert supervisor.start()[A].startswith("MPS control daemon cannot start: cannot run ")


def test_gpu_names_that_would_leave_the_root_are_refused(tmp_path):
    for bad in ("../etc", "a/b", "", ".hidden"):
        with pytest.raises(ValueError, match="not a GPU UUID"):
            MpsSupervisor([bad], str(tmp_path), str(tmp_path))
    with pytest.raises(ValueError, match="active thread percentage"):
        MpsSupervisor([A], str(tmp_path), str(tmp_path), active_thread_percentage=0)


# --- the pure parts --------------------------------------------------------------------
def test_the_restart_decisions():
    policy = Policy(base_s=2, max_s=10, stable_s=60)
    assert [policy.delay(n) for n in range(6)] == [0, 2, 4, 8, 10, 10]
    up = after_start(DaemonState(), 100.0, None, policy)
    assert up == DaemonState(True, 0, 0.0, 100.0, "") and not due(up, 100.0)
    early = after_probe(up, 110.0, "gone", policy)
    assert early == DaemonState(False, 1, 112.0, None, "MPS control daemon died: gone")
    assert not due(early, 111.0) and due(early, 112.0)
    flaky = after_start(early, 112.0, None, policy)
    assert after_probe(flaky, 150.0, None, policy).failures == 1
    assert after_probe(flaky, 172.0, None, policy).failures == 0  # stable: forgiven
    late = after_probe(flaky, 200.0, "gone", policy)
    assert (late.failures, late.retry_at) == (1, 200.0)  # a stable run: again at once
    assert after_probe(early, 300.0, None, policy) is early  # not running: unchanged


def test_the_runner_reports_exit_output_and_timeouts():
    ran = run_command(
        [sys.executable, "-c", "import sys; print(sys.stdin.read()); sys.exit(3)"], {}, "hi", 5
    )
    assert (ran.code, ran.out.strip(), ran.why()) == (3, "hi", "exit 3: hi")
    slow = run_command([sys.executable, "-c", "import time; time.sleep(5)"], {}, None, 0.2)
    assert slow.code is None and slow.why() == "no answer within 0.2s"


def test_pid_files_and_processes(tmp_path):
    path = tmp_path / "pid"
    assert read_pid(str(path)) is None
    path.write_text(f"{os.getpid()}\n")
    assert read_pid(str(path)) == os.getpid() and pid_alive(os.getpid())
    path.write_text("not a pid")
    assert read_pid(str(path)) is None
    assert not pid_alive(1 << 22)
