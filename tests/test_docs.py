"""The docs' relative links: every Markdown link in README.md, reproductions/*/README.md and
docs/*.md that is not a URL names a file of the repository, and a #fragment a heading of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

DOCS = sorted(
    [REPO / "README.md", *REPO.glob("reproductions/*/README.md"), *REPO.glob("docs/*.md")]
)

#: [text](target) and ![alt](target); the target stops at the first space or closing parenthesis
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE = re.compile(r"`[^`]*`")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 ... for repeated ones."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text()):
        m = _HEADING.match(line)
        if not m:
            continue
        slug = _slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(_prose(path.read_text()), 1):
        line = _CODE.sub(lambda m: "" if "](" in m.group(0) else m.group(0), line)  # a link as code is an example
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            found.append((number, target))
    return found


def test_the_docs_are_found():
    names = {p.relative_to(REPO).as_posix() for p in DOCS}
    assert {"README.md", "reproductions/vit/README.md", "reproductions/bst/README.md", "docs/papers.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(doc):
    broken = []
    for number, target in links(doc):
        file, _, fragment = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{number}: {target} (no such file)")
        elif REPO not in dest.parents and dest != REPO:
            broken.append(f"{number}: {target} (outside the repository)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{number}: {target} (no heading #{fragment})")
    assert broken == []


def test_slugs_follow_github():
    assert _slug("Compare runs in Weights & Biases") == "compare-runs-in-weights--biases"
    assert _slug("Class token vs GAP (Appendix D.3)") == "class-token-vs-gap-appendix-d3"
    assert _slug("Patch size at 16 / 49 / 196 tokens") == "patch-size-at-16--49--196-tokens"
    assert _slug("`torch.compile` and `channels_last`") == "torchcompile-and-channels_last"
