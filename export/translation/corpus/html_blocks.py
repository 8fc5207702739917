"""Split an HTML page into text blocks (paragraphs, headings, list items, cells).

Shared by the LibreOffice help and Debian documentation extractors.  Each block
keeps its tag, attributes and plain text; nested blocks (a ``<p>`` inside an
``<li>``) are reported separately so a list item never swallows its paragraphs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

BLOCK_TAGS = frozenset(
    "p h1 h2 h3 h4 h5 h6 li dt dd td th caption title".split()
)
# Content that is code or machinery, not prose to translate.
SKIP_TAGS = frozenset("script style pre noscript head".split())
VOID_TAGS = frozenset("area base br col embed hr img input link meta param source track wbr".split())
_SPACE = re.compile(r"\s+")


@dataclass
class Block:
    tag: str
    attrs: dict[str, str]
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return _SPACE.sub(" ", "".join(self.parts)).strip()

    @property
    def signature(self) -> str:
        """Structural fingerprint used to line up two translations of one page."""
        return f"{self.tag}.{self.attrs.get('class', '')}"


class _Collector(HTMLParser):
    def __init__(self, skip_attrs, block_classes):
        super().__init__(convert_charrefs=True)
        self.skip_attrs = skip_attrs
        self.block_classes = block_classes
        self.stack: list[tuple[str, Block | None, bool]] = []  # (tag, block, skipping)
        self.blocks: list[Block] = []

    def _skipping(self) -> bool:
        return bool(self.stack) and self.stack[-1][2]

    def handle_starttag(self, tag, attrs):
        if tag in VOID_TAGS:
            if tag == "br":
                self.handle_data(" ")
            return
        attrs = {k: v or "" for k, v in attrs}
        skip = self._skipping() or tag in SKIP_TAGS or self.skip_attrs(attrs)
        is_block = tag in BLOCK_TAGS or attrs.get("class") in self.block_classes
        block = Block(tag, attrs) if is_block and not skip else None
        self.stack.append((tag, block, skip))

    def handle_endtag(self, tag):
        # HTML lets some end tags go missing: close everything up to the matching tag.
        if not any(t == tag for t, _, _ in self.stack):
            return
        while self.stack:
            open_tag, block, _ = self.stack.pop()
            if block is not None and block.text:
                self.blocks.append(block)
            if open_tag == tag:
                break

    def handle_data(self, data):
        if self._skipping():
            return
        for _, block, _ in reversed(self.stack):
            if block is not None:
                block.parts.append(data)
                return


def blocks(html: str, skip_attrs=lambda attrs: False, block_classes=frozenset()) -> list[Block]:
    """Return the non-empty text blocks of ``html`` in document order of their end tags.

    ``skip_attrs(attrs)`` may hide an element and everything inside it;
    elements whose class is in ``block_classes`` count as blocks whatever their tag.
    """
    collector = _Collector(skip_attrs, block_classes)
    collector.feed(html)
    collector.close()
    return collector.blocks
