"""kustomize follows the cluster's minor: deploy/'s base is the newest supported
kube-scheduler; a component per older minor (deploy/scheduler/minors/v1.NN) sets that
minor's image and the KubeSchedulerConfiguration it decodes (no
plugins.podGroupPostFilter before 1.37). The older config is a copy, kept equal to the
base but for that block here; the tags are the patch releases the lab builds and tests
(tools/k8s)."""

from __future__ import annotations

import copy
import re

import yaml

from lab.controlplane import ROOT, supported_minors

MINORS = ROOT / "deploy" / "scheduler" / "minors"


def _config(path):
    return yaml.safe_load(path.read_text())


def test_the_older_config_is_the_base_without_podgroup_preemption():
    base = _config(ROOT / "deploy" / "scheduler" / "scheduler-config.yaml")
    older = _config(MINORS / "before-1.37" / "scheduler-config.yaml")
    expected = copy.deepcopy(base)
    for profile in expected["profiles"]:
        plugins = profile.get("plugins", {})
        assert plugins.pop("podGroupPostFilter") == {"disabled": [{"name": "DefaultPreemption"}]}
        if not plugins:
            profile.pop("plugins")
    assert older == expected


def _tested_version(minor: str) -> str:
    go_mod = ROOT / "tools" / "k8s" / f"v{minor}" / "go.mod"
    if not go_mod.exists():  # the newest minor's module is tools/k8s itself
        go_mod = ROOT / "tools" / "k8s" / "go.mod"
    return re.search(r"k8s\.io/kubernetes (v[0-9.]+)", go_mod.read_text())[1]


def test_every_older_supported_minor_has_its_component_at_the_tested_release():
    *older, newest = supported_minors()
    deployment = (ROOT / "deploy" / "scheduler" / "deployment.yaml").read_text()
    assert f"registry.k8s.io/kube-scheduler:{_tested_version(newest)}" in deployment
    found = {p.name for p in MINORS.iterdir() if p.name.startswith("v")}
    assert found == {f"v{m}" for m in older}
    for minor in older:
        component = _config(MINORS / f"v{minor}" / "kustomization.yaml")
        assert component["kind"] == "Component"
        assert component["images"] == [
            {"name": "registry.k8s.io/kube-scheduler", "newTag": _tested_version(minor)}
        ]
        assert component["components"] == ["../before-1.37"]
