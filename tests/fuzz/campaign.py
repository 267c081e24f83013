"""The full fuzz campaign: every endpoint, one table.

    .venv/bin/python -m tests.fuzz.campaign --count 10000 [--seed 1] [--write-docs]

Starts the extender with its cache listed from a fake API (tests/fake_extender.py),
the webhook over TLS (2 workers, as deployed), and a local control plane with the
extender as deployed (1 worker, its cache listing that API server); sends ``--count``
generated requests to each of /filter, /prioritize, /preempt (both extenders) and
/mutate, and prints the table (``--write-docs``: also into
docs/ROBUSTNESS.md). Exits non-zero when any endpoint answered 5xx, lost a worker,
logged an alarm or failed the valid request afterwards.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from tests.fuzz import harness, servers

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ROBUSTNESS.md"
BEGIN, END = "<!-- fuzz-table:begin -->", "<!-- fuzz-table:end -->"


def cluster_targets(stack: ExitStack, work: Path) -> list[harness.Target]:
    from kubernetes import client

    from lab.kubelet_shim import node_object
    from lab.stack import bare_stack

    local, core = stack.enter_context(bare_stack("fuzz-"))
    for node in servers.base_nodes():
        meta = node["metadata"]
        core.create_node(node_object(meta["name"], labels=meta["labels"], gpus=8))
    proc = local.start_extender()
    url = f"http://127.0.0.1:{local.extender_port}"
    del client
    return servers.extender_targets(url, proc.popen.pid, proc.log_path, "cluster")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000, help="requests per endpoint")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-cluster", action="store_true", help="no control plane")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fuzz-")))
        url, pid, log = stack.enter_context(servers.extender_fake_cluster(work))
        targets = servers.extender_targets(url, pid, log, "fake API")
        if not args.skip_cluster:
            targets += cluster_targets(stack, work)
        hook_url, hook_pid, hook_log, ca = stack.enter_context(servers.webhook(work))
        targets.append(servers.webhook_target(hook_url, hook_pid, hook_log, ca))
        results = []
        for target in targets:
            print(f"{target.name}: {args.count} requests ...", file=sys.stderr, flush=True)
            results.append(harness.run(target, args.seed, args.count))
    text = harness.table(results)
    command = f"python -m tests.fuzz.campaign --count {args.count} --seed {args.seed}"
    print(text)
    if args.write_docs:
        block = f"{BEGIN}\n`{command}` ({harness.environment_note()}):\n\n{text}\n{END}"
        doc = DOC.read_text()
        start, end = doc.index(BEGIN), doc.index(END) + len(END)
        DOC.write_text(doc[:start] + block + doc[end:])
    return 0 if all(r.clean for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
