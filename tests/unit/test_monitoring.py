"""The monitoring the chart and deploy/monitoring/ install (docs/operations/monitoring.md):

- the alerts of charts/gpu-scheduler/files/rules.yaml pass `promtool check rules` and
  their unit tests (tests/monitoring/rules_test.yaml, `promtool test rules`), and a
  broken rule fails them;
- every expression of the alerts and of the Grafana dashboard parses with Prometheus'
  own PromQL parser (promql-names, tools/k8s/prometheus), and each metric it selects is
  one the extender, the webhook and the agent serve on /metrics, scraped from the real
  processes, or the certificate controller registers; kube-scheduler's own
  (KUBE_SCHEDULER) are the only others;
- `helm template` with monitoring on renders what deploy/monitoring/ gives, and
  deploy/monitoring's copies are those tools/monitoring.py writes.

promtool and promql-names are built by `tools/k8s/build.sh prometheus` (make test).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import requests
import yaml

from tests.factories import make_pod
from tests.fuzz.servers import NODE_NAMES, extender_fake_cluster
from tests.helpers import CLI, ROOT, free_port, required, running, tail, wait_for

FILES = ROOT / "charts" / "gpu-scheduler" / "files"
RULES = FILES / "rules.yaml"
TESTS = ROOT / "tests" / "monitoring" / "rules_test.yaml"
#: Metrics of kube-scheduler (ours: the gpu-scheduler profile's, job gpu-scheduler)
#: and Prometheus' own `up`: the pending GPU pods are counted nowhere else.
KUBE_SCHEDULER = {"up", "scheduler_pending_pods", "scheduler_unschedulable_pods"}


def _tools() -> Path:
    done = subprocess.run(
        [str(ROOT / "tools" / "k8s" / "build.sh"), "--path", "prometheus"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    folder = Path(done.stdout.strip())
    if not (folder / "promtool").is_file() or not (folder / "promql-names").is_file():
        required("the monitoring tests", "no promtool: tools/k8s/build.sh prometheus")
    return folder


def _promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(_tools() / "promtool"), *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_the_rules_pass_promtool_check_and_their_unit_tests():
    checked = _promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", str(TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout + tested.stderr


def test_every_alert_has_a_test_a_severity_and_a_runbook_section():
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    tested = {t["alertname"] for c in yaml.safe_load(TESTS.read_text())["tests"]
              for t in c.get("alert_rule_test", [])}  # fmt: skip
    runbook = (ROOT / "docs" / "operations" / "alerts.md").read_text()
    headings = {line[3:].strip().lower() for line in runbook.splitlines() if line.startswith("## ")}
    for rule in rules:
        name = rule["alert"]
        assert name in tested, f"{name}: no promtool test"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        url = rule["annotations"]["runbook_url"]
        assert url.endswith("docs/operations/alerts.md#" + name.lower()), url
        assert name.lower() in headings, f"{name}: no section in docs/operations/alerts.md"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('(up{job="gpu-scheduler-webhook"}) == 0', '(up{job="gpu-scheduler-webhook"}) == 1'),
        ("{state=\"healthy\"}) > 0", "{state=\"healthy\"}) > 2"),
        ("< 20 * 86400", "< 2 * 86400"),
    ],
    ids=["webhook-down-inverted", "sick-gpus-threshold", "certificate-window"],
)  # fmt: skip
def test_a_broken_rule_fails_its_unit_tests(tmp_path, old, new):
    text = RULES.read_text()
    assert text.count(old) == 1, old
    (tmp_path / "rules.yaml").write_text(text.replace(old, new))
    unit = yaml.safe_load(TESTS.read_text())
    unit["rule_files"] = ["rules.yaml"]
    (tmp_path / "rules_test.yaml").write_text(yaml.safe_dump(unit))
    tested = _promtool("test", "rules", "rules_test.yaml", cwd=tmp_path)
    assert tested.returncode != 0, tested.stdout
    assert "FAILED" in tested.stdout + tested.stderr


# --- every metric an expression names is one our components serve ------------------------


def _names(expressions: list[str]) -> list[tuple[str, str]]:
    """(expression, its metric names or "error: ...") by Prometheus' parser."""
    done = subprocess.run(
        [str(_tools() / "promql-names")], input="\n".join(expressions) + "\n",
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert len(lines) == len(expressions), done.stdout + done.stderr
    assert (done.returncode != 0) == any(line.startswith("error:") for line in lines)
    return list(zip(expressions, lines, strict=True))


def _exposed(text: str) -> set[str]:
    """The series names an exposition offers: each family's (from # TYPE, with a
    histogram's _bucket, _sum and _count) and each sample's."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names.add(name)
            if kind in ("histogram", "summary"):
                names.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


@pytest.fixture(scope="module")
def extender_metrics(tmp_path_factory) -> str:
    """The extender's /metrics over the fake cluster's GPU nodes, with a GPU pod bound
    (the cluster's GPUs, fragmentation and shares then have samples)."""
    work = tmp_path_factory.mktemp("extender")
    pods = [make_pod("bound", 2, node=NODE_NAMES[0], phase="Running")]
    with extender_fake_cluster(work, pods=pods) as (url, _pid, _log):
        return requests.get(url + "/metrics", timeout=10).text


@pytest.fixture(scope="module")
def exported(tmp_path_factory, webhook_server_factory, certs_dir, extender_metrics) -> set[str]:
    """What the extender, the webhook and the agent serve on /metrics (real processes,
    one worker each, so that families with no sample yet are listed too), and the
    certificate controller's registry."""
    work = tmp_path_factory.mktemp("scrape")
    names = _exposed(extender_metrics)
    webhook = webhook_server_factory(certs_dir, "--workers=1")
    text = requests.get(webhook.url + "/metrics", verify=str(certs_dir / "ca.crt"), timeout=10).text
    names |= _exposed(text)
    port, log = free_port(), work / "agent.log"
    gpus = ROOT / "tests" / "fixtures" / "gpus" / "l4x2.yaml"
    agent = [*CLI, "agent", "--dry-run", "--interval", "60s", "--host", "127.0.0.1",
             "--port", str(port), "--fake-gpus", str(gpus)]  # fmt: skip
    with running(agent, log, env={"KUBECONFIG": "/nonexistent", "NODE_NAME": ""}):
        base = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return requests.get(base + "/readyz", timeout=1).status_code == 200
            except requests.RequestException:
                return False

        try:
            wait_for(ready, 30, "the agent")
        except TimeoutError:
            raise AssertionError(tail(log)) from None
        names |= _exposed(requests.get(base + "/metrics", timeout=10).text)
    import prometheus_client

    import certs.controller  # noqa: F401 - registers its metrics

    names |= _exposed(prometheus_client.generate_latest().decode())
    return names


def _dashboard_expressions() -> list[str]:
    board = yaml.safe_load((FILES / "dashboard.json").read_text())
    return [
        t["expr"].replace("$__rate_interval", "5m") for p in board["panels"] for t in p["targets"]
    ]


def _rule_expressions() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [" ".join(r["expr"].split()) for g in rules["groups"] for r in g["rules"]]


def _unknown(exported: set[str], expressions: list[str]) -> list[str]:
    bad = []
    for expr, names in _names(expressions):
        if names.startswith("error:"):
            bad.append(f"{expr}: {names}")
            continue
        for name in names.split():
            if name not in exported and name not in KUBE_SCHEDULER:
                bad.append(f"{expr}: {name} is served by none of our components")
    return bad


def test_the_scrapes_found_each_component(exported):
    for prefix in ("extender", "webhook", "agent", "certs", "tls"):
        assert any(n.startswith(f"gpu_scheduler_{prefix}_") for n in exported), prefix


def test_the_extender_serves_the_clusters_gpus_with_samples(extender_metrics):
    for name in ("cluster_gpus", "fragmented_gpus", "stranded_gpus", "share_units",
                 "shared_gpu_fill_ratio_bucket"):  # fmt: skip
        assert re.search(rf"^gpu_scheduler_extender_{name}{{.*model=", extender_metrics, re.M), name


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_query_parses_and_names_metrics_our_components_serve(exported, source):
    expressions = _dashboard_expressions() if source == "dashboard" else _rule_expressions()
    assert len(expressions) > 10
    assert _unknown(exported, expressions) == []


def test_an_unknown_metric_or_a_broken_query_is_caught(exported):
    bad = _unknown(exported, [
        "sum(rate(gpu_scheduler_extender_requests_total[5m]))",
        "sum(rate(gpu_scheduler_extender_request_total[5m]))",
        "sum(rate(gpu_scheduler_extender_requests_total[5m])",
        '{__name__=~"gpu_scheduler_.*"}',
    ])  # fmt: skip
    assert len(bad) == 3, bad
    assert "gpu_scheduler_extender_request_total is served by none" in bad[0]
    assert "error:" in bad[1] and "error:" in bad[2]


# --- the chart and deploy/monitoring/ ------------------------------------------------


def test_deploy_monitoring_is_what_tools_monitoring_writes():
    done = subprocess.run(
        [shutil.which("python3") or "python3", "tools/monitoring.py", "--check"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


MONITORING = (
    "--set", "metrics.podMonitor.enabled=true",
    "--set", "metrics.prometheusRule.enabled=true",
    "--set", "metrics.dashboard.enabled=true",
)  # fmt: skip


def _binaries() -> tuple[Path, Path]:
    from lab.controlplane import find_binary, tools_binary

    kubectl, helm = find_binary(), tools_binary()
    if kubectl is None or helm is None:
        required("the monitoring render tests", "no control-plane binary: make controlplane")
    return helm, kubectl


def test_the_chart_renders_deploy_monitoring(tmp_path):
    from tests.e2e.test_helm import _kustomize_with, _normalise, helm_template

    helm, kubectl = _binaries()
    chart = _normalise(helm_template(helm, *MONITORING, "--show-only", "templates/monitoring.yaml"))
    (tmp_path / "with").mkdir()
    (tmp_path / "without").mkdir()
    everything = _normalise(_kustomize_with(kubectl, tmp_path / "with", "monitoring"))
    base = _normalise(_kustomize_with(kubectl, tmp_path / "without"))
    kustomize = {key: obj for key, obj in everything.items() if key not in base}
    assert sorted(chart) == sorted(kustomize)
    for key, obj in kustomize.items():
        assert chart[key] == obj, key
    kinds = [k for k, _, _ in chart]
    assert kinds.count("PodMonitor") == 5 and kinds.count("PrometheusRule") == 1
    board = chart[("ConfigMap", "gpu-scheduler", "gpu-scheduler-dashboard")]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"


@pytest.mark.parametrize(
    ("values", "jobs"),
    [
        ((), None),  # off by default: nothing of the Prometheus Operator
        (("--set", "metrics.podMonitor.enabled=true", "--set", "scheduler.path=plugins"),
         {"gpu-scheduler-webhook", "gpu-scheduler-agent", "gpu-scheduler-certs", "gpu-scheduler"}),
        (("--set", "metrics.podMonitor.enabled=true", "--set", "certificates.mode=cert-manager",
          "--set", "metrics.podMonitor.scheduler=false"),
         {"gpu-scheduler-extender", "gpu-scheduler-webhook", "gpu-scheduler-agent"}),
    ],
    ids=["default", "plugins-path", "cert-manager-no-scheduler"],
)  # fmt: skip
def test_pod_monitors_follow_what_is_installed(values, jobs):
    from tests.e2e.test_helm import helm_template

    helm, _ = _binaries()
    docs = helm_template(helm, *values)
    monitors = {d["metadata"]["name"] for d in docs if d["kind"] == "PodMonitor"}
    if jobs is None:
        assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com")]
        assert "gpu-scheduler-dashboard" not in {d["metadata"]["name"] for d in docs}
    else:
        assert monitors == jobs
