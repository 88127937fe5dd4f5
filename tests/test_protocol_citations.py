"""Every citation of ``docs/protocol.md`` names sections the page has.

The code cites the page as ``(docs/protocol.md, Section)``, several sections joined by ", " or
" and ", or ``(docs/protocol.md: Section, Section)``; a renamed or removed heading fails here
with the files that still cite it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "protocol.md"
CITING = ("shmbus", "netbridge", "tests", "tools", "examples")
CITATION = re.compile(r"docs/protocol\.md[,:]\s+([^)]*?)\)", re.DOTALL)


def _headings(page: str) -> list[str]:
    return [line[3:].strip() for line in page.splitlines() if line.startswith("## ")]


def _unknown_sections(cited: str, headings: list[str]) -> str:
    """What is left of ``cited`` after taking known headings and separators off its front, in
    order (longest heading first, since a heading may itself hold a comma or "and")."""
    rest = " ".join(cited.replace("#", " ").split())
    by_length = sorted(headings, key=len, reverse=True)
    while rest:
        heading = next((h for h in by_length if rest.startswith(h)), None)
        if heading is None:
            return rest
        rest = rest[len(heading):]
        for separator in (", ", " and ", "; "):
            if rest.startswith(separator):
                rest = rest[len(separator):]
                break
    return ""


def _citing_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in CITING:
        files += [path for path in sorted((ROOT / folder).rglob("*"))
                  if path.suffix in (".py", ".pyi", ".c", ".h", ".md")]
    return [path for path in files if path != Path(__file__).resolve()]


def test_every_citation_names_a_section_of_the_page() -> None:
    headings = _headings(PAGE.read_text())
    unknown = [f"{path.relative_to(ROOT)}: {match.group(1)!r}"
               for path in _citing_files()
               for match in CITATION.finditer(path.read_text(errors="replace"))
               if _unknown_sections(match.group(1), headings)]
    assert unknown == []


def test_the_check_refuses_an_unknown_section() -> None:
    headings = ["Frame header", "Appending, fragments and padding", "Log buffer layout"]
    assert _unknown_sections("Appending, fragments and padding", headings) == ""
    assert _unknown_sections("Log buffer layout and Frame\n    # header", headings) == ""
    assert _unknown_sections("Frame header, Frame footer", headings) == "Frame footer"
