"""The end-to-end fixture: the real control plane with our three components.

Started once per session (etcd, kube-apiserver, kube-controller-manager, the default
kube-scheduler and the gpu-scheduler profile from deploy/, our extender in cluster mode,
our webhook over TLS). Every process is stopped by its pid at the end; when a test fails
the tails of all component logs are attached to its report.
"""

from __future__ import annotations

import os
import shutil

import pytest

from lab.controlplane import find_binary
from tests.helpers import required

HOW_TO_GET_IT = (
    "the e2e tests need the control-plane binary: install Go 1.26+ and run "
    "`make controlplane` (or `make test`, which builds it when Go is installed)"
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def control_plane_binary():
    """The control-plane binary; without it the e2e tests skip (CI: fail)."""
    binary = find_binary()
    if binary is None:
        required("the e2e tests", HOW_TO_GET_IT)
    return binary


@pytest.fixture(scope="session")
def stack(tmp_path_factory, control_plane_binary):
    from lab.stack import start_stack

    workdir = tmp_path_factory.mktemp("cluster")
    stack = start_stack(workdir)
    yield stack
    stack.stop()
    if not os.environ.get("KEEP_E2E_LOGS"):
        shutil.rmtree(workdir / "etcd", ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for fixture in ("stack", "faults"):
            stack = item.funcargs.get(fixture) if fixture in item.fixturenames else None
            if stack is not None:
                report.sections.append((f"{fixture}: component logs", stack.cluster.failures()))


@pytest.fixture(scope="session")
def helm_binary(control_plane_binary):
    """helm: the newest minor's build carries it, whatever minor is under test."""
    from lab.controlplane import tools_binary

    return tools_binary() or control_plane_binary
