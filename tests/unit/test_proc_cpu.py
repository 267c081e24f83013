"""The benches' CPU accounting (tests/bench/proc_cpu.py): which process is which
component, a /proc stat line's CPU time, and the table of CPU a pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import proc_cpu
from tests.bench.e2e_throughput import cpu_table, paired, unstolen


def test_components_are_told_by_their_command_line():
    binary = "/work/.cache/k8s/v1.37.2-x/k8s"
    assert proc_cpu.component([binary, "kube-scheduler", "--config=x"]) == "kube-scheduler"
    assert proc_cpu.component([binary, "etcd", "--data-dir=x"]) == "etcd"
    ours = ["/v/bin/python", "-m", "gpu_scheduler.cli", "extender", "--port=1"]
    assert proc_cpu.component(ours) == proc_cpu.OURS
    assert proc_cpu.component(["/v/bin/python", "/tmp/x/bare.py", "1", "4"]) == proc_cpu.BARE
    assert proc_cpu.component(["/v/bin/python", "-m", "gpu_scheduler.cli", "webhook"]) is None
    assert proc_cpu.component(["bash"]) is None


def test_cpu_time_is_read_past_a_name_with_spaces_and_parentheses():
    # pid (comm) state ppid ... utime(14) stime(15): the name itself holds ") ("
    rest = "S 1 2 3 4 5 6 7 8 9 10 250 40 0 0 20 0 1"
    assert proc_cpu.cpu_ticks(f"123 (a) (b c) {rest}") == 290


def test_a_snapshot_sums_processes_by_component(tmp_path: Path):
    def process(pid: int, argv: list[str], utime: int, stime: int) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
        (d / "stat").write_text(f"{pid} (x) S 1 2 3 4 5 6 7 8 9 10 {utime} {stime} 0 0")

    ticks = proc_cpu.TICKS
    process(10, ["/k8s", "kube-scheduler"], ticks, 0)
    process(11, ["/py", "-m", "gpu_scheduler.cli", "extender"], ticks, ticks)
    process(12, ["/py", "-m", "gpu_scheduler.cli", "extender"], 0, ticks)  # a worker
    process(13, ["bash"], 5 * ticks, 0)
    (tmp_path / "self").mkdir()
    # user nice system idle iowait irq softirq steal: one second stolen, and busy
    (tmp_path / "stat").write_text(f"cpu  {3 * ticks} 0 {ticks} {4 * ticks} 0 0 0 {ticks} 0 0\n")
    snap = proc_cpu.snapshot(tmp_path)
    assert snap.by_component == {"kube-scheduler": 1.0, proc_cpu.OURS: 3.0}
    assert (snap.busy, snap.total, snap.stolen) == (5.0, 9.0, 1.0)

    later = proc_cpu.Snapshot({"kube-scheduler": 3.0, proc_cpu.OURS: 4.0}, 9.0, 13.0, 2.0)
    per_pod = proc_cpu.per_item_ms(later.minus(snap), 100)
    assert per_pod == {
        "extender (ours)": 10.0,
        "kube-scheduler": 20.0,
        "machine busy": 1.0,
        "stolen": 0.25,
    }


def test_the_cpu_table_gives_medians_of_the_rounds_per_variant():
    cpu = {
        "bare": [
            {"kube-scheduler": 2.0, proc_cpu.BARE: 1.0, "machine busy": 0.8, "stolen": 0.1},
            {"kube-scheduler": 4.0, proc_cpu.BARE: 3.0, "machine busy": 0.9, "stolen": 0.3},
        ],
        "without": [{"kube-scheduler": 1.0, "machine busy": 0.5}],
        "ours-prio": [],
    }
    table = cpu_table(cpu)
    header = "| variant | extender (bare) | kube-scheduler | all of these | machine busy | stolen |"
    assert header in table
    assert "| bare | 2.00 | 3.00 | 5.00 | 85% | 20% |" in table
    assert "| without | 0.00 | 1.00 | 1.00 | 50% | 0% |" in table
    assert "ours-prio" not in table


def test_ratios_are_paired_round_by_round():
    runs = {"bare": [100.0, 50.0, 80.0], "ours": [90.0, 40.0, 80.0], "without": []}
    assert paired(runs, "bare") == "ours ÷ bare, round by round: 0.90, 0.80, 1.00; median 0.90"
    assert paired({"ours": [1.0]}, "bare") == ""


def test_a_rate_is_adjusted_for_the_cores_the_hypervisor_took():
    # 80% busy, a quarter of it stolen: the processes had 60% of the cores
    assert unstolen(60.0, {"machine busy": 0.8, "stolen": 0.2}) == pytest.approx(80.0)
    assert unstolen(60.0, {"machine busy": 0.8, "stolen": 0.0}) == 60.0
    assert unstolen(60.0, {}) == 60.0
