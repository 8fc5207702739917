"""Model cards: the alignment section is generated from the report and replaces itself on a rerun."""

from __future__ import annotations

from attnserve.export.model_card import ALIGNMENT_TITLE, alignment_lines, with_section

REPORT = {
    "pairs": 12,
    "models": {
        "m": {
            "attention_layers": 2,
            "default_layer": 1,
            "directions": {
                "en->zh-TW": {
                    "gold_items": 30,
                    "layers": [{"layer": 0, "accuracy": 0.5}, {"layer": 1, "accuracy": 0.9}],
                    "diagonal": {"accuracy": 0.4},
                    "chance": 0.2,
                },
            },
        }
    },
}
CARD = "# m\n\n## Scores\n\nx\n\n## Files\n\n| f |\n"


def test_alignment_section_lists_every_layer_and_marks_the_served_one():
    lines = alignment_lines(REPORT, "m")
    assert lines[0] == ALIGNMENT_TITLE
    assert "| 0 | 0.500 |" in lines and "| 1 (served by default) | 0.900 |" in lines
    assert "| diagonal baseline | 0.400 |" in lines and "| chance | 0.200 |" in lines


def test_section_goes_before_files_and_a_rerun_replaces_it():
    once = with_section(CARD, alignment_lines(REPORT, "m"))
    assert once.index(ALIGNMENT_TITLE) < once.index("## Files") and once.startswith("# m\n\n## Scores")
    changed = {**REPORT, "pairs": 99}
    twice = with_section(once, alignment_lines(changed, "m"))
    assert twice.count(ALIGNMENT_TITLE) == 1 and "on 99 test pairs" in twice and "on 12 test pairs" not in twice
    assert twice.endswith("## Files\n\n| f |\n")
