"""``gpu-scheduler certs``: a CA and the leaf pairs it signs (the webhook's and the
extender's serving pairs, kube-scheduler's client pair), the trust bundle, and CA
rollover in three steps (see :mod:`certs.store`)."""

from __future__ import annotations

import argparse
import json

from gpu_scheduler.cli import fail


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
    gen.add_argument(
        "--ca-dir",
        metavar="DIR",
        help="the CA lives here (made when absent) and signs this leaf; DIR/ca.crt of the "
        "leaf is then the trust bundle. Without it the CA lives in --out",
    )
    gen.add_argument(
        "--client",
        action="store_true",
        help="a client certificate (clientAuth, CN = --service) instead of a serving one",
    )
    rotate = sub.add_parser(
        "rotate-ca",
        help="one step of a CA rollover: begin, switch, finish",
        description="begin: make a new CA, trusted beside the old one (publish the bundle "
        "and wait); switch: the new CA signs from now on (re-issue the leaves with "
        "generate, publish them, wait); finish: drop the old CA from the bundle (publish "
        "it). No peer ever stops trusting another in between.",
    )
    rotate.add_argument("phase", choices=("begin", "switch", "finish"))
    rotate.add_argument("--ca-dir", required=True, metavar="DIR")
    rotate.add_argument("--ca-days", type=int, default=3650, help="new CA validity (default 3650)")
    bundle = sub.add_parser(
        "ca-bundle",
        help="print the trust bundle base64-encoded, for clientConfig.caBundle",
        description="Print the trust bundle of a CA directory (ca.crt, plus ca-next.crt or "
        "ca-previous.crt during a rollover) or a leaf's ca.crt as base64 (one line), the "
        "form of a webhook's clientConfig.caBundle.",
    )
    bundle.add_argument("dir", metavar="DIR")
    _configure_controller(sub)


def _configure_controller(sub: argparse._SubParsersAction) -> None:
    ctl = sub.add_parser(
        "controller",
        help="make and keep the install's certificates inside the cluster (a Deployment)",
        description="Keep the Secrets gpu-scheduler-internal-ca and "
        "gpu-scheduler-{webhook,extender,scheduler}-tls in NAMESPACE: a private CA (never "
        "leaves the cluster), the leaves it "
        "signs, renewed 30 days before they expire, the CA rolled over in three steps before "
        "it does; the webhook's caBundle injected; kube-scheduler rolled when its pair "
        "changes; the webhook armed with its failurePolicy once it serves. /readyz is 200 "
        "once everything is in place.",
    )
    ctl.add_argument("--namespace", required=True, help="the install's namespace")
    ctl.add_argument("--kubeconfig", help="default: in-cluster, else ~/.kube/config")
    ctl.add_argument("--webhook-configuration", default="gpu-scheduler-webhook")
    ctl.add_argument("--scheduler-deployment", default="gpu-scheduler")
    ctl.add_argument(
        "--webhook-deployment",
        default="gpu-scheduler-webhook",
        help="the webhook's Deployment: its first Ready replica arms the webhook",
    )
    ctl.add_argument(
        "--webhook-failure-policy",
        choices=("Fail", "Ignore"),
        default="Fail",
        help="the webhook's failurePolicy once it serves (default Fail). The install "
        "registers it with Ignore; the controller sets this once the caBundle is in place "
        "and the webhook's Deployment has a Ready replica, and never sets Ignore back",
    )
    ctl.add_argument(
        "--interval",
        default="1m",
        help="between passes (default 1m: a pass is six reads, and it puts back a caBundle "
        "someone overwrote)",
    )
    ctl.add_argument("--days", type=int, default=365, help="leaf validity (default 365)")
    ctl.add_argument("--ca-days", type=int, default=3650, help="CA validity (default 3650)")
    ctl.add_argument(
        "--ca-renew-before",
        default="8760h",
        help="roll the CA over when it has less than this left (default 8760h, a year; "
        "over 60 days)",
    )
    ctl.add_argument(
        "--settle",
        default="5m",
        help="between rollover steps: every Secret volume has the new bundle by then (default 5m)",
    )
    ctl.add_argument("--once", action="store_true", help="one pass, then exit (non-zero: failed)")
    ctl.add_argument("--host", default="0.0.0.0", help="ops server address")
    ctl.add_argument(
        "--port", type=int, default=8090, help="/healthz, /readyz, /metrics (default 8090; 0: none)"
    )


def run(args: argparse.Namespace) -> int:
    from certs import build, store

    if args.certs_command == "controller":
        return _run_controller(args)
    if args.certs_command == "ca-bundle":
        try:
            print(store.ca_bundle(args.dir))
        except (OSError, ValueError) as exc:
            return fail("certs ca-bundle", exc)
        return 0
    if args.certs_command == "rotate-ca":
        try:
            done = store.rotate_ca(args.ca_dir, args.phase, days=args.ca_days)
        except (OSError, ValueError) as exc:
            return fail(f"certs rotate-ca {args.phase}", exc)
        print(json.dumps({"phase": args.phase, "done": done, "ca_dir": args.ca_dir}))
        return 0
    try:
        identity = build.service_identity(args.service, args.namespace, args.ip)
        if args.days < 1 or args.ca_days < 1:
            raise ValueError("--days and --ca-days must be at least 1")
        if args.ca_days < args.days:
            raise ValueError("--ca-days must not be shorter than --days")
        outcome = store.generate(
            args.out,
            identity,
            days=args.days,
            ca_days=args.ca_days,
            force=args.force,
            ca_dir=args.ca_dir,
            client=args.client,
        )
    except (OSError, ValueError) as exc:
        return fail("certs generate", exc)
    report = {
        "action": outcome.action,
        "reason": outcome.reason,
        "ca_reused": outcome.ca_reused,
        "dir": args.out,
        **outcome.serving,
    }
    print(json.dumps(report))
    return 0


def _run_controller(args: argparse.Namespace) -> int:
    import datetime as dt
    import logging
    import signal
    import threading

    from certs import controller, reconcile
    from gpu_scheduler.durations import parse_duration
    from gpu_scheduler.kube import api_client

    try:
        interval = parse_duration(args.interval)
        settings = reconcile.Settings(
            namespace=args.namespace,
            leaf_days=args.days,
            ca_days=args.ca_days,
            ca_renew_before=dt.timedelta(seconds=parse_duration(args.ca_renew_before)),
            settle=dt.timedelta(seconds=parse_duration(args.settle)),
        )
    except (ValueError, OverflowError) as exc:
        return fail("certs controller", exc)
    targets = controller.Targets(
        namespace=args.namespace,
        webhook_configuration=args.webhook_configuration,
        scheduler_deployment=args.scheduler_deployment,
        webhook_deployment=args.webhook_deployment,
        failure_policy=args.webhook_failure_policy,
    )
    ctl = controller.Controller(api_client(args.kubeconfig), targets, settings)
    if args.once:
        delay = ctl.sync()
        ok, detail = ctl.ready()
        if not ok:
            return fail("certs controller", detail, 1)
        print(json.dumps({"ready": ok, "armed": ctl.armed, "next_pass_s": delay}))
        return 0
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = None
    if args.port:
        from gpu_scheduler.opsserver import start_ops_server

        server = start_ops_server(args.host, args.port, ctl.ready)
    logging.getLogger("gpu_scheduler.certs").info(
        "certificate controller started",
        extra={"namespace": args.namespace, "interval_s": interval},
    )
    try:
        ctl.run(stop, interval)
    finally:
        if server is not None:
            server.shutdown()
    return 0
