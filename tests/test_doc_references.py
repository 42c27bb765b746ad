"""The README and docs/ back their claims with test names (`test_x.py::test_name`): each one
must name a test that exists, in the file it names, or the claim has lost its evidence."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_DEFINED = re.compile(r"^\s*(?:async )?def (test_\w+)", re.M)
# `name`, `file.py::name` or `dir/file.py::name[param]`, in backticks.
_CITED = re.compile(r"`(?:([\w/]+\.py)::)?(test_\w+)(?:\[[^\]`]*\])?`")


def defined_tests() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("*.py"):
        for name in _DEFINED.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    return found


def cited_tests() -> list[tuple[str, str | None, str]]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [
        (page.relative_to(ROOT).as_posix(), match.group(1), match.group(2))
        for page in pages
        for match in _CITED.finditer(page.read_text(encoding="utf-8"))
    ]


def test_every_test_the_docs_cite_exists_where_they_say() -> None:
    defined = defined_tests()
    cited = cited_tests()
    assert len(cited) > 50  # the pattern still finds the citations
    broken = [
        f"{page}: {file or ''}::{name}"
        for page, file, name in cited
        if name not in defined
        or (file is not None and not any(path.endswith(file) for path in defined[name]))
    ]
    assert broken == []
