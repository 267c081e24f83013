"""``gpu-scheduler``: one console script, a subcommand per component.

Each subcommand lives in its component as a module with ``configure(parser)`` and
``run(args) -> int``; those modules import nothing heavy at the top, so ``--help``
stays fast and a component's dependencies load only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gpu_scheduler import __version__

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "extender": ("extender.cli", "serve the kube-scheduler extender (filter/prioritize)"),
    "agent": ("agent.cli", "publish this node's GPUs as node labels and capacity (DaemonSet)"),
    "webhook": ("webhook.cli", "serve the mutating admission webhook over TLS"),
    "certs": ("certs.cli", "the install's certificates: generate them, or keep them in-cluster"),
    "status": ("extender.status", "print the cluster's GPU inventory as the extender sees it"),
    "explain": ("extender.explain_cli", "why a GPU pod landed on its node (or has not yet)"),
}


def fail(command: str, problem: object, code: int = 2) -> int:
    """Say on stderr why ``gpu-scheduler COMMAND`` stops (``gpu-scheduler COMMAND:
    PROBLEM``); its exit status, for ``run`` to return (2: what it was given is wrong)."""
    print(f"gpu-scheduler {command}: {problem}", file=sys.stderr)
    return code


#: What ``kubectl gpu-scheduler`` offers a cluster's users: the read-only commands
#: (the rest serve the components, in their pods).
KUBECTL_COMMANDS = ("status", "explain")


def build_parser(
    prog: str = "gpu-scheduler", commands: tuple[str, ...] | None = None
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="GPU-aware scheduling for Kubernetes.")
    parser.add_argument("--version", action="version", version=f"gpu-scheduler {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        if commands is not None and name not in commands:
            continue
        command = importlib.import_module(module)
        child = sub.add_parser(name, help=help_text, description=help_text)
        command.configure(child)
        child.set_defaults(_run=command.run)
    return parser


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    from gpu_scheduler.logs import setup_logging

    setup_logging(args.log_level)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # A user's command (`gpu-scheduler status`, `kubectl gpu-scheduler explain`)
        # that finds no kubeconfig or no API server says so in one line, not a traceback.
        problem = _no_cluster(exc) if args.command in KUBECTL_COMMANDS else None
        if problem is None:
            raise
        return fail(args.command, problem, 1)


def _no_cluster(exc: Exception) -> str | None:
    """Why the cluster could not be reached (no kubeconfig, no answer), or None."""
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError, MaxRetryError

    if isinstance(exc, ConfigException):
        return f"no kubeconfig to use ({exc}); pass --kubeconfig or set KUBECONFIG"
    if isinstance(exc, MaxRetryError):
        return f"cannot reach the API server ({exc.url}): {exc.reason}"
    if isinstance(exc, HTTPError):
        return f"cannot reach the API server: {exc}"
    return None


def kubectl_main(argv: list[str] | None = None) -> int:
    """``kubectl gpu-scheduler status|explain``: kubectl runs the ``kubectl-gpu_scheduler``
    executable it finds on PATH (a plugin); the user's kubeconfig as kubectl's own
    (``--kubeconfig``, else ``KUBECONFIG``, else ``~/.kube/config``)."""
    return main(argv, build_parser("kubectl gpu-scheduler", KUBECTL_COMMANDS))


if __name__ == "__main__":
    sys.exit(main())
