"""The scale benches' pure parts: the big lab's pods (tests/bench/scale_lab.py) and
the memory sampler's reading of /proc and its summary (tests/bench/relist_memory.py)."""

from __future__ import annotations

import json

import pytest

from extender.records import pod_record
from tests.bench import relist_memory as rm
from tests.bench import scale_lab as lab

MIB = 1024 * 1024


# --- scale_lab -------------------------------------------------------------------------
def test_pods_are_bound_deterministic_and_spread_over_the_namespaces():
    pods = [lab.pod_object(i, lab.node_name(i % 7)) for i in range(40)]
    assert pods == [lab.pod_object(i, lab.node_name(i % 7)) for i in range(40)]
    assert {p["metadata"]["namespace"] for p in pods} == {
        lab.namespace_name(i) for i in range(lab.NAMESPACES)
    }
    assert all(p["spec"]["nodeName"] == lab.node_name(i % 7) for i, p in enumerate(pods))
    assert len({p["metadata"]["name"] for p in pods}) == 40


def test_a_third_of_the_pods_limit_gpus_and_the_extender_reads_them():
    pods = [lab.pod_object(i, "n1") for i in range(300)]
    gpu = [p for p in pods if lab.pod_gpus(int(p["metadata"]["name"][-6:]))]
    assert len(gpu) == 100
    for i, pod in enumerate(pods):
        pod["metadata"]["uid"] = f"uid-{i}"
        found = pod_record(pod)
        if lab.pod_gpus(i):
            assert found is not None and found[1].gpus == lab.pod_gpus(i)
            assert found[1].node == "n1"
        else:
            assert found is None  # a CPU pod without a group: nothing to keep
    sizes = {lab.pod_gpus(i) for i in range(0, 300, lab.GPU_EVERY)}
    assert sizes == set(lab.GPU_SIZES)


def test_the_body_is_compact_json_of_realistic_content():
    body = lab.pod_body(lab.pod_object(0, "n1"))
    pod = json.loads(body)
    # What we send; the API server's defaults and managedFields bring it to
    # ~9.2 KiB listed on the 1.37 lab, measured by scale_lab.listed_pod_bytes.
    assert 3300 <= len(body) <= 4000
    assert b'", "' not in body and b'": ' not in body  # no separators' spaces
    assert "priorityClassName" not in pod["spec"]
    assert len(pod["spec"]["containers"]) == 2 and len(pod["spec"]["initContainers"]) == 1
    main = pod["spec"]["containers"][0]
    assert len(main["env"]) >= 10 and main["volumeMounts"] and pod["spec"]["volumes"]
    assert "ownerReferences" not in pod["metadata"]  # the lab's GC would delete them


def test_gpu_nodes_are_named_in_order():
    node = lab.gpu_node(12)
    assert node["metadata"]["name"] == "scale-node-00012"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


# --- relist_memory: /proc ---------------------------------------------------------------
STATUS = """Name:\tgunicorn
State:\tS (sleeping)
Pid:\t4242
PPid:\t4241
VmPeak:\t  912340 kB
VmHWM:\t  262144 kB
VmRSS:\t  131072 kB
RssAnon:\t  100000 kB
Threads:\t12
"""


def test_status_fields_are_read_in_bytes():
    fields = rm.parse_kb_fields(STATUS)
    assert fields["VmRSS"] == 128 * MIB
    assert fields["VmHWM"] == 256 * MIB
    assert "Threads" not in fields and "Pid" not in fields


def test_the_parent_pid_is_read_past_a_command_with_spaces_and_parentheses():
    assert rm.parse_ppid("4242 (python) S 4241 4242 4242 0 -1") == 4241
    assert rm.parse_ppid("77 (gunicorn: (worker) [x]) R 1 77 77 0 -1") == 1


def test_descendants_root_first_and_nothing_else():
    parents = {10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 21: 20}
    assert rm.descendants(10, parents) == [10, 11, 12, 13]
    assert rm.descendants(21, parents) == [21]


def test_read_memory_of_this_process():
    import os

    memory = rm.read_memory(os.getpid(), pss=True)
    assert memory is not None
    assert 0 < memory["VmRSS"] <= memory["VmHWM"]
    assert memory["Pss"] > 0
    assert rm.read_memory(2**22 + 12345, pss=False) is None  # beyond pid_max: gone


# --- relist_memory: the summary ---------------------------------------------------------
def sample(t, master, worker, hwm=None):
    memory = {1: {"VmRSS": master * MIB, "VmHWM": master * MIB, "Pss": master * MIB // 2}}
    if worker is not None:
        memory[2] = {
            "VmRSS": worker * MIB,
            "VmHWM": (hwm or worker) * MIB,
            "Pss": worker * MIB,
        }
    return rm.Sample(t, memory)


def test_summary_peak_hwm_and_steady_per_process_and_summed():
    samples = [
        sample(0.0, 30, None),
        sample(1.0, 40, 100),
        sample(2.0, 40, 300, hwm=320),  # the relist: a peak between samples too
        sample(10.0, 40, 150, hwm=320),
        sample(14.0, 40, 160, hwm=320),
        sample(16.0, 40, 170, hwm=320),
    ]
    summary = rm.summarize("after", samples, {1: "master", 2: "worker"}, 5.0, steady_s=5)
    worker = summary.processes["worker"]
    assert worker.peak_rss == 300 * MIB and worker.hwm == 320 * MIB
    assert worker.steady_rss == 165 * MIB  # mean of t=14 and t=16 (the last 5 s)
    assert worker.steady_pss == 165 * MIB
    assert summary.processes["master"].steady_pss == 20 * MIB
    total = summary.total
    assert total.peak_rss == 340 * MIB  # the highest sum in one sample
    assert total.hwm == 360 * MIB  # the marks added: an upper bound
    assert total.steady_rss == 205 * MIB and total.steady_pss == 185 * MIB
    rows = rm.table([summary], "test").splitlines()
    assert len(rows) == 2 + 3
    assert rows[-1].startswith("| after | test | master+worker | 5.0 | 340 | 360 | 205 | 185 |")


def test_summary_needs_samples():
    with pytest.raises(ValueError):
        rm.summarize("x", [], {}, None)


def test_listed_lines_from_the_extender_log():
    log = "\n".join(
        [
            "[2026-12-01 gunicorn] Booting worker",
            json.dumps({"msg": "cache listed", "kind": "pods", "count": 5, "seconds": 1.5}),
            json.dumps({"msg": "serving", "kind": "x"}),
            "not json {",
        ]
    )
    assert rm.listed_lines(log) == [{"kind": "pods", "count": 5, "seconds": 1.5}]


def test_a_tree_is_a_source_checkout(tmp_path):
    name, folder = rm.parse_tree(f"now={rm.ROOT}")
    assert (name, folder) == ("now", rm.ROOT)
    with pytest.raises(Exception, match="not a gpu-scheduler source tree"):
        rm.parse_tree(f"x={tmp_path}")
