"""GPU health over time in the agent: the XID table, the tracker (an XID marks a GPU at
once; a quiet period of good reads clears it), the fake file's scripted XIDs and driver
mismatch through the agent's read, and /healthz after NVML stops answering."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from agent.fake import FakeBackend
from agent.health import HealthTracker
from agent.inventory import InventoryError
from agent.labels import desired_state
from agent.loop import Agent, AgentConfig
from agent.xid import DEFAULT_IGNORED, XidPolicy, describe, parse_xids
from gpu_scheduler import contract
from gpu_scheduler.opsserver import create_app
from tests.unit.test_agent_loop import FIXTURES, Clock


# --- the table ------------------------------------------------------------------------
def test_the_default_ignore_list_is_the_device_plugins():
    policy = XidPolicy()
    assert {13, 31, 43, 45, 68, 109} == DEFAULT_IGNORED
    assert not any(policy.critical(x) for x in (13, 31, 43, 45, 68, 109))
    assert all(policy.critical(x) for x in (48, 63, 64, 74, 79, 92, 94, 95, 119, 140))
    assert policy.critical(4242)  # a number nobody listed counts


def test_the_flags_replace_and_take_off_the_list():
    assert XidPolicy.configured("13, 31", None).ignored == {13, 31}
    assert XidPolicy.configured("", None).ignored == frozenset()
    assert XidPolicy.configured(None, "43").ignored == DEFAULT_IGNORED - {43}
    with pytest.raises(ValueError, match="--xid-ignore: 'x13' is not an XID number"):
        XidPolicy.configured("x13", None)
    with pytest.raises(ValueError, match="--xid-critical: '0'"):
        parse_xids("0", "--xid-critical")
    assert describe(79) == "XID 79 (GPU has fallen off the bus)"
    assert describe(4242) == "XID 4242" and describe(1 << 70) == "XID (out of range)"


# --- the tracker ----------------------------------------------------------------------
def inventory(**xids):
    data = yaml.safe_load((FIXTURES / "h100x8.yaml").read_text())
    for index, xid in xids.items():
        data["gpus"][int(index[1:])]["xid"] = xid
    return data


def test_an_xid_marks_at_once_and_a_quiet_period_of_good_reads_clears_it():
    tracker = HealthTracker(quiet_s=60)
    read = FakeBackend(FIXTURES / "h100x8.yaml").read()
    uuid = read.gpus[2].uuid
    assert not tracker.xid(read.gpus[0].uuid, 13, 1000.0, 0.0)  # an application error
    assert tracker.xid(uuid, 79, 1000.0, 0.0)
    marked = tracker.apply(read, 1.0).gpus[2]
    assert (marked.healthy, marked.xid, marked.since) == (False, 79, "1970-01-01T00:16:40Z")
    assert marked.reason == "GPU lost: XID 79 (GPU has fallen off the bus)"
    assert tracker.apply(read, 59.0).gpus[2].healthy is False
    tracker.xid(uuid, 48, 1050.0, 50.0)  # another critical one: the period starts again
    assert tracker.apply(read, 100.0).gpus[2].healthy is False
    again = tracker.apply(read, 110.0).gpus[2]
    assert again.healthy and again.xid is None and not tracker.marked()


def test_a_bad_read_restarts_the_period_and_keeps_its_own_reason():
    tracker = HealthTracker(quiet_s=60)
    read = FakeBackend(FIXTURES / "h100x8-unhealthy.yaml").read()
    sick = next(g for g in read.gpus if not g.healthy)
    tracker.xid(sick.uuid, 48, 0.0, 0.0)
    for now in (100.0, 500.0):
        gpu = next(g for g in tracker.apply(read, now).gpus if g.uuid == sick.uuid)
        assert not gpu.healthy and gpu.reason == sick.reason and gpu.xid == 48


def test_without_recovery_a_mark_stays_and_a_driver_reload_clears_every_mark():
    tracker = HealthTracker(quiet_s=1, recover=False)
    read = FakeBackend(FIXTURES / "h100x8.yaml").read()
    tracker.xid(read.gpus[0].uuid, 95, 0.0, 0.0)
    assert not tracker.apply(read, 10_000.0).gpus[0].healthy
    tracker.driver_reloaded()
    assert tracker.apply(read, 10_001.0).gpus[0].healthy


def test_garbage_is_bounded():
    tracker = HealthTracker()
    for i in range(1000):
        tracker.xid(f"GPU-{i}", 79, 0.0, 0.0)
    assert len(tracker.marked()) == 256


# --- through the agent's read, from the fake file ---------------------------------------
def agent_on(path: Path, clock: Clock, **config) -> Agent:
    cfg = AgentConfig(node_name="gpu-1", recovery_quiet_s=30, unhealthy_after_s=120, **config)
    return Agent(cfg, FakeBackend(path), None, clock=clock, monotonic=clock.mono)


def test_a_scripted_xid_is_published_with_the_gpu_and_recovers_after_the_quiet_period(tmp_path):
    path, clock = tmp_path / "gpus.yaml", Clock()
    path.write_text(yaml.safe_dump(inventory(g3=79)))
    agent = agent_on(path, clock)
    detail = json.loads(desired_state(agent.read_inventory()).annotations[contract.ANN_GPUS])
    sick = [g for g in detail if not g["healthy"]]
    assert [(g["index"], g["xid"], g["since"]) for g in sick] == [(3, 79, "2026-11-29T14:00:00Z")]
    assert "fallen off the bus" in sick[0]["reason"]
    path.write_text(yaml.safe_dump(inventory()))  # the XID stops
    clock.now += timedelta(seconds=29)
    assert not agent.read_inventory().gpus[3].healthy
    clock.now += timedelta(seconds=2)
    assert agent.read_inventory().gpus[3].healthy


def test_an_application_xid_leaves_the_gpu_healthy(tmp_path):
    path, clock = tmp_path / "gpus.yaml", Clock()
    path.write_text(yaml.safe_dump(inventory(g1=13)))
    assert all(g.healthy for g in agent_on(path, clock).read_inventory().gpus)
    path.write_text(yaml.safe_dump(inventory(g1=13)))
    agent = agent_on(path, clock, xid_policy=XidPolicy.configured(None, "13"))
    assert not agent.read_inventory().gpus[1].healthy


def test_a_driver_mismatch_fails_reads_then_healthz_turns_503_and_a_good_read_clears_marks(
    tmp_path,
):
    path, clock = tmp_path / "gpus.yaml", Clock()
    path.write_text(yaml.safe_dump(inventory(g0=79)))
    agent = agent_on(path, clock)
    client = create_app(agent.ready, agent.alive).test_client()
    assert not agent.read_inventory().gpus[0].healthy
    broken = inventory() | {"driverMismatch": True}
    path.write_text(yaml.safe_dump(broken))
    with pytest.raises(InventoryError, match="Driver/library version mismatch"):
        agent.read_inventory()
    clock.now += timedelta(seconds=119)
    assert client.get("/healthz").status_code == 200
    clock.now += timedelta(seconds=2)
    answer = client.get("/healthz")
    assert answer.status_code == 503 and "no good NVML read for 121s" in answer.get_json()["detail"]
    path.write_text(yaml.safe_dump(inventory()))  # a new container, the new driver
    assert all(g.healthy for g in agent.read_inventory().gpus)  # old marks gone
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("bad", [0, -1, 1 << 16, "79", True, 7.9])
def test_a_fake_files_xid_must_be_an_xid_number(tmp_path, bad):
    path = tmp_path / "gpus.yaml"
    path.write_text(yaml.safe_dump(inventory(g0=bad)))
    with pytest.raises(InventoryError, match="xid: expected an XID number"):
        FakeBackend(path).read()


def test_an_event_wakes_the_loop_but_not_while_it_backs_off(tmp_path):
    import threading
    import time

    path, clock = tmp_path / "gpus.yaml", Clock()
    path.write_text(yaml.safe_dump(inventory()))
    agent = agent_on(path, clock)
    agent.wake = threading.Event()
    agent.wake.set()  # the NVML event loop marked a GPU
    started = time.monotonic()
    agent._sleep(60.0, failures=0)
    assert time.monotonic() - started < 1 and not agent.wake.is_set()
    agent.wake.set()
    agent.stop.set()  # backing off: the stop (here already set) ends the wait, not the event
    agent._sleep(60.0, failures=2)
    assert agent.wake.is_set()
