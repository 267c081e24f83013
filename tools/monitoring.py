"""gpu-scheduler's Grafana dashboard and kustomize's copies of the monitoring sources.

The chart holds the sources: charts/gpu-scheduler/files/rules.yaml (the alerts, a
Prometheus rule file) and charts/gpu-scheduler/files/dashboard.json (made here from
PANELS). deploy/monitoring/ carries the same as kustomize resources: the rule file's
groups in a PrometheusRule (prometheusrule.yaml) and the dashboard's JSON beside its
configMapGenerator (dashboard.json).

    python tools/monitoring.py           write the dashboard and deploy/monitoring's copies
    python tools/monitoring.py --check   exit 1 when any of them differs from what it writes
"""

# ruff: noqa: E501 - the dashboard's queries read best whole, one a line
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
FILES = ROOT / "charts" / "gpu-scheduler" / "files"
DEPLOY = ROOT / "deploy" / "monitoring"

#: (title, kind, unit, [(expression, legend)]): a row of the dashboard, left to right.
ROWS: list[list[tuple[str, str, str, list[tuple[str, str]]]]] = [
    [
        ("GPUs the agents report", "timeseries", "short", [
            ('sum by (state) (gpu_scheduler_agent_gpus)', "{{state}}"),
        ]),
        ("Sick GPUs by node", "timeseries", "short", [
            ('sum by (node) (gpu_scheduler_agent_gpus{state="present"})'
             ' - sum by (node) (gpu_scheduler_agent_gpus{state="healthy"}) > 0', "{{node}}"),
            ("sum by (node) (gpu_scheduler_agent_gpu_health_marks) > 0", "{{node}} held by an event"),
        ]),
        ("XID errors", "timeseries", "short", [
            ("sum by (node, critical) (increase(gpu_scheduler_agent_xids_total[$__rate_interval]))",
             "{{node}} critical={{critical}}"),
        ]),
    ],
    [
        ("Pending GPU pods by queue", "timeseries", "short", [
            ('sum by (queue) (scheduler_pending_pods{job="gpu-scheduler"})', "{{queue}}"),
        ]),
        ("Unschedulable GPU pods by plugin", "timeseries", "short", [
            ('sum by (plugin) (scheduler_unschedulable_pods{job="gpu-scheduler"})', "{{plugin}}"),
        ]),
        ("Filter: candidate nodes by outcome", "timeseries", "ops", [
            ("sum by (outcome) (rate(gpu_scheduler_extender_filter_nodes_total[$__rate_interval]))",
             "{{outcome}}"),
        ]),
    ],
    [
        ("Extender decision latency", "timeseries", "s", [
            ("histogram_quantile(0.5, sum by (verb, le) "
             "(rate(gpu_scheduler_extender_request_seconds_bucket[$__rate_interval])))", "p50 {{verb}}"),
            ("histogram_quantile(0.99, sum by (verb, le) "
             "(rate(gpu_scheduler_extender_request_seconds_bucket[$__rate_interval])))", "p99 {{verb}}"),
        ]),
        ("Webhook review latency", "timeseries", "s", [
            ("histogram_quantile(0.99, sum by (le) "
             "(rate(gpu_scheduler_webhook_review_seconds_bucket[$__rate_interval])))", "p99"),
        ]),
        ("Extender calls by verb and code", "timeseries", "ops", [
            ("sum by (verb, code) (rate(gpu_scheduler_extender_requests_total[$__rate_interval]))",
             "{{verb}} {{code}}"),
        ]),
    ],
    [
        ("Errors and retries", "timeseries", "ops", [
            ('sum by (verb) (rate(gpu_scheduler_extender_requests_total{code!="200"}[$__rate_interval]))',
             "extender {{verb}} not 200"),
            ("sum by (why) (rate(gpu_scheduler_extender_retry_answers_total[$__rate_interval]))",
             "retry: {{why}}"),
            ('sum by (outcome) (rate(gpu_scheduler_webhook_reviews_total{outcome=~"refused|bad-input"}'
             "[$__rate_interval]))", "webhook {{outcome}}"),
        ]),
        ("Preemption: candidate nodes by outcome", "timeseries", "ops", [
            ("sum by (outcome) (rate(gpu_scheduler_extender_preemption_nodes_total[$__rate_interval]))",
             "{{outcome}}"),
            ("sum by (reason) (rate(gpu_scheduler_extender_picks_ended_total[$__rate_interval]))",
             "pick ended: {{reason}}"),
        ]),
        ("Webhook reviews by outcome", "timeseries", "ops", [
            ("sum by (outcome) (rate(gpu_scheduler_webhook_reviews_total[$__rate_interval]))",
             "{{outcome}}"),
        ]),
    ],
    [
        # each extender replica serves the whole cluster: max, not sum, over them
        ("Cluster GPUs by model", "timeseries", "short", [
            ("max by (model, state) (gpu_scheduler_extender_cluster_gpus)", "{{model}} {{state}}"),
        ]),
        ("GPUs allocated of the usable", "timeseries", "percentunit", [
            ('max by (model) (gpu_scheduler_extender_cluster_gpus{state="allocated"})'
             ' / max by (model) (gpu_scheduler_extender_cluster_gpus{state="usable"})', "{{model}}"),
            ('sum(max by (model) (gpu_scheduler_extender_cluster_gpus{state="allocated"}))'
             ' / sum(max by (model) (gpu_scheduler_extender_cluster_gpus{state="usable"}))', "all"),
        ]),
        ("Fragmented free GPUs (FGD)", "timeseries", "short", [
            ("max by (model) (gpu_scheduler_extender_fragmented_gpus)", "{{model}} fragmented"),
            ("max by (model) (gpu_scheduler_extender_stranded_gpus)", "{{model}} no shape fits"),
        ]),
    ],
    [
        ("Shares: GPU memory (GiB) of sharing nodes", "timeseries", "short", [
            ("max by (model, state) (gpu_scheduler_extender_share_units)", "{{model}} {{state}}"),
        ]),
        ("Shared GPUs by memory taken", "timeseries", "short", [
            ("max by (le) (sum by (pod, le) (gpu_scheduler_extender_shared_gpu_fill_ratio_bucket))",
             "at most {{le}} taken"),
        ]),
        ("Shared GPUs: mean memory taken", "timeseries", "percentunit", [
            ("max by (model) (gpu_scheduler_extender_shared_gpu_fill_ratio_sum)"
             " / max by (model) (gpu_scheduler_extender_shared_gpu_fill_ratio_count)", "{{model}}"),
        ]),
    ],
    [
        ("Extender view age", "timeseries", "s", [
            ("time() - min by (pod) (gpu_scheduler_extender_cache_last_contact_timestamp_seconds)",
             "{{pod}}"),
        ]),
        ("Degraded view, heartbeat guard", "timeseries", "short", [
            ("max by (pod) (gpu_scheduler_extender_view_degraded)", "degraded {{pod}}"),
            ("max by (pod) (gpu_scheduler_extender_heartbeat_guard_tripped)", "guard {{pod}}"),
        ]),
        ("Agents: seconds since the last sync", "timeseries", "s", [
            ("time() - max by (node) (gpu_scheduler_agent_last_success_timestamp_seconds)", "{{node}}"),
        ]),
    ],
    [
        ("Certificates: days left", "timeseries", "d", [
            ("(min by (secret) (gpu_scheduler_certs_not_after_timestamp_seconds) - time()) / 86400",
             "{{secret}}"),
            ("(min by (job) (gpu_scheduler_tls_certificate_expiry_timestamp_seconds) - time()) / 86400",
             "{{job}} serving"),
        ]),
        ("Targets up", "timeseries", "short", [
            ('sum by (job) (up{job=~"gpu-scheduler|gpu-scheduler-.*"})', "{{job}}"),
        ]),
        ("GPUPlacement Events", "timeseries", "ops", [
            ("sum by (outcome) (rate(gpu_scheduler_extender_placement_events_total[$__rate_interval]))",
             "{{outcome}}"),
        ]),
    ],
]  # fmt: skip


def expressions() -> list[str]:
    """Every PromQL expression of the dashboard, with Grafana's interval variable as 5m."""
    return [e.replace("$__rate_interval", "5m") for row in ROWS for *_, t in row for e, _ in t]


def rule_expressions() -> list[str]:
    rules = yaml.safe_load((FILES / "rules.yaml").read_text())
    return [" ".join(r["expr"].split()) for g in rules["groups"] for r in g["rules"]]


def dashboard() -> dict:
    panels, ident = [], 0
    for y, row in enumerate(ROWS):
        for x, (title, kind, unit, targets) in enumerate(row):
            ident += 1
            panels.append({
                "id": ident, "title": title, "type": kind,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 8, "x": 8 * x, "y": 8 * y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(targets)
                ],
            })  # fmt: skip
    return {
        "uid": "gpu-scheduler",
        "title": "gpu-scheduler",
        "tags": ["gpu-scheduler", "gpu"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                }
            ]
        },
        "panels": panels,
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the expressions) as blocks, as they are written in rules.yaml."""


_Dumper.add_representer(
    str,
    lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None),
)


def outputs() -> dict[Path, str]:
    board = json.dumps(dashboard(), indent=2) + "\n"
    rules = yaml.safe_load((FILES / "rules.yaml").read_text())
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gpu-scheduler",
            "namespace": "gpu-scheduler",
            "labels": {"app.kubernetes.io/part-of": "gpu-scheduler"},
        },
        "spec": rules,
    }
    head = (
        "# Written by tools/monitoring.py from charts/gpu-scheduler/files/rules.yaml: edit that.\n"
    )
    return {
        FILES / "dashboard.json": board,
        DEPLOY / "dashboard.json": board,
        DEPLOY / "prometheusrule.yaml": head
        + yaml.dump(rule, Dumper=_Dumper, sort_keys=False, width=100),
    }


def main(argv: list[str]) -> int:
    check = argv[1:] == ["--check"]
    stale = []
    for path, text in outputs().items():
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.relative_to(ROOT))
        else:
            path.write_text(text)
    if stale:
        print("out of date (python tools/monitoring.py writes them):", *stale, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
