"""``gpu-scheduler extender``: serve the extender under gunicorn."""

from __future__ import annotations

import argparse
import os

from gpu_scheduler.cli import fail
from gpu_scheduler.serveropts import add_cert_reload_option, add_server_options, server_settings


def configure(parser: argparse.ArgumentParser) -> None:
    add_server_options(
        parser,
        port=8888,
        workers=None,
        workers_help="gunicorn workers (default: 1; each worker holds its own cluster cache)",
    )
    parser.add_argument(
        "--kubeconfig", help="kubeconfig for the cluster cache's list+watch (default: in-cluster)"
    )
    parser.add_argument(
        "--heartbeat-namespace",
        default=os.environ.get("POD_NAMESPACE") or None,
        metavar="NAMESPACE",
        help="watch the agents' heartbeat Leases in NAMESPACE (default: "
        "$POD_NAMESPACE, the install's namespace; none: no heartbeats are read)",
    )
    parser.add_argument("--config", help="YAML file with policy weights and limits")
    parser.add_argument(
        "--tls-cert-dir",
        metavar="DIR",
        help="serve over HTTPS with DIR/tls.crt and DIR/tls.key (reloaded when they "
        "change); /filter and /prioritize are then answered on this port only",
    )
    parser.add_argument(
        "--client-ca",
        metavar="FILE",
        help="with --tls-cert-dir: /filter and /prioritize require a client certificate "
        "signed by a CA in FILE (kube-scheduler's tlsConfig certFile); reloaded on change",
    )
    parser.add_argument(
        "--ops-port",
        type=int,
        metavar="PORT",
        help="also serve /healthz, /readyz and /metrics in the clear on PORT (never the verbs)",
    )
    # 0.1.0's manifests pass --node-source=cluster: still accepted, and nothing else
    parser.add_argument("--node-source", help=argparse.SUPPRESS)
    add_cert_reload_option(parser)


def run(args: argparse.Namespace) -> int:
    from gpu_scheduler.durations import parse_duration
    from gpu_scheduler.serving import metrics_dir_for, serve

    if args.node_source not in (None, "cluster"):
        return fail(
            "extender",
            f"--node-source {args.node_source}: the extender always keeps its cluster "
            "cache now (args mode is gone); drop the flag and set nodeCacheCapable: true",
        )
    workers = args.workers or 1
    try:
        server = server_settings(args, workers)
        interval = parse_duration(args.cert_reload_interval)
    except ValueError as exc:
        return fail("extender", exc)
    if args.client_ca and not args.tls_cert_dir:
        return fail("extender", "--client-ca needs --tls-cert-dir")
    metrics_dir_for(workers)
    from extender.app import create_app
    from extender.config import ConfigError, load_config
    from extender.endpoints import VerbGuard

    try:
        cfg = load_config(args.config)
    except (ConfigError, OSError) as exc:
        return fail("extender", exc)

    tls: dict[str, object] = {}
    reloader = None
    if args.tls_cert_dir:
        from gpu_scheduler.tls import CertReloader, check_pair

        problem = check_pair(args.tls_cert_dir)
        if problem:
            return fail("extender", problem)
        reloader = CertReloader(args.tls_cert_dir, interval, client_ca=args.client_ca)
        tls = reloader.gunicorn_options()

    def factory():  # type: ignore[no-untyped-def]
        return create_app(
            cfg,
            kubeconfig=args.kubeconfig,
            heartbeat_namespace=args.heartbeat_namespace,
            guard=VerbGuard(tls=reloader is not None, client_cert=bool(args.client_ca)),
            tls_ready=reloader.ready if reloader is not None else None,
        )

    serve(factory, max_body=cfg.max_body_bytes, plain_port=args.ops_port, **server, **tls)
    return 0
