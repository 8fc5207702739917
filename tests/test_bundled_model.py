"""The trained models shipped in models/ (the Transformer and the recurrent translator): they load,
translate in the asked direction, and their attention points where a reader expects (the demo's whole point)."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engines
from attnserve.api.generation import (
    GREEDY,
    AttentionGranularity,
    AttentionOptions,
    DecodingOptions,
    GenerationRequest,
)
from attnserve.server.model.runtime import RuntimeOptions

pytestmark = pytest.mark.bundled

# ATTNSERVE_BUNDLED_MODELS lets a candidate export be checked before it replaces the shipped one.
REPOSITORY = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", pathlib.Path(__file__).parents[1] / "models"))
MODEL = "translate-zh-en"
RECURRENT_MODEL = "translate-zh-en-rnn"
WORDS = AttentionOptions(enabled=True, granularity=AttentionGranularity.WORDS)


@pytest.fixture(scope="module")
def registry():
    if not (REPOSITORY / MODEL).is_dir():
        pytest.skip(f"no bundled model at {REPOSITORY / MODEL} (export one: see docs/training.md)")
    registry = load_engines(REPOSITORY, RuntimeOptions(), BatchingOptions())
    yield registry
    registry.close()


@pytest.fixture(scope="module")
def transformer(registry):
    return registry.get(MODEL)


@pytest.fixture(scope="module", params=[MODEL, RECURRENT_MODEL])
def engine(request, registry):
    """Each bundled translator in turn: what holds for one holds for both."""
    if request.param not in registry:
        pytest.skip(f"no bundled model {request.param} in {REPOSITORY}")
    return registry.get(request.param)


def translate(engine, text: str, to: str, **options):
    return engine.generate(GenerationRequest(engine.manifest.name, text, to, **options), timeout=60)


def has_cjk(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def test_the_transformer_describes_itself(transformer):
    info = transformer.info
    assert info.task == "translation"
    assert info.source_languages == ["en", "zh-TW"] and info.target_languages == ["en", "zh-TW"]
    assert info.max_source_tokens == 256 and info.attention_layers == 3 and info.attention_heads == 4


@pytest.mark.parametrize("text", ["開啟檔案", "儲存目前的文件", "找不到檔案", "刪除選取的物件"])
def test_chinese_is_translated_into_english(engine, text):
    result = translate(engine, text, "en")
    assert result.text and not has_cjk(result.text), result.text
    assert any(ch.isalpha() for ch in result.text)


@pytest.mark.parametrize("text", ["Open the file", "Save the current document", "File not found", "Delete"])
def test_english_is_translated_into_chinese(engine, text):
    result = translate(engine, text, "zh-TW")
    assert has_cjk(result.text), result.text


@pytest.mark.parametrize(
    "text,to,output_word,source_words",
    [
        ("開啟檔案", "en", "file", {"檔", "案"}),
        ("開啟檔案", "en", "Open", {"開", "啟"}),
        ("Open the file", "zh-TW", "檔", {"file"}),
        ("Save the current document", "zh-TW", "儲", {"Save"}),
        ("Save the current document", "zh-TW", "文", {"document"}),
    ],
)
def test_attention_points_at_the_source_word(engine, text, to, output_word, source_words):
    """Which source words produced "file"? The attention row of the output word answers it."""
    result = translate(engine, text, to, attention=WORDS)
    matrix = result.attention
    labels = [label.strip(".,:;!?").lower() for label in matrix.row_labels]
    assert output_word.lower() in labels, f"{result.text!r} lacks {output_word!r}"
    row = np.array(matrix.weights[labels.index(output_word.lower())])
    assert matrix.col_labels[int(row.argmax())] in source_words, dict(zip(matrix.col_labels, row.round(2)))
    np.testing.assert_allclose(np.sum(matrix.weights, axis=1), 1.0, atol=1e-4)


def test_the_lectures_bank_is_a_bank(engine):
    """The lecture's example: a bank one deposits money in is 銀行, not a river bank (河岸)."""
    result = translate(engine, "I went to the bank to deposit some money.", "zh-TW")
    assert "銀行" in result.text and "河岸" not in result.text, result.text


def test_batched_equals_alone(engine):
    texts = ["開啟檔案", "Save the current document", "一年有四季。", "File not found", "刪除選取的物件",
             "Show hidden files", "找不到檔案", "The weather is nice today."]
    targets = ["en" if has_cjk(t) else "zh-TW" for t in texts]
    alone = [translate(engine, t, to) for t, to in zip(texts, targets)]
    futures = [engine.submit(GenerationRequest(engine.manifest.name, t, to)) for t, to in zip(texts, targets)]
    together = [f.result(timeout=60) for f in futures]
    assert max(r.timings.batch_size for r in together) > 1
    assert [r.text for r in together] == [r.text for r in alone]


def test_beam_search_scores_at_least_as_well_as_greedy(engine):
    text = "儲存目前的文件"
    greedy = translate(engine, text, "en", decoding=GREEDY)
    beam = translate(engine, text, "en", decoding=DecodingOptions(beam_size=4))
    length_normalized = lambda r: sum(t.logprob for t in r.tokens) / max(len(r.tokens), 1)  # noqa: E731
    assert length_normalized(beam) >= length_normalized(greedy) - 1e-6


def test_unset_layer_is_the_transformers_best_aligned_layer(transformer):
    """The manifest names layer 1 (the middle layer aligns words best); a request without a layer gets it."""
    default = translate(transformer, "Open the file", "zh-TW", attention=WORDS).attention
    explicit = translate(
        transformer, "Open the file", "zh-TW", attention=AttentionOptions(True, 1, AttentionGranularity.WORDS)
    ).attention
    assert default.layer == 1 and default == explicit
