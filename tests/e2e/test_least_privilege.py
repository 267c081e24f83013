"""Least privilege, written down and asserted: for each ServiceAccount of the install,
`kubectl auth can-i --list` on the real API server equals its table in
docs/SECURITY.md. A change to deploy/'s RBAC (or to the built-in roles it binds) fails
here until the document says the same. With CAN_I_TABLES=DIR the API server's tables
are also written to DIR (one Markdown file per table), to review and paste."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from lab.controlplane import ROOT, supported_minors
from lab.stack import NAMESPACE
from tests.e2e.kube import ensure_namespace

SECURITY = ROOT / "docs" / "SECURITY.md"
RBAC_KINDS = {"ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
MARKER = re.compile(r"<!-- can-i: (\S+) in (\S+)(?: with (\S+))? -->")
ROW = re.compile(r"^(\S*)\s+(\[[^\]]*\])\s+(\[[^\]]*\])\s+(\[[^\]]*\])\s*$")
Row = tuple[str, str, str, str]


def _row(cells: tuple[str, ...]) -> Row:
    """A row with each bracketed list sorted: the API server's rule order (and so
    kubectl's order of verbs) is not stable."""

    def cell(text: str) -> str:
        if text.startswith("[") and text.endswith("]"):
            return "[" + " ".join(sorted(text[1:-1].split())) + "]"
        return text

    resources, urls, names, verbs = (cell(c) for c in cells)
    return resources, urls, names, verbs


def documented() -> dict[tuple[str, str, str], set[Row]]:
    """Each table in SECURITY.md, keyed by (account, namespace, component or '')."""
    tables: dict[tuple[str, str, str], set[Row]] = {}
    key = None
    for line in SECURITY.read_text().splitlines():
        found = MARKER.search(line)
        if found:
            key = (found[1], found[2], found[3] or "")
            tables[key] = set()
            continue
        if key is None:
            continue
        if line.startswith("|"):
            cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            if cells[0] in ("Resources", "") and cells[1].startswith(("Non-Resource", "-")):
                continue
            if set(cells[0]) <= {"-", ":"} and cells[0]:
                continue
            tables[key].add(_row(tuple(cells)))
        elif tables[key]:
            key = None
    return tables


def can_i(stack, account: str, namespace: str) -> set[Row]:
    out = stack.cluster.k8s(
        "kubectl",
        "auth",
        "can-i",
        "--list",
        "--no-headers",
        f"--as=system:serviceaccount:{NAMESPACE}:{account}",
        f"--namespace={namespace}",
    )
    rows = set()
    for line in out.splitlines():
        match = ROW.match(line)
        assert match, f"unexpected can-i line {line!r}"
        rows.add(_row(match.groups()))
    return rows


def markdown(rows: set[Row]) -> str:
    lines = ["| Resources | Non-Resource URLs | Resource Names | Verbs |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(f'`{c}`' if c else '' for c in row)} |" for row in sorted(rows)]
    return "\n".join(lines)


def _apply_rbac(stack, folder: str, *, delete: bool = False) -> None:
    """Only the RBAC objects of ``kubectl kustomize folder`` (the workloads would start
    pods on the lab's nodes)."""
    built = stack.cluster.k8s("kubectl", "kustomize", str(folder))
    docs = [d for d in yaml.safe_load_all(built) if d and d["kind"] in RBAC_KINDS]
    path = stack.workdir / "rbac-under-test.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    if delete:
        stack.cluster.k8s("kubectl", "delete", "--ignore-not-found", "-f", str(path))
    else:
        stack.cluster.k8s("kubectl", "apply", "-f", str(path))


@pytest.fixture(scope="module")
def install_rbac(stack):
    ensure_namespace(stack, NAMESPACE)
    _apply_rbac(stack, str(ROOT / "deploy"))
    return stack


def test_every_account_of_the_install_has_a_table():
    built = yaml.safe_load_all((ROOT / "deploy" / "webhook" / "deployment.yaml").read_text())
    accounts = {"default"}  # the webhook's pods run as the namespace's default account
    for folder in ("scheduler", "extender", "agent", "certs"):
        text = (ROOT / "deploy" / folder / "rbac.yaml").read_text()
        accounts |= {
            d["metadata"]["name"]
            for d in yaml.safe_load_all(text)
            if d and d["kind"] == "ServiceAccount"
        }
    assert all(d["spec"]["template"]["spec"].get("serviceAccountName") is None for d in built)
    assert {key[0] for key in documented()} == accounts


@pytest.mark.parametrize(
    "account,namespace,component", sorted(documented()), ids=lambda v: v or "base"
)
def test_can_i_list_equals_the_table(install_rbac, account, namespace, component):
    stack = install_rbac
    if component:  # a kustomize Component: build it on top of the base
        overlay = stack.workdir / "overlay"
        overlay.mkdir(exist_ok=True)
        (overlay / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "resources": [os.path.relpath(ROOT / "deploy", overlay)],
                    "components": [os.path.relpath(ROOT / "deploy" / component, overlay)],
                }
            )
        )
        _apply_rbac(stack, str(overlay))
    try:
        actual = can_i(stack, account, namespace)
    finally:
        if component:
            _apply_rbac(stack, str(overlay), delete=True)
            _apply_rbac(stack, str(ROOT / "deploy"))
    expected = documented()[(account, namespace, component)]
    dump = os.environ.get("CAN_I_TABLES")  # a folder: write what the API server said
    if dump:
        name = f"{account}-in-{namespace}" + (
            f"-with-{component.replace('/', '-')}" if component else ""
        )
        (Path(dump) / f"{name}.md").write_text(markdown(actual) + "\n")
    if stack.cluster.minor != int(supported_minors()[-1].split(".")[1]):
        # Another minor's built-in roles differ: every account gets other rows (1.34 lets
        # any account list ClusterTrustBundles), and the built-in system:kube-scheduler
        # role the scheduler binds grants less on older minors (no DeviceTaintRules
        # before 1.35). What the install grants beyond an unbound account's rows may
        # be less than the table says there, never more.
        builtin = can_i(stack, "an-account-with-no-bindings", namespace)
        documented_builtin = documented()[("default", NAMESPACE, "")]
        extra = (actual - builtin) - (expected - documented_builtin)
        assert not extra, (
            f"on Kubernetes 1.{stack.cluster.minor}, the install grants {account} in "
            f"{namespace} rows docs/SECURITY.md does not: {sorted(extra)}"
        )
        return
    assert actual == expected, (
        f"docs/SECURITY.md's table for {account} in {namespace} differs from the API "
        f"server's answer; it is:\n\n{markdown(actual)}\n"
    )
