"""Send a fuzz corpus to a real server and account for every answer.

For each request: the status code (by class), whether the body was JSON, and the CPU
the server's worker processes spent on it (the sum over their threads, from
``/proc/<pid>/task/*/schedstat``; requests go one at a time, so the difference is
that request's cost, gunicorn's and Flask's share included). Around the campaign: the
worker pids before and after (a worker that died or was killed for a timeout is
replaced by gunicorn with a new pid) and the lines the server logged meanwhile
(tracebacks, ``WORKER TIMEOUT``, ``Booting worker``). After it: one valid request
must still succeed, on the same workers. One valid request before it is not counted:
a fresh worker's first request pays for lazy imports, which is start-up cost.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from tests.fuzz.corpus import corpus

LOG_ALARMS = ("Traceback", "WORKER TIMEOUT", "Booting worker", "Worker exiting", '"error"')


@dataclass
class Target:
    """One endpoint of one running server."""

    name: str
    url: str
    base: Any  # a valid body
    master_pid: int
    log_path: Path
    verify: str | bool = True
    cert: tuple[str, str] | None = None  # a client certificate, for the extender's TLS port


@dataclass
class Result:
    target: str
    count: int = 0
    statuses: dict[str, Counter[int | str]] = field(default_factory=lambda: defaultdict(Counter))
    not_json: int = 0
    worst_cpu_ms: float = 0.0
    worst_class: str = ""
    cpu_ms_by_class: dict[str, float] = field(default_factory=dict)
    workers_before: frozenset[int] = frozenset()
    workers_after: frozenset[int] = frozenset()
    log_alarms: Counter[str] = field(default_factory=Counter)
    final_ok: bool = False
    seconds: float = 0.0

    @property
    def server_errors(self) -> int:
        return sum(
            n
            for by_code in self.statuses.values()
            for code, n in by_code.items()
            if isinstance(code, int) and code >= 500
        )

    @property
    def connection_errors(self) -> int:
        return sum(c["no answer"] for c in self.statuses.values())

    @property
    def workers_replaced(self) -> int:
        return len(self.workers_before - self.workers_after)

    @property
    def clean(self) -> bool:
        return (
            self.server_errors == 0
            and self.connection_errors == 0
            and self.not_json == 0
            and self.workers_replaced == 0
            and not self.log_alarms
            and self.final_ok
        )


def worker_pids(master: int) -> frozenset[int]:
    """The gunicorn master's children (its workers)."""
    pids: set[int] = set()
    for task in Path(f"/proc/{master}/task").glob("*"):
        try:
            pids.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return frozenset(pids)


def cpu_ns(pids: frozenset[int]) -> int:
    """CPU time of every thread of ``pids``, in nanoseconds."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _alarms(path: Path, since: int) -> Counter[str]:
    found: Counter[str] = Counter()
    try:
        with open(path, "rb") as handle:
            handle.seek(since)
            text = handle.read().decode(errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        for alarm in LOG_ALARMS:
            if alarm == '"error"':
                if '"level":"error"' in line:
                    found["error log line"] += 1
            elif alarm in line:
                found[alarm] += 1
    return found


#: A request that cost the server more CPU than this is sent again (twice) and the
#: least it cost is kept. The worker's CPU includes its background threads (the
#: extender's watches in cluster mode, the collector), which a request can coincide
#: with; an input that is expensive to handle is expensive every time.
RECHECK_CPU_MS = 20.0


def _cpu_again(
    session: requests.Session,
    target: Target,
    body: bytes,
    headers: dict[str, str],
    timeout: float,
    pids: frozenset[int],
) -> float:
    least = float("inf")
    for _ in range(2):
        before = cpu_ns(pids)
        try:
            session.post(
                target.url, data=body, headers=headers, timeout=timeout, verify=target.verify
            )
        except requests.RequestException:
            return least
        least = min(least, (cpu_ns(pids) - before) / 1e6)
    return least


def _session(target: Target) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.cert = target.cert
    return session


def run(target: Target, seed: int, count: int, timeout: float = 30.0) -> Result:
    result = Result(target.name)
    log_start = _log_size(target.log_path)
    result.workers_before = worker_pids(target.master_pid)
    session = _session(target)
    headers = {"Content-Type": "application/json"}
    # One valid request first: a fresh worker's first request pays for lazy imports
    # and its first TLS handshake, which is start-up cost, not a request's.
    session.post(
        target.url,
        data=corpus(seed, 1, target.base)[0][1],
        headers=headers,
        timeout=timeout,
        verify=target.verify,
    )
    started = time.monotonic()
    by_class: dict[str, float] = defaultdict(float)
    for cls, body in corpus(seed, count, target.base):
        pids = worker_pids(target.master_pid)
        before = cpu_ns(pids)
        try:
            response = session.post(
                target.url, data=body, headers=headers, timeout=timeout, verify=target.verify
            )
        except requests.RequestException:
            result.statuses[cls]["no answer"] += 1
            session = _session(target)
            continue
        spent = (cpu_ns(pids) - before) / 1e6
        if spent > RECHECK_CPU_MS:
            spent = min(spent, _cpu_again(session, target, body, headers, timeout, pids))
        result.count += 1
        result.statuses[cls][response.status_code] += 1
        if not response.headers.get("Content-Type", "").startswith("application/json"):
            result.not_json += 1
        by_class[cls] = max(by_class[cls], spent)
        if spent > result.worst_cpu_ms:
            result.worst_cpu_ms, result.worst_class = spent, cls
    result.cpu_ms_by_class = dict(by_class)
    result.seconds = time.monotonic() - started
    final = session.post(
        target.url,
        data=corpus(seed, 1, target.base)[0][1],
        headers=headers,
        timeout=timeout,
        verify=target.verify,
    )
    result.final_ok = final.status_code == 200
    result.workers_after = worker_pids(target.master_pid)
    time.sleep(0.2)  # let the server flush its log lines
    result.log_alarms = _alarms(target.log_path, log_start)
    return result


def table(results: list[Result]) -> str:
    """Markdown: one row per endpoint and class, then one summary row per endpoint."""
    lines = [
        "| endpoint | class | requests | answers | worst CPU (ms) |",
        "|---|---|---:|---|---:|",
    ]
    for result in results:
        for cls, codes in result.statuses.items():
            answers = ", ".join(f"{code}: {n}" for code, n in sorted(codes.items(), key=str))
            lines.append(
                f"| {result.target} | {cls} | {sum(codes.values())} | {answers} | "
                f"{result.cpu_ms_by_class.get(cls, 0.0):.1f} |"
            )
    lines += [
        "",
        "| endpoint | requests | 5xx | no answer | non-JSON bodies | workers replaced "
        "| log alarms | worst CPU (ms, class) | valid request after | seconds |",
        "|---|---:|---:|---:|---:|---:|---|---|---|---:|",
    ]
    for r in results:
        alarms = ", ".join(f"{k}: {v}" for k, v in r.log_alarms.items()) or "none"
        lines.append(
            f"| {r.target} | {r.count} | {r.server_errors} | {r.connection_errors} | "
            f"{r.not_json} | {r.workers_replaced} of {len(r.workers_before)} | {alarms} | "
            f"{r.worst_cpu_ms:.1f} ({r.worst_class}) | {'200' if r.final_ok else 'FAILED'} | "
            f"{r.seconds:.0f} |"
        )
    return "\n".join(lines)


def environment_note() -> str:
    return f"{os.cpu_count()} CPUs; CPU per request is the server's worker processes' time"
