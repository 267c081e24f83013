"""The house rules, read from the source with ``ast``: the floor (``gpu_scheduler``)
imports no component; the product never names the lab or the tests, not even as a
string; and no module imports another that imports it back at load time (a
``TYPE_CHECKING`` import counts: it is a circle a reader has to follow)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOOR = "gpu_scheduler"
COMPONENTS = ("extender", "webhook", "agent", "certs")
PRODUCT = (FLOOR, *COMPONENTS)
LAB_NAME = re.compile(r"^(lab|tests)(\.|$)")


def modules() -> dict[str, Path]:
    found = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path, *, top_level_only: bool) -> set[str]:
    """Modules ``path`` imports (``top_level_only``: those imported when it loads,
    ``if TYPE_CHECKING:`` blocks included; not those inside functions)."""
    tree = ast.parse(path.read_text())
    nodes = ast.walk(tree) if not top_level_only else _load_time(tree.body)
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def _load_time(body: list[ast.stmt]):
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            blocks = [node.body, node.orelse]
            if isinstance(node, ast.Try):
                blocks += [h.body for h in node.handlers] + [node.finalbody]
            for block in blocks:
                yield from _load_time(block)


def test_the_floor_imports_no_component():
    for name, path in modules().items():
        if name.split(".")[0] != FLOOR:
            continue
        above = {m for m in imports(path, top_level_only=False) if m.split(".")[0] in COMPONENTS}
        assert not above, f"{name} imports {sorted(above)}"


#: Modules that are names and pure parsing: what they import, at load time or in a
#: function, must never reach an API client, a server or a socket.
PURE = ("gpu_scheduler.contract", "gpu_scheduler.sharing", "gpu_scheduler.podspec")
IO_MODULES = re.compile(
    r"^(gpu_scheduler\.(kube|http|serving|worker|opsserver)|kubernetes|urllib3|flask|grpc|requests|socket)(\.|$)"
)


def test_the_contract_and_its_parsers_import_nothing_that_does_io():
    known = modules()
    for start in PURE:
        seen, stack = set(), [start]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            found = imports(known[name], top_level_only=False)
            bad = sorted(m for m in found if IO_MODULES.match(m))
            assert not bad, f"{start} reaches {name}, which imports {bad}"
            stack.extend(m for m in found if m in known)


def test_the_product_never_names_the_lab_or_the_tests():
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        named = {m for m in imports(path, top_level_only=False) if LAB_NAME.match(m)}
        named |= {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and LAB_NAME.match(node.value)
        }
        assert not named, f"{name} names {sorted(named)}"


def test_no_module_imports_one_that_imports_it_back_at_load_time():
    known = modules()
    graph = {
        name: {m for m in imports(path, top_level_only=True) if m in known and m != name}
        for name, path in known.items()
    }
    for name, deps in graph.items():
        for dep in deps:
            seen, stack = set(), [dep]
            while stack:
                current = stack.pop()
                if current == name:
                    raise AssertionError(f"{name} -> {dep} -> ... -> {name}")
                if current not in seen:
                    seen.add(current)
                    stack.extend(graph.get(current, ()))


def test_the_size_rule_finds_a_long_function_and_a_long_file(tmp_path):
    """tools/sizes.py (make lint) names what is over: a product file over 450 lines and
    a product function over 80; the real tree passes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sizes", ROOT / "tools" / "sizes.py")
    sizes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sizes)
    (tmp_path / "extender").mkdir()
    body = "\n".join(f"    x = {i}" for i in range(81))
    (tmp_path / "extender" / "long.py").write_text(f"def f():\n{body}\n" + "\n" * 400)
    found = sizes.offenders(tmp_path)
    assert any("long.py:1 f(): 82 lines" in line for line in found), found
    assert any("long.py: 482 lines" in line for line in found), found
    assert sizes.offenders() == []


def test_a_missing_prerequisite_skips_here_and_fails_in_ci(monkeypatch):
    """What CI must run never passes there as a skip (the trace tests, Kueue, the real
    node, the control planes: tests.helpers.required)."""
    import pytest

    from tests.helpers import required

    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="get it so"):
        required("the trace tests", "get it so")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the trace tests, but get it so"):
        required("the trace tests", "get it so")
