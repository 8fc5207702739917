"""Model cards: the alignment section is generated from the report and replaces itself on a rerun."""

from __future__ import annotations

from attnserve.export.common.model_card import VERSIONS_TITLE, with_section, write_card
from attnserve.export.translation.model_card import ALIGNMENT_TITLE, alignment_lines

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


def test_beam_search_is_shown_by_domain_beside_greedy_and_the_default_search_is_named():
    from attnserve.export.translation.model_card import beam_domain_section, default_search_lines

    row = lambda bleu, chrf, pairs=5: {"pairs": pairs, "bleu": bleu, "chrf": chrf}  # noqa: E731
    direction = {"by_domain": {"everyday": row(10.0, 30.0), "software": row(20.0, 40.0)},
                 "served_beam": {"beam_size": 4, "bleu": 1, "chrf": 2,
                                 "by_domain": {"everyday": row(12.5, 33.3), "software": row(21.0, 41.0)}}}
    lines = beam_domain_section({"directions": {"zh-TW->en": direction}})
    assert lines[0] == "### Served beam search (4 beams) against greedy, by domain"
    assert "| zh-TW->en | everyday | 5 | 10.0 / 30.0 | 12.5 / 33.3 |" in lines
    assert "| zh-TW->en | software | 5 | 20.0 / 40.0 | 21.0 / 41.0 |" in lines
    older = {"directions": {"zh-TW->en": {**direction, "served_beam": {"beam_size": 4, "bleu": 1, "chrf": 2}}}}
    assert beam_domain_section(older) == []  # reports before beam search was scored by domain
    assert "4 beams" in default_search_lines({"decoding": {"beam_size": 4}})[0]
    assert default_search_lines({}) == [] and default_search_lines({"decoding": {"beam_size": 1}}) == []


def test_the_lecture_section_names_the_search_that_answered():
    from attnserve.export.translation.model_card import lecture_section

    result = {"source": "深度學習", "target": "en", "output": "deep learning", "right": True,
              "accepted": ["deep learning"]}
    report = {"right": 1, "total": 1, "results": [result]}
    assert ", served greedy." in "\n".join(lecture_section(report, None))  # reports before the key: greedy
    assert ", served with 4 beams (the default search)." in "\n".join(lecture_section({**report, "beam_size": 4}, None))


def test_a_regenerated_card_keeps_the_story_of_each_version(tmp_path):
    out = tmp_path / "README.md"
    story = [VERSIONS_TITLE, "", "Version 2 continued version 1:", "", "```bash", "train --minutes 90", "```"]
    out.write_text(with_section(CARD, story))
    write_card(out, CARD.replace("x", "new scores"))
    card = out.read_text()
    assert "new scores" in card and "train --minutes 90" in card and card.count(VERSIONS_TITLE) == 1
    assert card.index(VERSIONS_TITLE) < card.index("## Files")
    write_card(out, CARD)  # and so does the next regeneration
    assert "train --minutes 90" in out.read_text()
