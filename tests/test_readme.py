"""The README stays short, its links resolve, and nothing points outside the repository.

MkDocs (`make docs`, --strict) checks the links inside docs/; the README is outside the
site, so its relative links are checked here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def test_the_readme_fits_on_a_few_screens() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines: move detail into docs/ (at most 300)"


def test_the_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    assert targets, "the README links into docs/"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_nothing_points_outside_the_repository() -> None:
    # The design references are restated in docs/design/; a path out of the checkout
    # would break in every clone.
    # Spelled in parts, so that this file does not match the grep it stands for.
    shared = "shared" + "/"
    outside = re.compile(re.escape(".." + "/") + f"shared|{shared}reference|{shared}ARCH")
    offenders = []
    for base in (
        "README.md",
        "Makefile",
        "mkdocs.yml",
        "pyproject.toml",
        "docs",
        "src",
        "tests",
        "benchmarks",
    ):
        paths = [ROOT / base] if (ROOT / base).is_file() else sorted((ROOT / base).rglob("*"))
        for path in paths:
            if path.suffix not in {".md", ".py", ".yaml", ".yml", ".toml", ".txt", ""}:
                continue
            if not path.is_file() or path == Path(__file__).resolve():
                continue
            if outside.search(path.read_text(errors="replace")):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"these files point outside the repository: {offenders}"
