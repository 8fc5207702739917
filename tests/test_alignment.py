"""Attention alignment scoring: the CC-CEDICT reader, the dictionary gold set and the scoring, on hand-made
sentences and a tiny dictionary; then a whole run on the tiny random-weight model."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TINY_MODEL_NAME, TINY_RECURRENT_NAME

from attnserve.export.translation import alignment
from attnserve.export.translation.alignment import GoldItem, Tally, gold_items, links, spans
from attnserve.export.translation.dictionary import Dictionary, gloss_words, parse_line, read_entries

# Real CC-CEDICT lines (2023-11-07 release), a few trimmed.
CEDICT_LINES = """\
# CC-CEDICT
#! date=2023-11-07T06:42:16Z
銀行 银行 [yin2 hang2] /bank/CL:家[jia1],個|个[ge4]/
我 我 [wo3] /I; me; my/
去 去 [qu4] /to go/to go to (a place)/
了 了 [liao3] /to finish/to achieve/variant of 瞭|了[liao3]/to understand clearly/
檔案 档案 [dang4 an4] /file/record/archive/
檔 档 [dang4] /official records/file/records/
開啟 开启 [kai1 qi3] /to open/to start/(computing) to enable/
開 开 [kai1] /to open (transitive or intransitive)/
鎖定 锁定 [suo3 ding4] /to lock (a door)/to lock a computer file (to prevent it being overwritten)/
T恤 T恤 [T xu4] /T-shirt/
""".splitlines()

EN = ["I", "went", "to", "the", "bank"]  # source or output words; "</s>" is not a word here
ZH = ["我", "去", "了", "銀", "行"]  # every CJK character is a word


@pytest.fixture(scope="module")
def tiny_dictionary():
    return Dictionary.from_lines(CEDICT_LINES)


# ---- dictionary -----------------------------------------------------------------------------------------


def test_a_cedict_line_gives_headwords_pinyin_and_senses():
    entry = parse_line("銀行 银行 [yin2 hang2] /bank/CL:家[jia1],個|个[ge4]/\r\n")
    assert (entry.traditional, entry.simplified, entry.pinyin) == ("銀行", "银行", "yin2 hang2")
    assert entry.glosses == ("bank", "CL:家[jia1],個|个[ge4]")
    assert parse_line("我 我 [wo3] /I; me; my/").glosses == ("I", "me", "my")  # ";" separates senses too
    assert parse_line("#! date=2023-11-07T06:42:16Z") is None and parse_line("\n") is None
    with pytest.raises(ValueError, match="line 2: not a CC-CEDICT line: '銀行 bank'"):
        list(read_entries(["# header", "銀行 bank"]))


def test_gloss_words_drop_remarks_references_and_stop_words():
    assert gloss_words("to open (transitive or intransitive)") == ["open"]
    assert gloss_words("(computing) to enable") == ["enable"]
    assert gloss_words("to lock a computer file (to prevent it being overwritten)") == ["lock", "computer", "file"]
    assert gloss_words("CL:家[jia1],個|个[ge4]") == [] and gloss_words("variant of 瞭|了[liao3]") == []
    assert gloss_words("the sb's image's (of a (large) thing)") == ["image"]


def test_the_indexes_hold_only_clear_one_word_translations(tiny_dictionary):
    d = tiny_dictionary
    assert d.date == "2023-11-07T06:42:16Z"
    assert d.english("銀行") == {"bank"} and d.english("檔案") == {"file", "record", "archive"}
    assert d.english("鎖定") == {"lock"}  # "to lock a computer file" is no translation of "file"
    assert d.english("我") == set() and d.english("T恤") == set()  # stop words only; not all ideographs
    assert d.headwords("file") == {"檔案", "檔"} and d.headwords("open") == {"開啟", "開"}
    assert d.headwords("files") == {"檔案", "檔"}  # plural looked up as its singular
    assert d.headwords("records") == {"檔", "檔案"}  # 檔 "records" and 檔案 "record"
    assert d.headwords("xylophone") == set()


def test_the_installed_cc_cedict_loads():
    from attnserve.export.translation import dictionary

    d = dictionary.load()
    assert len(d) > 50_000 and d.date.startswith("20")
    assert "bank" in d.english("銀行") and "file" in d.english("檔案")
    assert {"銀行", "檔案"} <= d.headwords("bank") | d.headwords("file")


# ---- gold set -------------------------------------------------------------------------------------------


def test_spans_merge_overlapping_occurrences_only():
    assert spans("開啟檔案", frozenset({"開", "開啟"})) == [(0, 2)]
    assert spans("檔案檔案", frozenset({"檔案"})) == [(0, 2), (2, 4)]  # adjacent: two places
    assert spans("開啟檔案", frozenset()) == []


def test_a_chinese_output_word_is_linked_to_its_english_source_word(tiny_dictionary):
    # en -> zh-TW: "I went to the bank" / 我去了銀行. 銀行 is two output words; its first row is the item.
    assert gold_items(EN, ZH, True, tiny_dictionary) == [GoldItem(3, frozenset({4}))]


def test_an_english_output_word_is_linked_to_every_character_of_its_source_headword(tiny_dictionary):
    # zh-TW -> en: "bank" should attend to 銀 or 行.
    assert gold_items(ZH, EN, False, tiny_dictionary) == [GoldItem(4, frozenset({3, 4}))]


def test_ambiguous_words_are_dropped(tiny_dictionary):
    d = tiny_dictionary
    open_file = ["開", "啟", "檔", "案"]
    assert [(k.english, k.chinese) for k in links(["Open", "the", "file."], open_file, d)] == [(0, (0, 1)), (2, (2, 3))]
    # the counterpart occurs twice in the Chinese sentence
    assert links(["file"], ["檔", "案", "和", "檔", "案"], d) == []
    # the English word occurs twice: which one does 檔案 translate?
    assert links(["file", "file"], ["檔", "案"], d) == []
    # two English words claim the same characters (檔案 is "file" and "record")
    assert links(["record", "file"], ["檔", "案"], d) == []
    # a headword never spans a word that is not one ideograph, nor is a stop word linked
    assert links(["file", "I"], ["檔", "x", "案", "我"], d) == [alignment.Link(0, (0,))]


# ---- scoring --------------------------------------------------------------------------------------------


def attention(peaks: list[int], columns: int, eos_weight: float = 0.0) -> np.ndarray:
    """(len(peaks), columns + 1) rows peaking at the given source word, with `eos_weight` on `</s>`."""
    w = np.full((len(peaks), columns + 1), 0.01)
    w[np.arange(len(peaks)), peaks] = 0.5
    w[:, -1] = eos_weight
    return w / w.sum(1, keepdims=True)


def test_the_argmax_source_word_counts_and_the_eos_column_does_not(tiny_dictionary):
    items = gold_items(EN, ZH, True, tiny_dictionary)  # 銀 (row 3) -> "bank" (column 4)
    diagonal = attention([0, 1, 2, 3, 4], 5)
    assert alignment.attention_hits(diagonal, items) == [False]  # 銀 looked at "the"
    looked_at_bank = attention([0, 1, 2, 4, 4], 5, eos_weight=0.9)  # </s> is the largest weight of every row
    assert looked_at_bank[3].argmax() == 5 and alignment.attention_hits(looked_at_bank, items) == [True]


def test_tally_counts_layers_and_baselines(tiny_dictionary):
    items = gold_items(ZH, EN, False, tiny_dictionary)  # "bank" (row 4) -> 銀 or 行 (columns 3, 4)
    tally = Tally(layers=2)
    tally.add(items, [attention([0, 1, 2, 3, 3], 5).tolist(), attention([0, 1, 2, 3, 0], 5).tolist()])
    tally.add([], [attention([0], 5), attention([0], 5)])  # a sentence without gold items
    report = tally.report()
    assert report["sentences"] == 2 and report["gold_items"] == 1
    assert [layer["hits"] for layer in report["layers"]] == [1, 0]
    assert alignment.diagonal_column(4, 5, 5) == 4 and report["diagonal"] == {"hits": 1, "accuracy": 1.0}
    assert report["chance"] == pytest.approx(2 / 5, abs=1e-4)
    assert Tally(layers=1).report()["layers"] == [{"layer": 0, "hits": 0, "accuracy": None}]


# ---- a whole run through the serving engine -------------------------------------------------------------


@pytest.mark.parametrize(
    "fixture,name,layers,heads",
    [("tiny_model_dir", TINY_MODEL_NAME, 2, 4), ("tiny_recurrent_dir", TINY_RECURRENT_NAME, 1, 1)],
)
def test_a_model_is_scored_per_layer_and_direction_from_its_manifest(request, tmp_path, fixture, name, layers, heads):
    """Transformer or LSTM: the layers come from the manifest, the decoding from the serving engine."""
    repository = request.getfixturevalue(fixture).parents[1]
    split = tmp_path / "test.tsv"
    split.write_text("Open the file\t開啟檔案\nThe bank\t銀行\nThis button closes the window\t這個按鈕會關閉視窗\n")
    split.with_suffix(".source").write_text("gettext/git\nhsk/level1\ngettext/gimp-data\n")
    report = alignment.evaluate(repository, [name], split, limit=2, max_new_tokens=8)
    model = report["models"][name]
    assert report["pairs"] == 2 and (model["attention_layers"], model["attention_heads"]) == (layers, heads)
    assert list(model["directions"]) == ["en->zh-TW", "zh-TW->en"]
    for scores in model["directions"].values():
        assert scores["sentences"] + scores["skipped"] == 2 and len(scores["layers"]) == layers
        assert set(scores["by_family"]) == {"gettext", "hsk"}
    table = alignment.format_table(report).splitlines()
    assert table[0].split() == ["model", "direction", "gold", "items"] + [
        w for i in range(layers) for w in ("layer", str(i))
    ] + ["diagonal", "chance"]
    assert len(table) == 3 and table[1].split()[:2] == [name, "en->zh-TW"]
    with pytest.raises(ValueError, match="no model nope in"):
        alignment.evaluate(repository, ["nope"], split)
