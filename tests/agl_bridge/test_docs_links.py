"""Every link between the README and the docs lands: the file exists and so does the heading
its ``#anchor`` names (GitHub's slugs), so no page points readers at a section that is not
there."""

from __future__ import annotations

import re
from pathlib import Path

from tests.paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    out = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{page.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{page.name}: {target}: no heading #{anchor} in {dest.name}")
    return out


def test_slug_follows_github() -> None:
    assert slug("Folder -> job") == "folder---job"
    assert slug("`agl-bridge demo`: the main job") == "agl-bridge-demo-the-main-job"


def test_every_link_in_the_docs_lands() -> None:
    assert len(PAGES) > 10
    problems = [p for page in PAGES for p in broken_links(page)]
    assert problems == []


def test_a_missing_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n\nsee [b](b.md#coming) and [c](c.md)\n")
    (tmp_path / "b.md").write_text("# B\n\n## Here\n")
    assert broken_links(tmp_path / "a.md") == ["a.md: b.md#coming: no heading #coming in b.md",
                                               "a.md: c.md: no such file"]
