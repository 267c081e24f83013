"""Two extender replicas behind a Service, as the chart runs them (issue 49).

Each replica keeps its own picks: the pods its filter answered one node for, counted
there until bound. A gang's members are all filtered before any is bound, so they pack
only if one replica answers them all. The chart's Service sets `sessionAffinity:
ClientIP`, so kube-proxy sends every connection of kube-scheduler's leader (one
address) to the replica it first reached, while that one accepts connections.

The lab runs no kube-proxy: a TCP proxy of the test's (tests/e2e/faults.py) stands in
for the Service, routing new connections by that rule, in front of two extender
processes with the install's TLS; kube-scheduler calls the proxy. While a gang of four
4-GPU pods is placed, every idle connection is closed every 20 ms, so kube-scheduler
reconnects between calls (another gang is placed until it did so within one gang): the
gang still fills two 8-GPU nodes, not four, and every connection went to one replica.
Then that replica stops, and the next gang is placed by the other.

Upstream PodGroups: Kubernetes 1.37 with GenericWorkload (skipped below).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from lab.processes import free_port
from lab.stack import Stack, scheduler_config, start_stack
from tests.e2e.faults import Proxy
from tests.e2e.kube import unique
from tests.e2e.test_gangs import gang_of_four, namespace, nodes, upstream_gangs

__all__ = ["namespace", "upstream_gangs"]  # fixtures, bound to this module's stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory, control_plane_binary) -> Iterator[Stack]:
    stack = start_stack(tmp_path_factory.mktemp("replicas"), binary=control_plane_binary)
    try:
        second = free_port()
        stack.start_extender_replica("extender-b", second, free_port())
        service = Proxy([stack.extender_port, second], affinity="ClientIP").start()
        stack.service = service
        stack.cluster.stop_process("gpu-scheduler")
        config = scheduler_config(f"https://{service.address}", client_dir=stack.pki / "scheduler")
        stack.cluster.start_scheduler("gpu-scheduler", config)
        yield stack
        service.stop()
    finally:
        stack.stop()


def test_a_gang_packs_across_reconnects_on_one_replica_and_fails_over(
    stack, namespace, upstream_gangs
):
    service: Proxy = stack.service
    before = dict(service.reached)
    stop = threading.Event()

    def force_close() -> None:
        while not stop.wait(0.02):
            service.reset_idle()

    # kube-scheduler calls a gang's members back to back; on a loaded machine the
    # closer may find no idle moment in one gang, so up to four gangs, until one
    # reconnected. Every gang must pack, and every connection reach one replica.
    closer = threading.Thread(target=force_close, daemon=True)
    closer.start()
    reconnected = False
    try:
        for gangs in range(1, 5):
            case = unique("replicas")
            empty = nodes(stack, case, 4)
            ahead = sum(service.reached.values())
            used = gang_of_four(stack, namespace, upstream_gangs, case, already=4 * (gangs - 1))
            assert len(used) == 2 and used <= set(empty), used
            reconnected = sum(service.reached.values()) - ahead >= 2
            if reconnected:
                break
    finally:
        stop.set()
        closer.join(5)
    reached = {port: n - before[port] for port, n in service.reached.items()}
    print(f"connections per replica while {gangs} gang(s) were placed: {reached}")
    assert sorted(reached.values())[0] == 0, f"both replicas were called: {reached}"
    assert reconnected, f"kube-scheduler never reconnected within a gang: {reached}"
    # The replica that answered goes away: the other takes the next gang.
    (answered,) = [port for port, n in reached.items() if n]
    name = "extender" if answered == stack.extender_port else "extender-b"
    stack.cluster.stop_process(name)
    service.reset()
    case = unique("failover")
    empty = nodes(stack, case, 4)
    before = dict(service.reached)
    used = gang_of_four(stack, namespace, upstream_gangs, case, already=4 * gangs)
    assert len(used) == 2 and used <= set(empty), used
    (other,) = set(service.reached) - {answered}
    assert service.reached[other] > before[other]
