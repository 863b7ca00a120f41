"""The repository owns the documents it cites: every `docs/*.md §N` reference resolves.

Code, tests, the README and `scripts/check` cite the project's design and style as
``docs/design.md §N`` and ``docs/style.md §N`` (``§6.12`` for a subsection, ``§3, §6.12`` for
several). Each cited section must exist as a numbered heading of that document (``## 6. …`` or
``### 6.12 …``), bare ``§N`` inside a document must name one of its own sections, and no file
outside ``docs/`` may cite a design or style document that is not in the repository.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/design.md", "docs/style.md")

#: Folders that are not the repository's text: VCS, environments, caches, data dirs, builds.
_SKIP_DIRS = frozenset(
    {
        ".git",
        ".venv",
        "venv",
        ".venv-ci",
        "__pycache__",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".hypothesis",
        "argus-data",
        "argus-spool",
        "build",
        "dist",
        "node_modules",
    }
)
#: A numbered heading: ``## 6. Title`` or ``### 6.12 Title``.
_HEADING = re.compile(r"^#{2,4}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)
#: A citation of one of our documents and the sections it names: ``docs/design.md §3, §6.12``.
_CITATION = re.compile(r"docs/(design|style)\.md\s*((?:§\s*\d+(?:\.\d+)*(?:,\s*|\s+and\s+)?)+)")
_SECTION = re.compile(r"§\s*(\d+(?:\.\d+)*)")
#: The design and style documents that lived outside the repository, cited by their upper-case names
#: (with or without ``.md``, before a section sign, or as a file name in a path).
_OUTSIDE = re.compile("(" + "DESIGN" + "|" + "STYLE" + r")(\.md)?\s*§|\b(" + "DESIGN|STYLE" + r")\.md\b")


@functools.cache
def _text_files() -> tuple[Path, ...]:
    """Every text file of the checkout, skipping the folders above and binary files."""
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in _SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if not path.is_file() or path.stat().st_size > 4 * 1024 * 1024:
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        out.append(path)
    return tuple(out)


def _sections(doc: str) -> set[str]:
    return set(_HEADING.findall((ROOT / doc).read_text(encoding="utf-8")))


def test_documents_exist_with_numbered_sections() -> None:
    for doc in DOCS:
        sections = _sections(doc)
        assert {"1", "2", "3"} <= sections, f"{doc}: numbered sections expected, found {sorted(sections)}"


def test_every_citation_resolves() -> None:
    known = {doc: _sections(doc) for doc in DOCS}
    broken = []
    cited = 0
    for path in _text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = str(path.relative_to(ROOT))
        for match in _CITATION.finditer(text):
            doc = f"docs/{match.group(1)}.md"
            for section in _SECTION.findall(match.group(2)):
                cited += 1
                if section not in known[doc]:
                    line = text.count("\n", 0, match.start()) + 1
                    broken.append(f"{rel}:{line}: {doc} §{section}")
        if rel in known:
            # Inside a document, a bare §N names one of its own sections.
            own = _CITATION.sub("", text)
            for match in _SECTION.finditer(own):
                if match.group(1) not in known[rel]:
                    line = own.count("\n", 0, match.start()) + 1
                    broken.append(f"{rel}:{line}: §{match.group(1)} (its own)")
    assert not broken, "references to sections that do not exist:\n" + "\n".join(broken)
    assert cited >= 50, f"only {cited} citations found: is the pattern still right?"


def test_no_file_cites_a_document_outside_the_repository() -> None:
    found = []
    for path in _text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in _OUTSIDE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)}")
    assert not found, "cite docs/design.md or docs/style.md instead:\n" + "\n".join(found)


#: README limits (issue 41): a line of prose a person reads without scrolling, a table row that is
#: one current figure rather than a changelog.
PROSE_MAX_CHARS = 200
ROW_MAX_CHARS = 400
#: The one row format of "Measured figures": what, the command, the current figure with its date, the goal.
FIGURES_HEADER = "| what | command | current figure (date, machine) | goal |"
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def _readme_lines() -> list[str]:
    return (ROOT / "README.md").read_text(encoding="utf-8").split("\n")


def test_readme_lines_stay_short() -> None:
    long_lines = []
    for number, line in enumerate(_readme_lines(), 1):
        limit = ROW_MAX_CHARS if line.startswith("|") else PROSE_MAX_CHARS
        if len(line) > limit:
            long_lines.append(f"README.md:{number}: {len(line)} characters (at most {limit})")
    assert not long_lines, "\n".join(long_lines)


def test_measured_figures_have_one_row_format() -> None:
    lines = _readme_lines()
    start = lines.index("## Measured figures")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    table = [line for line in lines[start:end] if line.startswith("|")]
    assert table and table[0] == FIGURES_HEADER, f"the table's header must read {FIGURES_HEADER!r}"
    bad = []
    for row in table[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        if len(cells) != 4 or not cells[1]:
            bad.append(f"not what | command | figure | goal: {row[:80]}")
        elif not (_DATE.search(cells[2]) or "not measured yet" in cells[2]):
            bad.append(f"a current figure needs its date (or 'not measured yet'): {row[:80]}")
        elif len(_DATE.findall(cells[2])) > 1:
            bad.append(f"one current figure per row, its history in bench/README.md: {row[:80]}")
    assert not bad, "\n".join(bad)


def _section(doc: str, number: str) -> str:
    """The text of section ``number`` of ``doc``, up to the next heading of its level or above."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    heads = list(re.finditer(r"^(#{2,4})\s+(\d+(?:\.\d+)*)\.?\s", text, re.MULTILINE))
    for k, head in enumerate(heads):
        if head.group(2) == number:
            level = len(head.group(1))
            end = next((h.start() for h in heads[k + 1 :] if len(h.group(1)) <= level), len(text))
            return text[head.start() : end]
    raise AssertionError(f"{doc} has no §{number}")


def test_design_names_what_the_code_defines() -> None:
    """The design's lists of causes, diagnosis keys and tables are the code's, no more and no fewer."""
    from dataclasses import fields

    from argus.diagnosis import Cause, Diagnosis
    from argus.schema import TABLES

    causes = set(re.findall(r"^\| `(\w+)` \|", _section("docs/design.md", "7.3"), re.MULTILINE))
    assert causes == {c.value for c in Cause}, "docs/design.md §7.3 must list every Cause"
    keys = re.findall(r"^\| `(\w+)`(?:, `(\w+)`)? \|", _section("docs/design.md", "7.1"), re.MULTILINE)
    assert [k for pair in keys for k in pair if k] == [f.name for f in fields(Diagnosis)]
    named = set(re.findall(r"`(\w+)`", _section("docs/design.md", "4")))
    assert set(TABLES) <= named, f"tables missing from docs/design.md §4: {sorted(set(TABLES) - named)}"


def test_design_names_every_command_and_route() -> None:
    """§8.1 names every `argus` command; §9.1 every REST route of the README's table (which
    tests/test_public_surface.py holds to the app's own routes)."""
    import argparse

    from argus.cli import build_parser

    (sub,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    commands = set(re.findall(r"`argus (\w+)", _section("docs/design.md", "8.1")))
    assert commands == set(sub.choices), "docs/design.md §8.1 must name every `argus` command"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    routes = set(re.findall(r"^\| `((?:GET|POST) /api/v1\S*)` \|", readme, re.MULTILINE))
    design = {
        r.replace(" /", " /api/v1/", 1)
        for r in re.findall(r"`((?:GET|POST) /jobs\S*)`", _section("docs/design.md", "9.1"))
    }
    assert routes == design, "docs/design.md §9.1 must name every route of the README's table"
