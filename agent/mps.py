"""One CUDA MPS control daemon per shared GPU, kept running by the agent.

On a node shared in ``mps`` mode each GPU gets its own ``nvidia-cuda-mps-control -d``,
started with ``CUDA_VISIBLE_DEVICES=<its UUID>`` and its own pipe and log directories
(``<pipe_root>/<UUID>``, ``<log_root>/<UUID>``; ``CUDA_MPS_PIPE_DIRECTORY``,
``CUDA_MPS_LOG_DIRECTORY``), so a sick GPU's daemon takes down no other GPU's shares.
This is how NVIDIA's k8s-device-plugin runs MPS (one daemon per resource, there), and
like it the daemon is configured through its control pipe once started
(``set_default_active_thread_percentage``, ``set_default_device_pinned_mem_limit``)
and is healthy while the pipe answers (``get_server_list``; the daemon also writes
its PID to ``nvidia-cuda-mps-control.pid`` in the pipe directory). A share's own
memory limit is the client's: the device plugin's Allocate sets it in each container
(agent/deviceplugin/devices.py, ``share_answer``).

:class:`MpsSupervisor` starts the daemons, checks them (:meth:`~MpsSupervisor.check`,
called by whoever runs the loop), restarts one that died, at once after a stable run
and with exponential backoff while it keeps failing, and says which GPUs have no
daemon and why (:meth:`~MpsSupervisor.unhealthy`): the device plugin marks those
Unhealthy. A daemon that already answers on a GPU's pipe (left by the agent's previous
container) is adopted, not started twice. The decisions are pure functions of a
:class:`DaemonState`; the processes are run by an injected runner.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import IO

from gpu_scheduler.textclip import clip_text

log = logging.getLogger("gpu_scheduler.agent")

CONTROL = "nvidia-cuda-mps-control"
#: The control daemon writes its PID here, in its pipe directory.
PID_FILE = "nvidia-cuda-mps-control.pid"
PROBE = "get_server_list"
DEFAULT_TIMEOUT_S = 10.0
#: A GPU UUID names a directory: nothing that could climb out of the root.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_OUTPUT_TAIL = 2000


# --- running a command: the edge ------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ran:
    """A command's end: its exit code (None: it could not run, or ran past its time),
    its output, and in ``error`` why it has no exit code."""

    code: int | None
    out: str = ""
    err: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.code == 0

    def why(self) -> str:
        """What went wrong, in words (the last of its error output)."""
        if self.code is None:
            return self.error
        said = clip_text(" ".join((self.err.strip() or self.out.strip()).split()), 300)
        return f"exit {self.code}" + (f": {said}" if said else "")


#: ``runner(argv, env, stdin, timeout_s)``: run ``argv`` with exactly ``env``, feeding
#: it ``stdin`` (None: nothing), and never raise.
Runner = Callable[[Sequence[str], Mapping[str, str], "str | None", float], Ran]


def run_command(
    argv: Sequence[str], env: Mapping[str, str], stdin: str | None, timeout_s: float
) -> Ran:
    """The real runner. Output goes to files, not pipes: ``-d`` forks a daemon that
    may keep them open, and a pipe would then never end."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            done = subprocess.run(
                list(argv),
                env=dict(env),
                input=stdin.encode() if stdin is not None else None,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return Ran(None, _tail(out), _tail(err), f"no answer within {timeout_s:g}s")
        except OSError as exc:
            return Ran(None, error=f"cannot run {argv[0]}: {exc.strerror or exc}")
        return Ran(done.returncode, _tail(out), _tail(err))


def _tail(file: IO[bytes]) -> str:
    file.seek(0, os.SEEK_END)
    file.seek(max(0, file.tell() - _OUTPUT_TAIL))
    return file.read().decode(errors="replace")


# --- the decisions: pure ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Policy:
    """Restarts: a daemon that failed ``n`` times in a row waits ``base_s * 2**(n-1)``
    (at most ``max_s``) before the next start; one that dies after running
    ``stable_s`` is restarted at once and its count starts again."""

    base_s: float = 2.0
    max_s: float = 300.0
    stable_s: float = 60.0

    def delay(self, failures: int) -> float:
        return 0.0 if failures <= 0 else min(self.max_s, self.base_s * 2 ** min(failures - 1, 30))


@dataclass(frozen=True, slots=True)
class DaemonState:
    """One GPU's daemon: running or not, the failures in a row, when it may be started
    again, since when it runs (monotonic), and why it does not, in words."""

    running: bool = False
    failures: int = 0
    retry_at: float = 0.0
    up_since: float | None = None
    reason: str = "MPS control daemon not started yet"


def failed(state: DaemonState, now: float, reason: str, policy: Policy) -> DaemonState:
    failures = state.failures + 1
    return DaemonState(False, failures, now + policy.delay(failures), None, reason)


def after_start(state: DaemonState, now: float, error: str | None, policy: Policy) -> DaemonState:
    """The state once a start ended (``error`` None: the daemon runs and answers)."""
    if error is not None:
        return failed(state, now, f"MPS control daemon cannot start: {error}", policy)
    return DaemonState(True, state.failures, 0.0, now, "")


def after_probe(state: DaemonState, now: float, error: str | None, policy: Policy) -> DaemonState:
    """The state once a running daemon's pipe was asked (``error`` None: it answered).
    A daemon that ran ``stable_s`` is due again at once when it dies."""
    if not state.running:
        return state
    stable = state.up_since is not None and now - state.up_since >= policy.stable_s
    if error is None:
        return replace(state, failures=0) if stable and state.failures else state
    base = replace(state, failures=0) if stable else state
    dead = failed(base, now, f"MPS control daemon died: {error}", policy)
    return replace(dead, retry_at=now) if stable else dead


def due(state: DaemonState, now: float) -> bool:
    return not state.running and now >= state.retry_at


# --- the supervisor: sequences the I/O ------------------------------------------------
class MpsSupervisor:
    """The daemons of ``gpus`` (UUIDs). ``command`` starts one (the same program without
    ``-d`` is its control client); ``clock`` is monotonic seconds; ``runner`` runs a
    command (:func:`run_command`). ``env``: the environment the daemons start from
    (default: the agent's). Thread-safe: :meth:`check` and :meth:`stop` run one at a
    time, and :meth:`unhealthy` may be asked from any thread meanwhile."""

    def __init__(
        self,
        gpus: Collection[str],
        pipe_root: str,
        log_root: str,
        command: Sequence[str] = (CONTROL, "-d"),
        clock: Callable[[], float] = time.monotonic,
        runner: Runner = run_command,
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        policy: Policy | None = None,
        active_thread_percentage: int | None = None,
        pinned_mem_limit_mib: Mapping[str, int] | None = None,
        ready_tries: int = 10,
        ready_wait_s: float = 0.1,
    ) -> None:
        bad = [g for g in gpus if not _SAFE_NAME.match(g)]
        if bad:
            raise ValueError(f"not a GPU UUID that can name a directory: {bad[0]!r}")
        if active_thread_percentage is not None and not 0 < active_thread_percentage <= 100:
            raise ValueError(f"active thread percentage {active_thread_percentage} not in 1..100")
        self.gpus = tuple(sorted(set(gpus)))
        self.pipe_root, self.log_root = pipe_root, log_root
        self.command = tuple(command)
        self.control = tuple(a for a in self.command if a != "-d")
        self.clock, self.runner = clock, runner
        self.base_env = dict(os.environ if env is None else env)
        self.timeout_s = timeout_s
        self.policy = policy or Policy()
        self.active_thread_percentage = active_thread_percentage
        self.pinned_mem_limit_mib = dict(pinned_mem_limit_mib or {})
        self.ready_tries, self.ready_wait_s = max(1, ready_tries), ready_wait_s
        self._states = {uuid: DaemonState() for uuid in self.gpus}
        self._lock = threading.Lock()  # the states
        self._busy = threading.Lock()  # check() and stop(): one at a time
        self._stopped = False

    # --- what it tells -------------------------------------------------------------
    def pipe_dir(self, uuid: str) -> str:
        return os.path.join(self.pipe_root, uuid)

    def log_dir(self, uuid: str) -> str:
        return os.path.join(self.log_root, uuid)

    def env(self, uuid: str) -> dict[str, str]:
        """The environment of ``uuid``'s daemon and of its control client."""
        return {
            **self.base_env,
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir(uuid),
            "CUDA_MPS_LOG_DIRECTORY": self.log_dir(uuid),
        }

    def states(self) -> dict[str, DaemonState]:
        with self._lock:
            return dict(self._states)

    def unhealthy(self) -> dict[str, str]:
        """The GPUs whose daemon is not running, each with why in words."""
        with self._lock:
            return {u: s.reason for u, s in self._states.items() if not s.running}

    # --- what it does --------------------------------------------------------------
    def start(self) -> dict[str, str]:
        """Start every daemon (adopting those already running). Returns :meth:`unhealthy`."""
        return self.check()

    def check(self) -> dict[str, str]:
        """Ask each running daemon whether it answers; start those that are due (not
        running and past their backoff). Returns :meth:`unhealthy`."""
        with self._busy:
            if self._stopped:
                return self.unhealthy()
            for uuid in self.gpus:
                state = self.states()[uuid]
                if state.running:
                    error = self._silent(uuid)
                    state = after_probe(state, self.clock(), error, self.policy)
                    self._set(uuid, state)
                if due(state, self.clock()):
                    self._start(uuid, state)
        return self.unhealthy()

    def stop(self) -> dict[str, str]:
        """Quit every daemon that runs (``echo quit | nvidia-cuda-mps-control``); no
        daemon is started after this. Returns the GPUs whose daemon did not quit."""
        errors: dict[str, str] = {}
        with self._busy:
            self._stopped = True
            for uuid, state in self.states().items():
                if state.running:
                    ran = self.send(uuid, "quit")
                    if not ran.ok:
                        errors[uuid] = f"MPS control daemon did not quit: {ran.why()}"
                self._set(uuid, DaemonState(reason="MPS control daemon stopped"))
        for uuid, error in errors.items():
            log.warning(error, extra={"uuid": uuid})
        log.info("MPS control daemons stopped", extra={"gpus": len(self.gpus)})
        return errors

    def send(self, uuid: str, command: str) -> Ran:
        """One command to ``uuid``'s daemon through its control pipe."""
        return self.runner(self.control, self.env(uuid), command + "\n", self.timeout_s)

    # --- inside --------------------------------------------------------------------
    def _silent(self, uuid: str) -> str | None:
        """Why ``uuid``'s daemon does not answer, None when it does. Its PID file first:
        a dead daemon's pipe may block a client until the timeout."""
        pid = read_pid(os.path.join(self.pipe_dir(uuid), PID_FILE))
        if pid is not None and not pid_alive(pid):
            return f"its process (PID {pid}) is gone"
        probe = self.send(uuid, PROBE)
        return None if probe.ok else f"{PROBE}: {probe.why()}"

    def _start(self, uuid: str, state: DaemonState) -> None:
        adopted = self._silent(uuid) is None
        error = None if adopted else self._launch(uuid)
        if error is None:
            error = self._configure(uuid)
            if error is not None:
                self.send(uuid, "quit")
        new = after_start(state, self.clock(), error, self.policy)
        self._set(uuid, new)
        extra = {"uuid": uuid, "pipe_dir": self.pipe_dir(uuid)}
        if new.running:
            what = "adopted" if adopted else "started"
            log.info(f"MPS control daemon {what}", extra={**extra, "failures": state.failures})
        else:
            retry = round(new.retry_at - self.clock(), 1)
            log.warning(new.reason, extra={**extra, "failures": new.failures, "retry_in_s": retry})

    def _launch(self, uuid: str) -> str | None:
        """Start ``uuid``'s daemon and wait until its pipe answers; why not, in words."""
        try:
            os.makedirs(self.pipe_dir(uuid), mode=0o755, exist_ok=True)
            os.makedirs(self.log_dir(uuid), mode=0o755, exist_ok=True)
        except OSError as exc:
            return f"cannot make its directories: {exc}"
        ran = self.runner(self.command, self.env(uuid), None, self.timeout_s)
        if not ran.ok:
            return ran.why()
        probe = ran
        for attempt in range(self.ready_tries):
            if attempt:
                time.sleep(self.ready_wait_s)
            probe = self.send(uuid, PROBE)
            if probe.ok:
                return None
        self.send(uuid, "quit")
        return f"started, but its control pipe does not answer ({PROBE}: {probe.why()})"

    def _configure(self, uuid: str) -> str | None:
        commands = []
        if self.active_thread_percentage is not None:
            commands.append(f"set_default_active_thread_percentage {self.active_thread_percentage}")
        limit = self.pinned_mem_limit_mib.get(uuid)
        if limit is not None:
            commands.append(f"set_default_device_pinned_mem_limit 0 {limit}M")
        for command in commands:
            ran = self.send(uuid, command)
            if not ran.ok:
                return f"{command.split()[0]} refused: {ran.why()}"
        return None

    def _set(self, uuid: str, state: DaemonState) -> None:
        with self._lock:
            self._states[uuid] = state


def read_pid(path: str) -> int | None:
    """The PID in a daemon's PID file; None when there is none to read."""
    try:
        with open(path, "rb") as file:
            text = file.read(32).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and 0 < int(text) < 1 << 22 else None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False
    except OSError:
        pass
    else:
        return stat.rpartition(b")")[2].split()[:1] != [b"Z"]
    try:  # no /proc here
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
