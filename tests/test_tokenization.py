"""The tokenizer wrapper: EOS on sources, detokenization, and the `metaspace-cjk` word grouping."""

from __future__ import annotations

import threading
import time

import pytest

from attnserve.server.model.manifest import load_manifest
from attnserve.server.model.tokenization import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return Tokenizer.from_manifest(tiny_model_dir, load_manifest(tiny_model_dir / "manifest.json"))


def words_of(tokenizer, text):
    ids = tokenizer.encode(text)
    return tokenizer.words(ids), tokenizer.pieces(ids)


def test_encode_appends_eos_and_decode_round_trips(tokenizer):
    for text in ["Open the File menu, then choose Save.", "知識就是力量。", "用 Python 寫程式很有趣"]:
        ids = tokenizer.encode(text)
        assert ids[-1] == tokenizer.eos and tokenizer.eos not in ids[:-1]
        assert tokenizer.decode(ids) == text  # EOS is special: dropped by decode
    assert tokenizer.pieces(tokenizer.encode("Save"))[-1] == "</s>"


def test_english_pieces_merge_into_words(tokenizer):
    words, pieces = words_of(tokenizer, "Open the File menu, then choose Save.")
    assert len(pieces) > len(words.labels), "the test needs words made of several pieces"
    assert words.labels == ("Open", "the", "File", "menu,", "then", "choose", "Save.", "</s>")
    assert words.starts[0] == 0 and list(words.starts) == sorted(set(words.starts))


def test_each_cjk_character_is_a_word(tokenizer):
    words, pieces = words_of(tokenizer, "知識就是力量。")
    assert words.labels == ("知", "識", "就", "是", "力", "量", "。", "</s>")
    assert pieces[0] == "▁知"


def test_a_lone_metaspace_joins_the_next_word(tokenizer):
    words, pieces = words_of(tokenizer, "用 Python 寫程式很有趣")
    assert "▁" in pieces, "the tokenizer no longer splits off a lone ▁ here; pick another example"
    assert words.labels == ("用", "Python", "寫", "程", "式", "很", "有", "趣", "</s>")


def test_special_tokens_are_words_of_their_own(tokenizer):
    lang = tokenizer.encode("Save")[:-1]
    ids = [4, *lang, 4, 2]  # <2en> Save <2en> </s>
    words = tokenizer.words(ids)
    assert words.labels == ("<2en>", "Save", "<2en>", "</s>")
    assert tokenizer.words([]).starts == ()


def test_encoding_a_long_text_lets_other_threads_run(tokenizer):
    # The server tokenizes on a submitting thread; holding the GIL meanwhile would stall its event loop.
    text = "知識 power " * 30_000  # a few hundred milliseconds of tokenizing
    done = threading.Event()
    worker = threading.Thread(target=lambda: (tokenizer.encode(text), done.set()))
    ticks = 0
    worker.start()
    while not done.is_set():
        time.sleep(0.001)  # runs only when the tokenizing thread lets go of the GIL
        ticks += 1
    worker.join()
    assert ticks >= 5, f"the main thread ran {ticks} times while a long text was tokenized"
