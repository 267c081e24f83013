"""``python -m lab``: the demo (:mod:`lab.demo`), the lab's own entry point. The product's
``gpu-scheduler`` command does not know the lab, which the image does not ship."""

from __future__ import annotations

import argparse
import sys

from gpu_scheduler.logs import setup_logging
from lab import demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab", description="the whole product on a local control plane"
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    demo.configure(parser)
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        return demo.run(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
