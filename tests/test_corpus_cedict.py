"""Corpus pairs from CC-CEDICT and Tatoeba: which dictionary senses become pairs, on hand-written
lines in CC-CEDICT's format; Tatoeba's one-translation-per-sentence rule on hand-made rows."""

from __future__ import annotations

from attnserve.export.translation.corpus import cedict, split, tatoeba
from attnserve.export.translation.corpus.cedict import clean_gloss

# CC-CEDICT lines (2023-11-07 release), some trimmed (聯合國 to its acronym); 知識就是力量 is made up.
CEDICT_LINES = """\
# CC-CEDICT
#! date=2023-11-07T06:42:16Z
傳統 传统 [chuan2 tong3] /tradition/traditional/convention/conventional/CL:個|个[ge4]/
王 王 [Wang2] /surname Wang/
王 王 [wang2] /king or monarch/best or strongest of its type/grand/great/
張 张 [Zhang1] /surname Zhang/
張 张 [zhang1] /to open up/to spread/sheet of paper/classifier for flat objects, sheet/
了 了 [le5] /(completed action marker)/(modal particle indicating change of state, situation now)/
牀 床 [chuang2] /variant of 床[chuang2]/
畫蛇添足 画蛇添足 [hua4 she2 tian1 zu2] /lit. draw legs on a snake (idiom); fig. to overdo it/
一石二鳥 一石二鸟 [yi1 shi2 er4 niao3] /to kill two birds with one stone (idiom)/
深度學習 深度学习 [shen1 du4 xue2 xi2] /deep learning (artificial intelligence)/
北京 北京 [Bei3 jing1] /Beijing, capital of the People's Republic of China/
聯合國 联合国 [Lian2 he2 guo2] /UN/
對不起 对不起 [dui4 bu5 qi3] /I'm sorry; excuse me; I beg your pardon/to let (sb) down/
打 打 [da2] /dozen (loanword)/
打 打 [da3] /to beat/to strike/to hit/
知識就是力量 知识就是力量 [zhi1 shi5 jiu4 shi4 li4 liang5] /knowledge is power/
T恤 T恤 [T xu4] /T-shirt/
""".splitlines()


def pairs_by_headword() -> dict[str, list[tuple[str, str]]]:
    found: dict[str, list[tuple[str, str]]] = {}
    for pair in cedict.pairs_from_lines(CEDICT_LINES):
        found.setdefault(pair.zh, []).append((pair.en, pair.source))
    return found


def test_traditional_headword_with_its_first_glosses():
    pairs = pairs_by_headword()
    assert "传统" not in pairs
    # Two senses at most, and never both sides of the held-out line.
    assert [en for en, _ in pairs["傳統"]] in (["tradition", "traditional"], ["tradition"])
    assert len({split.split_of(en) for en, _ in pairs["傳統"]}) == 1
    assert pairs["深度學習"] == [("deep learning", "cedict/phrase")]


def test_surnames_variants_and_classifiers_are_dropped():
    pairs = pairs_by_headword()
    assert all(not en.startswith(("surname", "CL:", "variant")) for found in pairs.values() for en, _ in found)
    assert pairs["王"] == [("king or monarch", "cedict/char")]  # the surname reading Wang2 gives nothing
    assert "張" not in pairs  # a single character with a classifier sense is a grammar word
    assert "了" not in pairs  # only remarks in parentheses
    assert "牀" not in pairs  # a variant
    assert "聯合國" not in pairs  # an acronym only
    assert "T恤" not in pairs  # not all hanzi


def test_idioms_and_sayings_are_kept():
    pairs = pairs_by_headword()
    assert pairs["一石二鳥"] == [("to kill two birds with one stone", "cedict/idiom")]
    assert pairs["畫蛇添足"][0] == ("to overdo it", "cedict/idiom")  # the meaning before the literal image
    assert pairs["知識就是力量"] == [("knowledge is power", "cedict/phrase")]
    assert pairs["對不起"][0] == ("I'm sorry", "cedict/word")


def test_names_and_main_readings():
    pairs = pairs_by_headword()
    assert pairs["北京"] == [("Beijing", "cedict/name")]
    assert pairs["打"] == [("to beat", "cedict/char")]  # da3, the reading with most senses


def test_clean_gloss():
    assert clean_gloss("lit. draw legs on a snake (idiom)") == "draw legs on a snake"
    assert clean_gloss("to let (sb) down") == "to let down"
    assert clean_gloss("to hold sb responsible for sth") == "to hold somebody responsible for something"
    assert clean_gloss("see 瞭|了[liao3]") == ""
    assert clean_gloss("old variant of 床[chuang2]") == ""
    assert clean_gloss("married couple (as in 夫婦|夫妇)") == "married couple"
    assert clean_gloss("(old) gentleman") == ""
    assert clean_gloss("(bound form) bull's-eye") == "bull's-eye"


def test_tatoeba_keeps_one_translation_per_chinese_sentence():
    rows = [
        ["1", "我们试试看！", "1276", "Let's try something."],
        ["1", "我们试试看！", "413788", "Let's do it."],
        ["2", "我們試試看！", "965653", "Let's have a look."],
        ["3", "我很好。", "2", "I'm fine."],
    ]
    to_traditional = {"我们试试看！": "我們試試看！"}
    pairs = list(tatoeba.pairs_from_rows(rows, lambda zh: to_traditional.get(zh, zh)))
    expected = [("Let's try something.", "我們試試看！"), ("I'm fine.", "我很好。")]
    assert [(p.en, p.zh) for p in pairs] == expected
    assert {p.source for p in pairs} == {"tatoeba"}
