"""`attnserve compare`: two fake models side by side, the stacked fallback, JSON, and failures.

The server serves FakeEngine ("fake-translate", reverses its input) and FakeCopyEngine ("fake-copy", copies
it, another attention caption), plus a captioning model that compare must leave out.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from attnserve.clients import cli, comparison, heatmap
from attnserve.clients.client import translation_request
from attnserve.clients.heatmap import display_width
from attnserve.api import generation
from fakes import FakeCopyEngine, FakeEngine

ANSI = re.compile(r"\x1b\[[0-9;]*m")
COPY, REVERSE = "fake-copy", "fake-translate"  # the order the server lists them in (by name)
TEXT = "我愛你們"  # CJK row and column labels, two terminal columns each
WIDE = 200  # columns: side by side fits


@pytest.fixture(scope="module")
def two_models():
    """(address, engines by name): both fake translators and a fake captioning model, served in process."""
    from attnserve.server.edge import app

    captioner = FakeEngine("fake-caption")
    captioner.info = dataclasses.replace(captioner.info, task="image-captioning")
    engines = {REVERSE: FakeEngine(REVERSE), COPY: FakeCopyEngine(COPY), "fake-caption": captioner}
    with app.BackgroundServer(engines) as background:
        yield background.address, engines


@pytest.fixture
def address(two_models):
    address, engines = two_models
    yield address
    for engine in engines.values():
        engine.reset()


def run(capsys, monkeypatch, columns: int, *argv: str) -> tuple[int, list[str], str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


def columns(line: str, start: int, stop: int | None = None) -> str:
    """The characters of `line` between terminal columns start and stop (CJK characters are two wide)."""
    kept, used = "", 0
    for ch in line:
        if used >= start and (stop is None or used + display_width(ch) <= stop):
            kept += ch
        used += display_width(ch)
    return kept


def split_blocks(lines: list[str], gap: int = comparison.GAP) -> tuple[int, list[str], list[str]]:
    """(left block's width, left lines, right lines) of two blocks side by side, the right one starting
    where the second model's name does on the first line."""
    left_width = lines[0].index(REVERSE) - gap  # the names are ASCII: characters are columns
    assert all(columns(line, left_width, left_width + gap).strip() == "" for line in lines), "the gap holds text"
    left = [columns(line, 0, left_width).rstrip() for line in lines]
    right = [columns(line, left_width + gap) for line in lines]
    return left_width, left, right


def translate_grid(capsys, monkeypatch, address: str, model: str) -> list[str]:
    """The heatmap's header and rows as `attnserve translate --attention` draws them for `model`."""
    argv = ["translate", TEXT, "--attention", "--model", model, "--address", address]
    _, lines, _ = run(capsys, monkeypatch, WIDE, *argv)
    start = lines.index("") + 1  # after the translation
    return [line.rstrip() for line in lines[start : lines.index("", start)]]


def contains(lines: list[str], part: list[str]) -> bool:
    return any(lines[i : i + len(part)] == part for i in range(len(lines) - len(part) + 1))


# ---- side by side -----------------------------------------------------------------------------------


def test_side_by_side_shows_each_model_in_its_own_aligned_block(capsys, monkeypatch, address):
    status, lines, err = run(capsys, monkeypatch, WIDE, "compare", TEXT, "--address", address)
    assert (status, err) == (0, "")
    left_width, left, right = split_blocks(lines)
    assert left[:2] == [COPY, TEXT] and right[:2] == [REVERSE, TEXT[::-1]]  # name, translation
    # Each block holds its model's heatmap exactly as `translate --attention` draws it, CJK labels and all,
    # and its caption names the attention it shows.
    assert contains(left, translate_grid(capsys, monkeypatch, address, COPY))
    assert contains(right, translate_grid(capsys, monkeypatch, address, REVERSE))
    assert left[-1] == FakeCopyEngine.REDUCTION and right[-1] == "layer 1 of 2, fake"
    # The left block is as wide as its widest line, and no wider.
    assert max(display_width(line) for line in left) == left_width
    # Both heatmaps start on the same line: captions are padded to one height.
    assert left.index("") == right.index("") == 2


def test_blocks_go_side_by_side_exactly_when_they_fit(capsys, monkeypatch, address):
    _, lines, _ = run(capsys, monkeypatch, WIDE, "compare", TEXT, "--address", address)
    needed = max(display_width(line) for line in lines)
    _, fits, _ = run(capsys, monkeypatch, needed, "compare", TEXT, "--address", address)
    _, stacked, _ = run(capsys, monkeypatch, needed - 1, "compare", TEXT, "--address", address)
    assert fits == lines
    assert stacked != lines and not any(COPY in line and REVERSE in line for line in stacked)


def test_side_by_side_keeps_alignment_with_colour_and_long_translations():
    request = translation_request(TEXT, to="en", attention=True)
    engines = [FakeCopyEngine(COPY), FakeEngine(REVERSE)]
    try:
        outcomes = [comparison.Outcome(e.info.name, result=e.generate(request)) for e in engines]
    finally:
        for engine in engines:
            engine.close()
    long_text = "知識就是力量，" * 6 + " and knowledge is power"  # wider than its block: wrapped inside it
    outcomes[0] = dataclasses.replace(outcomes[0], result=dataclasses.replace(outcomes[0].result, text=long_text))
    lines = comparison.render(outcomes, width=WIDE, color=True)
    assert any("\x1b[48;5;" in line for line in lines)
    left_width, left, right = split_blocks([ANSI.sub("", line) for line in lines])
    assert left_width == display_width(FakeCopyEngine.REDUCTION)  # the block's widest line
    wrapped = left[1 : left.index("")]
    # 19 CJK characters are 38 columns, a 20th would not fit in 39; English breaks at a space.
    assert wrapped == [
        "知識就是力量，知識就是力量，知識就是力",
        "量，知識就是力量，知識就是力量，知識就",
        "是力量， and knowledge is power",
    ]
    assert right[1] == TEXT[::-1] and right[2 : len(wrapped) + 2] == [""] * len(wrapped)


# ---- stacked ----------------------------------------------------------------------------------------


def test_a_narrow_terminal_stacks_the_blocks(capsys, monkeypatch, address):
    status, lines, _ = run(capsys, monkeypatch, 40, "compare", TEXT, "--address", address)
    assert status == 0
    second = lines.index(REVERSE)
    first, last = lines[:second], lines[second:]
    assert first[:2] == [COPY, TEXT] and first[-1] == "" and first[-2] == FakeCopyEngine.REDUCTION
    assert last[:2] == [REVERSE, TEXT[::-1]] and last[-1] == "layer 1 of 2, fake"
    # Each block is what `translate --attention` draws: its heatmap and the one-line legend.
    for block, model in ((first, COPY), (last, REVERSE)):
        assert contains([line.rstrip() for line in block], translate_grid(capsys, monkeypatch, address, model))
        assert sum(line.startswith("scale: ") for line in block) == 1 and "(max 1.00)" in "\n".join(block)
    assert max(display_width(line) for line in lines) <= 50  # the legend, as `translate` writes it


# ---- JSON -------------------------------------------------------------------------------------------


def test_json_holds_every_models_whole_result_keyed_by_model(capsys, monkeypatch, address):
    status, lines, _ = run(capsys, monkeypatch, WIDE, "compare", TEXT, "--json", "--pieces", "--address", address)
    results = json.loads("\n".join(lines))
    assert status == 0 and list(results) == [COPY, REVERSE]
    for model, result in results.items():  # what `translate --json` prints, but for the timings
        argv = ["translate", TEXT, "--attention", "--pieces", "--json", "--model", model, "--address", address]
        _, single, _ = run(capsys, monkeypatch, WIDE, *argv)
        expected = json.loads("\n".join(single))
        assert result.pop("timings").keys() == expected.pop("timings").keys()
        assert result == expected
    assert results[COPY]["text"] == TEXT and results[REVERSE]["text"] == TEXT[::-1]
    assert results[COPY]["attention"]["reduction"] == FakeCopyEngine.REDUCTION


def test_compare_asks_each_model_for_attention_into_the_other_language(address, capsys, monkeypatch, two_models):
    _, engines = two_models
    run(capsys, monkeypatch, WIDE, "compare", "Open the file", "--pieces", "--address", address)
    for name in (COPY, REVERSE):
        request = engines[name].requests[-1]
        assert request.target_language == "zh-TW" and request.attention.enabled
        assert request.attention.granularity == generation.AttentionGranularity.PIECES
    assert not engines["fake-caption"].requests  # not a translation model: left out by default


# ---- failures ---------------------------------------------------------------------------------------


def test_a_failing_model_shows_its_error_in_its_block_and_the_others_still_show(capsys, monkeypatch, address,
                                                                                two_models):
    _, engines = two_models
    engines[REVERSE].fail = generation.UnavailableError(f"model '{REVERSE}' is shutting down")
    status, lines, _ = run(capsys, monkeypatch, WIDE, "compare", TEXT, "--address", address)
    assert status == 1
    _, left, right = split_blocks(lines)
    assert contains(left, translate_grid(capsys, monkeypatch, address, COPY))
    assert right[:3] == [REVERSE, f"error: UNAVAILABLE: model '{REVERSE}' is shutting down", ""]
    assert set(right[3:]) == {""}  # the shorter block ends in blank lines


def test_an_unknown_model_fails_alone_in_json_too(capsys, monkeypatch, address):
    argv = ["compare", TEXT, "--models", f"{COPY},nope", "--json", "--address", address]
    status, lines, _ = run(capsys, monkeypatch, WIDE, *argv)
    results = json.loads("\n".join(lines))
    assert status == 1 and list(results) == [COPY, "nope"]
    assert results[COPY]["text"] == TEXT
    message = f"unknown model 'nope'; available: fake-caption, {COPY}, {REVERSE}"
    assert results["nope"] == {"error": {"code": "NOT_FOUND", "message": message}}


def test_stacked_error_block(capsys, monkeypatch, address):
    argv = ["compare", TEXT, "--models", f"nope,{REVERSE}", "--address", address]
    status, lines, _ = run(capsys, monkeypatch, 40, *argv)
    assert status == 1
    assert lines[0] == "nope" and lines[1].startswith("error: NOT_FOUND: unknown model")
    # The second block's title, not the model name the wrapped error lists alone on a line.
    title = len(lines) - 1 - lines[::-1].index(REVERSE)
    assert lines[title - 1] == "" and lines[title - 2] != ""  # one blank between
    assert all(display_width(line) <= 50 for line in lines)


def test_fewer_than_two_served_translation_models_is_a_clear_error(fake_server):
    background, _ = fake_server
    message = f"^error: compare needs two or more translation models; {background.address} serves only fake-translate$"
    with pytest.raises(SystemExit, match=message):
        cli.main(["compare", TEXT, "--address", background.address])


@pytest.mark.parametrize(
    "models,message",
    [
        (REVERSE, f"compare needs two or more models; --models names {REVERSE}$"),
        (" , ", "compare needs two or more models; --models names none$"),
        (f"{REVERSE},{COPY},{REVERSE}", f"--models names {REVERSE} more than once"),
    ],
)
def test_models_must_name_two_different_models(address, models, message):
    with pytest.raises(SystemExit, match=f"^error: {message}"):
        cli.main(["compare", TEXT, "--models", models, "--address", address])


def test_an_unreachable_server_is_an_error(capsys, monkeypatch):
    status, lines, err = run(capsys, monkeypatch, WIDE, "compare", TEXT, "--address", "127.0.0.1:1")
    assert (status, lines) == (1, []) and err.startswith("error: UNAVAILABLE: ")


# ---- the heatmap helpers compare uses -----------------------------------------------------------------


def test_render_lines_are_render_split_and_the_narrow_legend_holds_the_same_swatches():
    matrix = generation.AttentionMatrix([[0.2, 0.8], [0.6, 0.4]], ["我", "愛"], ["▁I", "</s>"], 0, "layer 0")
    lines = heatmap.render_lines(matrix, color=False, width=80)
    assert "\n".join(lines) == heatmap.render(matrix, color=False, width=80)
    narrow = heatmap.render_lines(matrix, color=False, width=80, narrow_legend=True)
    assert narrow[: len(lines) - 2] == lines[:-2] and narrow[-1] == lines[-1]
    assert narrow[-3:-1] == ["scale: ░░ 0.20 ▒▒ 0.40", "       ▓▓ 0.60 ██ 0.80"]
    assert lines[-2] == "scale: ░░ 0.20 ▒▒ 0.40 ▓▓ 0.60 ██ 0.80  (max 0.80)"


def test_side_by_side_pads_by_terminal_columns():
    colour = "\x1b[48;5;255m  \x1b[0m"  # a heatmap cell: two columns wide, however long its escapes
    blocks = [["我愛", "x"], [colour, "", "你們好"], ["z"]]  # 4, 6 and 1 columns wide
    assert heatmap.side_by_side(blocks, gap=2) == ["我愛  " + colour + " " * 6 + "z", "x", " " * 6 + "你們好"]
    assert heatmap.side_by_side([]) == []
