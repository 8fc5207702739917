"""What every family's model card generator shares: the files table, replacing one section of a card, and
writing a card so that its hand-written version history survives regeneration."""

from __future__ import annotations

import pathlib


def size_table(model_dir: pathlib.Path) -> list[str]:
    rows = ["| file | size |", "|---|---|"]
    files = sorted(p for p in model_dir.iterdir() if p.is_file())
    rows += [f"| `{p.name}` | {p.stat().st_size / 2**20:.1f} MiB |" for p in files]
    rows.append(f"| total | {sum(p.stat().st_size for p in files) / 2**20:.1f} MiB |")
    return rows


def with_section(card: str, lines: list[str]) -> str:
    """The card with the section titled lines[0] replaced, or inserted before "## Files" when absent."""
    title = lines[0]
    text = "\n".join(lines) + "\n"
    if title in card:
        start = card.index(title)
        end = card.find("\n## ", start + len(title))
        return card[:start] + text + (card[end + 1 :] if end != -1 else "")
    at = card.find("## Files")
    return card + "\n" + text if at == -1 else card[:at] + text + card[at:]


# The hand-written story of each version (what it continued, the exact commands, how its checkpoint and
# search were chosen): kept when a card is regenerated from new measurements.
VERSIONS_TITLE = "## How each version was made"


def write_card(out: pathlib.Path, card: str) -> None:
    """Writes a model card, carrying over the VERSIONS_TITLE section of the card it replaces."""
    if out.exists():
        old = out.read_text()
        if VERSIONS_TITLE in old:
            start = old.index(VERSIONS_TITLE)
            end = old.find("\n## ", start + len(VERSIONS_TITLE))
            card = with_section(card, old[start: None if end == -1 else end].rstrip("\n").split("\n"))
    out.write_text(card)
    print(f"wrote {out}")
