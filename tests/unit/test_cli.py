"""The one console script."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT


def test_building_the_parser_loads_nothing_heavy():
    """Servers with several workers must point prometheus_client at a multiprocess
    directory before it is imported; the parser imports every subcommand's module,
    so none of them may import it (or the kubernetes client) at the top."""
    code = (
        "import sys; from gpu_scheduler.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('prometheus_client', 'kubernetes', 'flask') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_extender_refuses_args_mode_and_takes_the_old_cluster_flag(capsys):
    import argparse

    from extender import cli

    parser = argparse.ArgumentParser()
    cli.configure(parser)
    assert parser.parse_args(["--node-source=cluster"]).node_source == "cluster"
    assert cli.run(parser.parse_args(["--node-source=args"])) == 2
    assert "nodeCacheCapable: true" in capsys.readouterr().err


def test_the_kubectl_plugin_offers_the_read_only_commands(capsys):
    """`kubectl gpu-scheduler`: the package's `kubectl-gpu_scheduler` script (kubectl
    finds it on PATH) offers status and explain, not the components' servers."""
    import tomllib

    import pytest

    from gpu_scheduler.cli import kubectl_main

    with open("pyproject.toml", "rb") as handle:
        scripts = tomllib.load(handle)["project"]["scripts"]
    assert scripts["kubectl-gpu_scheduler"] == "gpu_scheduler.cli:kubectl_main"
    with pytest.raises(SystemExit):
        kubectl_main(["--help"])
    usage = capsys.readouterr().out
    assert usage.startswith("usage: kubectl gpu-scheduler")
    commands = {line.split()[0] for line in usage.splitlines() if line.startswith("    ")}
    assert {"status", "explain"} <= commands and not commands & {"agent", "extender", "webhook"}
    with pytest.raises(SystemExit) as refused:
        kubectl_main(["agent"])
    assert refused.value.code == 2


def test_a_users_command_without_a_kubeconfig_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    """`kubectl gpu-scheduler status|explain` with no kubeconfig to use: exit 1 and one
    line on stderr naming the fix, not a traceback."""
    from gpu_scheduler.cli import kubectl_main

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    # main() routes every logger to the stderr of the moment: not this test's, which
    # pytest closes after it (later tests' log records would go there)
    monkeypatch.setattr("gpu_scheduler.logs.setup_logging", lambda level="INFO": None)
    missing = str(tmp_path / "no-such-kubeconfig")
    for args in (["status"], ["explain", "some-pod"]):
        assert kubectl_main([*args, "--kubeconfig", missing]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"gpu-scheduler {args[0]}: no kubeconfig to use"), err
        assert "--kubeconfig or set KUBECONFIG" in err and "\n" not in err
