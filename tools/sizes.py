"""The house's size rule, as `make lint` checks it: no product file over 450 lines and
no product function over 80 (issue 26). Product: agent/, webhook/, extender/, certs/,
gpu_scheduler/. Tests, benches, the lab and tools are not held to it.

    python tools/sizes.py          # exit 1, naming each offender, when one is over
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("agent", "webhook", "extender", "certs", "gpu_scheduler")
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80


def offenders(root: Path = ROOT) -> list[str]:
    found = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text()
            where = path.relative_to(root)
            lines = len(text.splitlines())
            if lines > MAX_FILE_LINES:
                found.append(f"{where}: {lines} lines (at most {MAX_FILE_LINES})")
            for node in ast.walk(ast.parse(text, str(where))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append(
                            f"{where}:{node.lineno} {node.name}(): {length} lines "
                            f"(at most {MAX_FUNCTION_LINES})"
                        )
    return found


def main() -> int:
    found = offenders()
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
