"""``gpu-scheduler webhook``: serve the mutating admission webhook under gunicorn, over TLS."""

from __future__ import annotations

import argparse

from gpu_scheduler.cli import fail
from gpu_scheduler.serveropts import add_cert_reload_option, add_server_options, server_settings


def configure(parser: argparse.ArgumentParser) -> None:
    add_server_options(parser, port=8443, workers=2, workers_help="gunicorn workers (default 2)")
    parser.add_argument(
        "--cert-dir",
        required=True,
        metavar="DIR",
        help="directory with tls.crt and tls.key (a mounted kubernetes.io/tls Secret)",
    )
    parser.add_argument("--config", help="YAML file: schedulerName, extraTolerations, ...")
    add_cert_reload_option(parser)


def run(args: argparse.Namespace) -> int:
    from gpu_scheduler.durations import parse_duration
    from gpu_scheduler.serving import metrics_dir_for, serve

    if args.workers < 1 or args.threads < 1:
        return fail("webhook", "--workers and --threads must be >= 1")
    try:
        interval = parse_duration(args.cert_reload_interval)
        server = server_settings(args, args.workers)
    except ValueError as exc:
        return fail("webhook", exc)
    metrics_dir_for(args.workers)
    from gpu_scheduler.tls import CertReloader, check_pair
    from webhook.app import create_app
    from webhook.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except (ConfigError, OSError) as exc:
        return fail("webhook", exc)
    reloader = CertReloader(args.cert_dir, interval)
    # Fail fast on missing or broken key material; each worker loads its own context.
    problem = check_pair(args.cert_dir)
    if problem:
        return fail("webhook", problem)

    def factory():  # type: ignore[no-untyped-def]
        return create_app(cfg, ready=reloader.ready)

    serve(factory, max_body=cfg.max_body_bytes, **server, **reloader.gunicorn_options())
    return 0
