"""The design the code cites lives in the project: `docs/design.md` has every section a module names,
and no module cites a design file a clone of the project does not have."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

DESIGN = REPO / "docs" / "design.md"
CITED_SECTION = re.compile(r'docs/design\.md,\s+"([^"]+)"')


def _sources() -> list[Path]:
    return [p for folder in ("agent", "bench", "tests") for p in sorted((REPO / folder).rglob("*.py"))
            if "__pycache__" not in p.parts and p != Path(__file__)]


def test_no_module_cites_a_design_file_outside_the_project() -> None:
    citing = [str(p.relative_to(REPO)) for p in _sources() if "DESIGN.md" in p.read_text()]
    assert citing == []


def test_every_cited_section_of_the_design_exists() -> None:
    headings = set(re.findall(r"^## (.+)$", DESIGN.read_text(), flags=re.MULTILINE))
    cited = {(str(p.relative_to(REPO)), section)
             for p in _sources() for section in CITED_SECTION.findall(p.read_text())}
    assert cited, "modules cite docs/design.md by section"
    assert [(path, section) for path, section in sorted(cited) if section not in headings] == []
