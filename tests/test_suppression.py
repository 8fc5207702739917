"""Tokens the manifest lists under `special_tokens.suppress` are never generated."""

from __future__ import annotations

import pytest

from attnserve.export.translation import bpe
from attnserve.export.translation.onnx_export import export_model
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engines
from attnserve.api.generation import GenerationRequest
from attnserve.server.model.runtime import RuntimeOptions

TEXTS = ["知識就是力量。", "Open the File menu, then choose Save.", "這個按鈕會關閉視窗", "Knowledge is power."]


def emitted_ids(repository, name: str) -> set[int]:
    registry = load_engines(repository, RuntimeOptions(), BatchingOptions())
    try:
        engine = registry.get(name)
        results = [engine.generate(GenerationRequest(name, t, lang)) for t in TEXTS for lang in ("en", "zh-TW")]
    finally:
        registry.close()
    return {token.id for result in results for token in result.tokens}


@pytest.fixture(scope="module")
def suppressed_repo(tmp_path_factory, tiny_torch_model, tiny_tokenizer):
    repo = tmp_path_factory.mktemp("suppressed")
    export_model(tiny_torch_model, tiny_tokenizer, repo / "tiny" / "1", "tiny", 1, max_source_tokens=48, max_new_tokens=12)
    return repo


def test_export_lists_padding_and_language_tokens(tiny_tokenizer):
    assert set(bpe.suppressed_ids(tiny_tokenizer)) == {0, 3, *bpe.language_token_ids(tiny_tokenizer).values()}


def test_the_random_model_emits_language_tags_unless_suppressed(tiny_model_repo, suppressed_repo, tiny_tokenizer):
    tags = set(bpe.language_token_ids(tiny_tokenizer).values())
    assert emitted_ids(tiny_model_repo, "tiny-translate") & tags, "the test model no longer emits tags"
    assert not emitted_ids(suppressed_repo, "tiny") & set(bpe.suppressed_ids(tiny_tokenizer))
