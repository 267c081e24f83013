"""The wheel, as the release workflow builds it and as `pipx install` / `pip install .`
install it: the product's packages and nothing of the lab or the tests, the two
console scripts, and those scripts working from a fresh virtual environment.

Offline: the wheel is built with the setuptools of this environment (`pip wheel
--no-build-isolation --no-index`) from a copy of the checkout's files (git's view), lab/
and tests/ included, so the exclusion is tested, not the copy. The fresh venv gets
the wheel alone (`--no-deps`); its dependencies are read from this environment's
site-packages through a path file (the editable install's finder is not loaded
from there, so the checkout cannot stand in for what the wheel lacks).
"""

from __future__ import annotations

import email.parser
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT, required

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: The importable packages the wheel ships (pyproject's packages.find).
PRODUCT = {"gpu_scheduler", "extender", "webhook", "agent", "certs"}


def _project(requirement: str) -> str:
    """The normalised project name of a requirement (`kubernetes>=29.0` -> `kubernetes`)."""
    name = re.split(r"[ ;<>=!~\[]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _checkout() -> list[str]:
    """The checkout's files as git sees them (tracked or new, not ignored, still there):
    what `pip install .` of a clone builds from, without .venv/ and .cache/."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    if listed.returncode != 0:
        required("the wheel's test", "it copies the checkout's files, and this is no git checkout")
    return sorted({n for n in listed.stdout.decode().split("\0") if n and (ROOT / n).is_file()})


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The build backend (setuptools makes wheels itself since 70.1).
    if importlib.util.find_spec("setuptools") is None:
        required("the wheel's test", "pip cannot build offline here: no setuptools")
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    for name in _checkout():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    assert (src / "lab" / "__init__.py").is_file() and (src / "tests" / "__init__.py").is_file()
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "--wheel-dir", str(work / "dist"), str(src)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = (work / "dist").glob("*.whl")
    return found


def test_the_wheel_holds_the_product_and_nothing_of_the_lab_or_the_tests(wheel):
    version = PROJECT["version"]
    # The distribution's name, as wheels spell it (gpu-scheduler-k8s: PyPI's gpu-scheduler
    # is another project's).
    assert PROJECT["name"] == "gpu-scheduler-k8s"
    assert wheel.name == f"gpu_scheduler_k8s-{version}-py3-none-any.whl"
    dist_info = f"gpu_scheduler_k8s-{version}.dist-info"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
        metadata = email.parser.Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
    assert {name.split("/")[0] for name in names} == PRODUCT | {dist_info}
    assert not [n for n in names if n.startswith(("lab/", "tests/")) or "/tests/" in n]
    # Every tracked module of the product, none left behind (a folder without an
    # __init__.py is not found as a package): what `explain`, `status` and the servers
    # import is there.
    shipped = {n for n in names if n.endswith(".py")}
    assert shipped == {n for n in _checkout() if n.endswith(".py") and n.split("/")[0] in PRODUCT}
    assert {"extender/status.py", "extender/explain_cli.py", "gpu_scheduler/cli.py"} <= shipped
    # The console scripts: `gpu-scheduler`, and `kubectl-gpu_scheduler`, which kubectl
    # runs as `kubectl gpu-scheduler` when it is on PATH.
    section = entry_points.split("[console_scripts]", 1)[1].split("\n[", 1)[0]
    pairs = (line.split("=", 1) for line in section.splitlines() if "=" in line)
    scripts = {name.strip(): target.strip() for name, target in pairs}
    assert scripts == PROJECT["scripts"]
    assert scripts == {
        "gpu-scheduler": "gpu_scheduler.cli:main",
        "kubectl-gpu_scheduler": "gpu_scheduler.cli:kubectl_main",
    }
    # What pipx installs beside it: every dependency pyproject names.
    assert metadata["Name"] == PROJECT["name"] and metadata["Version"] == version
    requires = {_project(r) for r in metadata.get_all("Requires-Dist")}
    assert {_project(d) for d in PROJECT["dependencies"]} <= requires


def test_the_wheel_installs_into_a_fresh_venv_and_its_commands_run(wheel, tmp_path):
    home = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(home)
    python = home / "bin" / "python"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PATH": f"{home / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--quiet", str(wheel)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    deps = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    Path(purelib, "zz-test-dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        # Away from the checkout, so nothing is imported from it.
        return subprocess.run(
            [str(a) for a in args], cwd=tmp_path, capture_output=True, text=True,
            env=env, timeout=60, check=False,
        )  # fmt: skip

    # The wheel's code, every module of it importable, and no lab.
    where = run(
        python,
        "-c",
        "import importlib, pkgutil, gpu_scheduler\n"
        f"for top in {sorted(PRODUCT)!r}:\n"
        "    package = importlib.import_module(top)\n"
        "    for info in pkgutil.walk_packages(package.__path__, top + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "print(gpu_scheduler.__file__)\n"
        "import importlib.util; print(importlib.util.find_spec('lab'))",
    )
    assert where.returncode == 0, where.stderr
    module_file, lab = where.stdout.split()
    assert Path(module_file).is_relative_to(home) and lab == "None", where.stdout

    version = run(home / "bin" / "gpu-scheduler", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"gpu-scheduler {PROJECT['version']}"
    helped = run(home / "bin" / "gpu-scheduler", "--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("extender", "webhook", "agent", "certs", "status", "explain"):
        assert f"    {command} " in helped.stdout, helped.stdout
    for command in ("status", "explain"):
        sub = run(home / "bin" / "gpu-scheduler", command, "--help")
        assert sub.returncode == 0 and "--kubeconfig" in sub.stdout, sub.stdout + sub.stderr
    plugin = run(home / "bin" / "kubectl-gpu_scheduler", "--help")
    assert plugin.returncode == 0, plugin.stderr
    assert plugin.stdout.startswith("usage: kubectl gpu-scheduler"), plugin.stdout
    assert "    status " in plugin.stdout and "    explain " in plugin.stdout
    # The plugin's commands run as far as the cluster: a kubeconfig whose API server is
    # not there gives one line saying so (no import the wheel lacks, no traceback).
    port = _closed_port()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    for args in (("status",), ("explain", "some-pod", "-n", "default")):
        done = run(home / "bin" / "kubectl-gpu_scheduler", *args, "--kubeconfig", kubeconfig)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"gpu-scheduler {args[0]}: cannot reach the API server"), last


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_documented_wheel_urls_name_this_version():
    """The install commands (docs/install/cli.md and wherever else a release's wheel or
    the PyPI package is named) install the version pyproject.toml builds, by the name it
    builds: bumped together at a release."""
    url = re.compile(r"releases/download/v([^/\s]+)/([a-z0-9_]+)-([^-\s]+)-py3-none-any\.whl")
    pinned = re.compile(r"pipx install (?:--force )?([a-z0-9-]+)==(\S+)")
    found, by_name = [], []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        if "archive" in doc.parts:
            continue
        text = doc.read_text()
        found += [(doc.name, *m.groups()) for m in url.finditer(text)]
        by_name += [(doc.name, *m.groups()) for m in pinned.finditer(text)]
    assert any(name == "cli.md" for name, *_ in found)
    assert any(name == "cli.md" for name, *_ in by_name)
    version, wheel_name = PROJECT["version"], PROJECT["name"].replace("-", "_")
    assert all((t, n, v) == (version, wheel_name, version) for _, t, n, v in found), found
    assert all((n, v) == (PROJECT["name"], version) for _, n, v in by_name), by_name
