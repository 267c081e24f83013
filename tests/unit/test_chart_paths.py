"""The chart's scheduler.path and deploy/'s plugins components install the same plugins
path (docs/concepts/paths.md), at each supported minor:

- `helm template --set scheduler.path=plugins` gives the objects of `kubectl kustomize`
  over deploy/ with deploy/scheduler/plugins (and deploy/scheduler/plugins/v1.NN on an
  older minor), normalised as tests/e2e/test_helm.py does for the extender path;
- kube-scheduler runs the image the release publishes for the cluster's minor, with no
  extender, no client certificate, a Role to read the agents' Leases in the install's
  namespace, and on 1.34 asynchronous preemption off;
- the profile's plugin args come from the extender's values, so one value changes both
  paths;
- our kube-scheduler of the newest and the oldest minor builds its profile from the
  rendered configuration (plugin args decoded and checked by the plugins themselves).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.controlplane import find_binary, plugins_scheduler, supported_minors, tools_binary
from lab.stack import NAMESPACE
from tests.e2e.test_helm import CHART, _fails, _key, _kustomize_with, _normalise, _run
from tests.helpers import ROOT, required

PLUGINS = ("--set", "scheduler.path=plugins")
IMAGE = "ghcr.io/gpu-scheduler/gpu-scheduler-kube-scheduler"
CONFIG = ("ConfigMap", NAMESPACE, "gpu-scheduler-config")
SCHEDULER = ("Deployment", NAMESPACE, "gpu-scheduler")
ASYNC_OFF = "--feature-gates=SchedulerAsyncPreemption=false"


def _release(minor: str) -> str:
    """The Kubernetes release the release workflow builds the minor's image from."""
    done = subprocess.run(
        [str(ROOT / "tools" / "k8s" / "build.sh"), "--version", minor],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def _version() -> str:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


@pytest.fixture(scope="module")
def binaries() -> tuple[Path, Path]:
    """(helm, kubectl): the builds of tools/k8s/build.sh, as the e2e tests use them."""
    kubectl, helm = find_binary(), tools_binary()
    if kubectl is None or helm is None:
        required("the chart's path tests", "no control-plane binary: make controlplane")
    return helm, kubectl


def _template(helm: Path, *values: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    out = _run(helm, "helm", "template", "gpu-scheduler", str(CHART), "-n", NAMESPACE, *values)
    return {_key(d): d for d in yaml.safe_load_all(out) if d}


def _scheduler_config(docs: dict[tuple[str, str, str], dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(docs[CONFIG]["data"]["scheduler-config.yaml"])


def _container(docs: dict[tuple[str, str, str], dict[str, Any]]) -> dict[str, Any]:
    (container,) = docs[SCHEDULER]["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("minor", supported_minors())
def test_the_plugins_path_renders_as_its_kustomize_components(binaries, tmp_path, minor):
    helm, kubectl = binaries
    release = _release(minor)
    # A patch release other than the image's: the tag follows the minor, not the patch.
    cluster = release.rsplit(".", 1)[0] + ".1"
    docs = _template(helm, "--kube-version", cluster, *PLUGINS)
    container = _container(docs)
    assert container["image"] == f"{IMAGE}:{release}-{_version()}"
    assert (ASYNC_OFF in container["command"]) is (minor == "1.34")
    spec = docs[SCHEDULER]["spec"]["template"]["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["config"]  # no client certificate
    assert not [name for _, _, name in docs if name.startswith("gpu-scheduler-extender")]
    config = _scheduler_config(docs)
    assert "extenders" not in config
    (profile,) = config["profiles"]
    assert [p["name"] for p in profile["plugins"]["multiPoint"]["enabled"]] == [
        "SpotScheduler", "GPUScheduler", "AZScheduler", "GangPreemption",
    ]  # fmt: skip
    # DefaultPreemption with the gang rule, in its place at every point it has.
    assert profile["plugins"]["multiPoint"]["disabled"] == [{"name": "DefaultPreemption"}]
    assert "podGroupPostFilter" not in profile["plugins"]  # kept on: the Filter runs in it
    role = docs[("Role", NAMESPACE, "gpu-scheduler-heartbeats")]
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list", "watch"]}
    ]
    binding = docs[("RoleBinding", NAMESPACE, "gpu-scheduler-heartbeats")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-scheduler", "namespace": NAMESPACE}
    ]
    assert binding["roleRef"]["name"] == "gpu-scheduler-heartbeats"
    for kind, _, name in docs:
        assert not (kind.startswith("Cluster") and "heartbeats" in name), name

    components = ["scheduler/plugins"] + (
        [] if minor == supported_minors()[-1] else [f"scheduler/plugins/v{minor}"]
    )
    kustomize = _normalise(_kustomize_with(kubectl, tmp_path, *components))
    chart = _normalise(list(docs.values()))
    assert sorted(chart) == sorted(kustomize)
    for key, obj in kustomize.items():
        assert chart[key] == obj, key


def test_every_older_minor_has_its_plugins_component(binaries):
    """deploy/scheduler/plugins/v1.NN for each older minor, at the image the release
    publishes; the base component names the newest minor's; the release workflow
    builds every supported minor."""
    *older, newest = supported_minors()
    folder = ROOT / "deploy" / "scheduler" / "plugins"
    base = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert base["images"] == [
        {"name": "registry.k8s.io/kube-scheduler", "newName": IMAGE,
         "newTag": f"{_release(newest)}-{_version()}"},
    ]  # fmt: skip
    assert {p.name for p in folder.iterdir() if p.is_dir()} == {f"v{m}" for m in older}
    for minor in older:
        component = yaml.safe_load((folder / f"v{minor}" / "kustomization.yaml").read_text())
        assert component["images"] == [{"name": IMAGE, "newTag": f"{_release(minor)}-{_version()}"}]
    workflow = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert "minor: [" + ", ".join(f'"{m}"' for m in supported_minors()) + "]" in workflow
    tag = "${{ steps.build.outputs.kubernetes }}-${{ needs.release.outputs.version }}"
    assert f"gpu-scheduler-kube-scheduler:{tag}" in workflow


def test_the_extender_path_is_the_default_and_unchanged(binaries):
    helm, _ = binaries
    default = _template(helm)
    assert _normalise(list(default.values())) == _normalise(
        list(_template(helm, "--set", "scheduler.path=extender").values())
    )
    assert ("Deployment", NAMESPACE, "gpu-scheduler-extender") in default
    assert ("Role", NAMESPACE, "gpu-scheduler-heartbeats") not in default
    assert _container(default)["image"].startswith("registry.k8s.io/kube-scheduler:")


def test_one_value_changes_both_paths(binaries):
    """extender.config's weights, defaultPlacement, heartbeatWindow (plain seconds too),
    groupLevels and disabled reach the plugins' args; scheduler.profile's too."""
    helm, _ = binaries
    values = (
        "--set-json",
        'extender.config.weights={"gpu":7,"spot":3,"zone":20,"scarcity":12,"fragmentation":6}',
        "--set", "extender.config.defaultPlacement=spread",
        "--set", "extender.config.heartbeatWindow=900",
        "--set-json", 'extender.config.groupLevels=["example.com/rack","kubernetes.io/zone"]',
        "--set", "scheduler.profile.systemDefaultSpreading=true",
        "--set-json", 'scheduler.profile.extraScorePlugins=[{"name":"ImageLocality","weight":1}]',
    )  # fmt: skip
    extender = _template(helm, *values)
    policies = yaml.safe_load(
        extender[("ConfigMap", NAMESPACE, "gpu-scheduler-extender-config")]["data"][
            "extender-config.yaml"
        ]
    )
    assert policies["defaultPlacement"] == "spread" and policies["heartbeatWindow"] == 900
    (profile,) = _scheduler_config(_template(helm, *PLUGINS, *values))["profiles"]
    weights = {p["name"]: p.get("weight") for p in profile["plugins"]["multiPoint"]["enabled"]}
    # GPUScheduler adds up gpu, scarcity and fragmentation: its weight is their sum
    assert weights == {
        "SpotScheduler": 3, "GPUScheduler": 25, "AZScheduler": 20, "GangPreemption": None,
    }  # fmt: skip
    assert profile["plugins"]["score"]["enabled"] == [{"name": "ImageLocality", "weight": 1}]
    args = {c["name"]: c["args"] for c in profile["pluginConfig"]}
    assert args["GPUScheduler"] == {
        "defaultPlacement": "spread", "heartbeatWindow": "900s", "namespace": NAMESPACE,
        "weights": {"gpu": 7, "scarcity": 12, "fragmentation": 6},
    }  # fmt: skip
    assert args["AZScheduler"] == {"groupLevels": ["example.com/rack", "kubernetes.io/zone"]}
    assert args["PodTopologySpread"] == {"defaultingType": "System"}

    off = _template(
        helm, *PLUGINS, "--set-json",
        'extender.config.disabled=["spot","zone","heartbeat","scarcity"]',
    )  # fmt: skip
    (profile,) = _scheduler_config(off)["profiles"]
    assert profile["plugins"]["multiPoint"]["enabled"] == [
        {"name": "GPUScheduler", "weight": 13}, {"name": "GangPreemption"},
    ]  # fmt: skip
    args = {c["name"]: c["args"] for c in profile["pluginConfig"]}
    assert "AZScheduler" not in args and args["GPUScheduler"]["heartbeatWindow"] == "0s"
    assert args["GPUScheduler"]["weights"] == {"gpu": 5, "scarcity": 0, "fragmentation": 8}
    elsewhere = _template(helm, *PLUGINS, "-n", "gpu-other")
    other = yaml.safe_load(
        elsewhere[("ConfigMap", "gpu-other", "gpu-scheduler-config")]["data"][
            "scheduler-config.yaml"
        ]
    )
    assert ("Role", "gpu-other", "gpu-scheduler-heartbeats") in elsewhere
    assert other["leaderElection"]["resourceNamespace"] == "gpu-other"
    (profile,) = other["profiles"]
    assert profile["pluginConfig"][0]["args"]["namespace"] == "gpu-other"


def test_what_the_plugins_path_cannot_do_fails_the_install(binaries):
    helm, _ = binaries
    template = ("helm", "template", "x", str(CHART))
    err = _fails(helm, *template, "--set", "scheduler.path=plugin")
    assert "scheduler.path must be extender" in err and "(got plugin)" in err, err
    err = _fails(helm, *template, *PLUGINS, "--set-json", 'extender.config.disabled=["gpu"]')
    assert "use scheduler.path extender" in err, err
    old = f"scheduler.plugins.image.tag={_release('1.34')}-{_version()}"
    err = _fails(helm, *template, *PLUGINS, "--kube-version", "v1.37.2", "--set", old)
    assert "scheduler.plugins.image.tag" in err and "version-skew" not in err, err
    pinned = _template(helm, *PLUGINS, "--kube-version", "v1.36.3",
                       "--set", "scheduler.plugins.image.tag=v1.36.3-mine",
                       "--set", "scheduler.plugins.image.repository=mirror.example/ks")  # fmt: skip
    assert _container(pinned)["image"] == "mirror.example/ks:v1.36.3-mine"


def test_cert_manager_issues_no_extender_pairs_on_the_plugins_path(binaries):
    helm, _ = binaries
    docs = _template(helm, *PLUGINS, "--set", "certificates.mode=cert-manager")
    certificates = {name for kind, _, name in docs if kind == "Certificate"}
    assert certificates == {"gpu-scheduler-ca", "gpu-scheduler-webhook"}


@pytest.mark.parametrize(
    "values",
    [(), ("--set", "certificates.mode=cert-manager"), ("--set", "certificates.mode=external")],
    ids=["internal", "cert-manager", "external"],
)
def test_helm_lint_is_clean_on_the_plugins_path(binaries, values):
    helm, _ = binaries
    out = _run(helm, "helm", "lint", "--strict", str(CHART), *PLUGINS, *values)
    assert "0 chart(s) failed" in out and "[WARNING]" not in out and "[ERROR]" not in out, out


def _starts(binary: Path, config: dict[str, Any], flags: list[str], tmp_path: Path) -> str:
    """Run ``binary`` with ``config`` against an API server that is not there: it
    decodes the configuration, builds the profile (each plugin decodes and checks its
    args) and logs "Starting Kubernetes Scheduler", or exits with why not. Its log."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
    }))  # fmt: skip
    config = {
        **config,
        "clientConnection": {**config["clientConnection"], "kubeconfig": str(kubeconfig)},
    }
    path = tmp_path / "scheduler-config.yaml"
    path.write_text(yaml.safe_dump(config))
    log = tmp_path / "kube-scheduler.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(binary), f"--config={path}", "--secure-port=0", *flags],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if "Starting Kubernetes Scheduler" in log.read_text():
                break
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait(10)
    return log.read_text()


def _newest_and_oldest() -> list[str]:
    minors = supported_minors()
    return [minors[-1], minors[0]]


CHANGED = (
    *("--set", "extender.config.defaultPlacement=spread"),
    *("--set", "extender.config.heartbeatWindow=90"),
    *("--set-json", 'extender.config.disabled=["spot"]'),
    *("--set", "scheduler.profile.systemDefaultSpreading=true"),
)


@pytest.mark.parametrize("minor", _newest_and_oldest())
@pytest.mark.parametrize("values", [(), CHANGED], ids=["defaults", "changed"])
def test_our_kube_scheduler_runs_the_rendered_profile(binaries, tmp_path, minor, values):
    helm, _ = binaries
    try:
        binary = plugins_scheduler(int(minor.split(".")[1]))
    except FileNotFoundError as exc:
        required("the plugins path's chart test", f"{exc} (or `make test`, which builds it)")
    docs = _template(helm, "--kube-version", _release(minor), *PLUGINS, *values)
    command = _container(docs)["command"]
    assert command[:2] == [
        "kube-scheduler",
        "--config=/etc/kubernetes/gpu-scheduler/scheduler-config.yaml",
    ]
    log = _starts(binary, _scheduler_config(docs), command[2:], tmp_path)
    assert "Starting Kubernetes Scheduler" in log, log[-3000:]
    # Not vacuous: args the plugins refuse stop it before it starts.
    bad = _scheduler_config(docs)
    bad["profiles"][0]["pluginConfig"][0]["args"]["defaultPlacement"] = "pack"
    log = _starts(binary, bad, command[2:], tmp_path)
    assert "Starting Kubernetes Scheduler" not in log and "GPUScheduler" in log, log[-3000:]


def test_the_documented_overlay_installs_the_plugins_path(binaries, tmp_path):
    """docs/concepts/paths.md's overlay, as written but for the clone's place; and
    without its last line, the newest minor's."""
    import os
    import re

    _, kubectl = binaries
    doc = (ROOT / "docs" / "concepts" / "paths.md").read_text()
    block = re.search(r"```yaml\n(# kustomization.yaml: the plugins path.*?)```", doc, re.S)
    assert block, "docs/concepts/paths.md: the plugins path's overlay"
    overlay = yaml.safe_load(block[1])
    clone = "../gpu-scheduler/"
    for components, minor in ((overlay["components"], "1.34"), (overlay["components"][:1], None)):
        folder = tmp_path / (minor or "newest")
        folder.mkdir()
        written = {
            "resources": [
                os.path.relpath(ROOT / r.removeprefix(clone), folder) for r in overlay["resources"]
            ],
            "components": [
                os.path.relpath(ROOT / c.removeprefix(clone), folder) for c in components
            ],
        }
        (folder / "kustomization.yaml").write_text(yaml.safe_dump(written))
        out = _run(kubectl, "kubectl", "kustomize", str(folder))
        docs = {_key(d): d for d in yaml.safe_load_all(out) if d}
        release = _release(minor or supported_minors()[-1])
        assert _container(docs)["image"] == f"{IMAGE}:{release}-{_version()}"
        assert (ASYNC_OFF in _container(docs)["command"]) is (minor == "1.34")
        assert ("Deployment", NAMESPACE, "gpu-scheduler-extender") not in docs
