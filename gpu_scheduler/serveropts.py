"""The command-line options every HTTP server of ours takes (no heavy imports here:
``--help`` stays fast)."""

from __future__ import annotations

import argparse
from typing import Any

from gpu_scheduler.durations import parse_duration


def add_server_options(
    parser: argparse.ArgumentParser, *, port: int, workers: int | None, workers_help: str
) -> None:
    """``--host``, ``--port``, ``--workers``, ``--threads``, ``--request-deadline``."""
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=port, help=f"port (default {port})")
    parser.add_argument("--workers", type=int, default=workers, help=workers_help)
    parser.add_argument("--threads", type=int, default=4, help="threads per worker (default 4)")
    parser.add_argument(
        "--request-deadline",
        default="10s",
        metavar="DURATION",
        help="a request must arrive whole within this time of its first byte, or it is "
        "answered 408 and closed; slow clients never hold a thread (default 10s)",
    )


def server_settings(args: argparse.Namespace, workers: int) -> dict[str, Any]:
    """What :func:`add_server_options`' options say, as keywords of
    :func:`gpu_scheduler.serving.serve` (``workers``: the count in effect). Raises
    ValueError when ``--request-deadline`` is not a duration."""
    return {
        "host": args.host,
        "port": args.port,
        "workers": workers,
        "threads": args.threads,
        "request_deadline": parse_duration(args.request_deadline),
    }


def add_cert_reload_option(parser: argparse.ArgumentParser) -> None:
    """``--cert-reload-interval``, for servers that serve TLS from files."""
    parser.add_argument(
        "--cert-reload-interval",
        default="10s",
        metavar="DURATION",
        help="how often a connection may check the certificate files for a change (default 10s)",
    )
