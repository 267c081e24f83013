"""The documents hold together: the README's figures are BENCHMARKS.md's, the README
stays short, every relative link (and anchor) resolves, and user documents cite no
issue numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
ARCHIVE = DOCS / "archive"


def documents() -> list[Path]:
    return [README, *sorted(p for p in DOCS.rglob("*.md") if "examples" not in p.parts)]


def user_documents() -> list[Path]:
    return [p for p in documents() if ARCHIVE not in p.parents]


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if not m:
            continue
        base = slug(m[1])
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def section(path: Path, anchor: str) -> str:
    """The text under the heading whose anchor is `anchor`, up to the next heading of
    the same or a higher level."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(#{1,6}) (.+)", line)
        if m and slug(m[2]) == anchor:
            level = len(m[1])
            body = []
            for rest in lines[i + 1 :]:
                n = re.match(r"(#{1,6}) ", rest)
                if n and len(n[1]) <= level:
                    break
                body.append(rest)
            return "\n".join(body)
    raise AssertionError(f"{path.name} has no section #{anchor}")


def results_rows() -> list[list[str]]:
    text = README.read_text()
    start, end = text.index("<!-- results:start -->"), text.index("<!-- results:end -->")
    rows = [line for line in text[start:end].splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]
    assert cells, "README: the results table is empty"
    return cells


def has_number(text: str, figure: str) -> bool:
    """`figure` (98.8%, 1.39x, 10,000) stands in `text` as that number."""
    number = re.sub(r"[^\d.,]", "", figure).strip(".,")
    assert number, figure
    return re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,]\d)", text) is not None


@pytest.mark.parametrize("row", results_rows(), ids=lambda row: row[0][:40])
def test_every_readme_figure_is_the_one_in_benchmarks(row):
    result, figure, date, commit, command, source = row
    link = re.fullmatch(r"\[[^\]]+\]\((docs/[^)#]+)#([^)]+)\)", source)
    assert link, f"README results row {result!r}: the source must link a section"
    body = section(ROOT / link[1], link[2])
    figures = re.findall(r"\*\*([^*]+)\*\*", figure)
    assert figures, f"README results row {result!r}: no **figure**"
    for value in figures:
        assert has_number(body, value), f"{value} (README) is not in {link[1]}#{link[2]}"
    assert date in body, f"{date} (README) is not in {link[1]}#{link[2]}"
    assert commit.strip("`") in body, f"{commit} (README) is not in {link[1]}#{link[2]}"
    script = re.search(r"[\w/]+\.py|make [\w-]+|tests\.fuzz\.campaign", command)
    assert script and script[0] in body, f"{command} (README) is not in {link[1]}#{link[2]}"


def test_the_figure_check_fails_on_a_changed_figure():
    row = results_rows()[0]
    link = re.fullmatch(r"\[[^\]]+\]\((docs/[^)#]+)#([^)]+)\)", row[5])
    body = section(ROOT / link[1], link[2])
    value = re.findall(r"\*\*([^*]+)\*\*", row[1])[0]
    assert has_number(body, value)
    assert not has_number(body, value.replace(".", "4", 1) + "7")


def test_readme_is_short():
    assert len(README.read_text().splitlines()) < 250


def test_readme_install_block_is_one_sh_block():
    text = README.read_text()
    block = text[text.index("<!-- install:start -->") : text.index("<!-- install:end -->")]
    assert block.count("```sh") == 1 and block.count("```") == 2
    assert "helm install gpu-scheduler oci://" in block


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    for target in LINK.findall(prose(doc.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        missing_anchor = file.exists() and file.suffix == ".md" and anchor != ""
        if not file.exists() or (missing_anchor and anchor not in anchors(file)):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: broken links {broken}"


ISSUE = re.compile(r"\bissues? #?\d+|\bissue #?\d+|(?<![\w&/])#\d{2,}\b", re.I)


@pytest.mark.parametrize("doc", user_documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers_in_user_documents(doc):
    found = ISSUE.findall(prose(doc.read_text()))
    assert not found, f"{doc.relative_to(ROOT)} cites issue numbers: {found}"


def test_chart_values_markers_are_in_configuration():
    text = (DOCS / "configuration.md").read_text()
    body = section(DOCS / "configuration.md", "chart-values")
    assert "<!-- helm-docs:start -->" in body and "<!-- helm-docs:end -->" in body
    assert text.index("<!-- helm-docs:start -->") < text.index("<!-- helm-docs:end -->")


def test_generated_sections_keep_their_markers():
    bench = (DOCS / "BENCHMARKS.md").read_text()
    assert "## Placement quality on the openb trace" in bench  # tests/bench/trace_reports.py
    for key in ("fill-default", "fill-gpuspec20", "fill-multigpu20"):
        assert f"<!-- trace:{key} -->" in bench and f"<!-- /trace:{key} -->" in bench
    robustness = (DOCS / "ROBUSTNESS.md").read_text()  # tests/fuzz/campaign.py
    assert "<!-- fuzz-table:begin -->" in robustness and "<!-- fuzz-table:end -->" in robustness
