"""``gpu-scheduler extender``: serve the extender under gunicorn."""

from __future__ import annotations

import argparse
import sys

from gpu_scheduler.serveropts import add_server_options


def configure(parser: argparse.ArgumentParser) -> None:
    add_server_options(
        parser,
        port=8888,
        workers=None,
        workers_help="gunicorn workers (default: 2 in args mode; 1 in cluster mode, where "
        "each worker holds its own cache)",
    )
    parser.add_argument(
        "--node-source",
        choices=("args", "cluster"),
        default="args",
        help="args: Node objects come in each request (nodeCacheCapable: false); "
        "cluster: node names only, facts from a list+watch cache (nodeCacheCapable: true)",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig for cluster mode (default: in-cluster)")
    parser.add_argument("--config", help="YAML file with policy weights and limits")


def run(args: argparse.Namespace) -> int:
    from gpu_scheduler.durations import parse_duration
    from gpu_scheduler.serving import metrics_dir_for, serve

    try:
        deadline = parse_duration(args.request_deadline)
    except ValueError as exc:
        print(f"gpu-scheduler extender: --request-deadline: {exc}", file=sys.stderr)
        return 2
    workers = args.workers or (1 if args.node_source == "cluster" else 2)
    metrics_dir_for(workers)
    from extender.app import create_app
    from extender.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except (ConfigError, OSError) as exc:
        print(f"gpu-scheduler extender: {exc}", file=sys.stderr)
        return 2

    def factory():  # type: ignore[no-untyped-def]
        return create_app(cfg, node_source=args.node_source, kubeconfig=args.kubeconfig)

    serve(
        factory,
        host=args.host,
        port=args.port,
        workers=workers,
        threads=args.threads,
        max_body=cfg.max_body_bytes,
        request_deadline=deadline,
    )
    return 0
