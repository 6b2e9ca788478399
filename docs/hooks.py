"""mkdocs hook: the generated reference pages (docs/gen_reference.py) join the site's files at
every build, so the CLI and params pages always match the code they describe."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).parent))

import gen_reference  # noqa: E402


def on_files(files, config):
    for path, kind in gen_reference.PAGES.items():
        files.append(File.generated(config, path, content=gen_reference.page(kind)))
    return files


# A link from a page to a repository file outside docs/ (`[x](../tests/test_x.py)`, which the
# tests that own a table's rows look for) has no page to point at in the site: it shows as the
# link text with the file named beside it.
REPO_LINK = re.compile(r"\[([^\]]+)\]\(\.\./([^)#\s]+)\)")


def on_page_markdown(markdown, page, config, files):
    def plain(match: re.Match) -> str:
        text, path = match.groups()
        return text if text.strip("`") == path else f"{text} (`{path}`)"

    return REPO_LINK.sub(plain, markdown)
