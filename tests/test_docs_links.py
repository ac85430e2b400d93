"""Every relative link and image of README.md and docs/*.md names a file that exists in the checkout: a figure,
an exported result or another page a reader is sent to is never missing."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links inside code blocks are examples
    return [target for target in LINK.findall(text)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]


def test_the_pages_have_relative_links():
    assert sum(len(relative_links(page)) for page in PAGES) > 20


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_names_an_existing_file(page):
    missing = [target for target in relative_links(page)
               if not (page.parent / target.split("#")[0]).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_a_missing_target_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("see [the figure](results/none.png) and [the web](https://example.org) and [here](#top)\n"
                    "```\n[not a link](nowhere.md)\n```\n")
    assert relative_links(page) == ["results/none.png"]
    assert not (page.parent / "results/none.png").exists()
