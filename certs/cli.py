"""``gpu-scheduler certs``: generate the webhook's CA and serving pair; print the caBundle."""

from __future__ import annotations

import argparse
import json
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    gen = sub.add_parser(
        "generate",
        help="write ca.crt, ca.key, tls.crt, tls.key (kept when still good)",
        description="Write a CA and a serving certificate for a Service into DIR. A "
        "valid pair whose SANs cover the requested names is kept unless --force or it "
        "expires within 30 days; a replaced serving pair is signed by the existing CA "
        "when that CA is still good, so the injected caBundle stays valid.",
    )
    gen.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    gen.add_argument("--service", required=True, help="the webhook's Service name")
    gen.add_argument("--namespace", required=True, help="the Service's namespace")
    gen.add_argument(
        "--ip",
        action="append",
        default=[],
        metavar="IP",
        help="an IP address SAN (repeatable), e.g. 127.0.0.1 for local tests",
    )
    gen.add_argument(
        "--days", type=int, default=365, help="serving certificate validity (default 365)"
    )
    gen.add_argument("--ca-days", type=int, default=3650, help="CA validity (default 3650)")
    gen.add_argument("--force", action="store_true", help="replace everything, the CA included")
    bundle = sub.add_parser(
        "ca-bundle",
        help="print DIR/ca.crt base64-encoded, for clientConfig.caBundle",
        description="Print DIR/ca.crt as base64 (one line), the form of a webhook's "
        "clientConfig.caBundle.",
    )
    bundle.add_argument("dir", metavar="DIR")


def run(args: argparse.Namespace) -> int:
    from certs import build, store

    if args.certs_command == "ca-bundle":
        try:
            print(store.ca_bundle(args.dir))
        except (OSError, ValueError) as exc:
            print(f"gpu-scheduler certs ca-bundle: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        identity = build.service_identity(args.service, args.namespace, args.ip)
        if args.days < 1 or args.ca_days < 1:
            raise ValueError("--days and --ca-days must be at least 1")
        if args.ca_days < args.days:
            raise ValueError("--ca-days must not be shorter than --days")
        outcome = store.generate(
            args.out, identity, days=args.days, ca_days=args.ca_days, force=args.force
        )
    except (OSError, ValueError) as exc:
        print(f"gpu-scheduler certs generate: {exc}", file=sys.stderr)
        return 2
    report = {
        "action": outcome.action,
        "reason": outcome.reason,
        "ca_reused": outcome.ca_reused,
        "dir": args.out,
        **outcome.serving,
    }
    print(json.dumps(report))
    return 0
