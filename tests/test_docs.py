"""The user's documents stay a user's: the README is a guide of at most 250 lines, and every
document it or docs/ links to exists, with the heading a link names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_a_guide_of_at_most_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_reach_their_documents_and_headings(doc):
    for target, _, fragment in re.findall(r"\]\(([^)#\s]+\.md)(#([^)]+))?\)", doc.read_text()):
        path = (doc.parent / target).resolve()
        assert path.is_file(), f"{doc.name} links to {target}"
        if fragment:
            headings = {anchor(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}
            assert fragment in headings, f"{doc.name} links to {target}#{fragment}"
