"""Every relative link in the README and docs/ reaches a file, and every #anchor a heading of it."""

import re
from pathlib import Path

from digiq.paths import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


def broken_links(page: Path) -> list[str]:
    out = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("mailto"):
            continue  # the web: not checked here
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{page.name}: {target} (no such heading)")
    return out


def test_links_in_the_readme_and_docs_reach_their_files_and_headings():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert [b for page in pages for b in broken_links(page)] == []


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# Pipeline time\n[ok](a.md#pipeline-time) [gone](b.md) [wrong](a.md#diagnostics)\n")
    assert broken_links(tmp_path / "a.md") == ["a.md: b.md (no such file)", "a.md: a.md#diagnostics (no such heading)"]
