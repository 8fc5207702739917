"""Manifest variants: an int8 copy of a model's graphs (export/common/quantize.py), served with --variant."""

from __future__ import annotations

import json
import shutil

import pytest

from attnserve.clients.client import Client
from attnserve.export.common.quantize import quantize_folder
from attnserve.server.edge import app
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import GenerationRequest
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions

MODEL = "tiny-translate"
WAIT = 60  # seconds; only a bound against hanging


@pytest.fixture(scope="module")
def quantized_repo(tiny_model_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("quantized")
    shutil.copytree(tiny_model_repo / MODEL, repo / MODEL)
    version = next((repo / MODEL).iterdir())
    sizes = quantize_folder(version)
    assert set(sizes) == {"encoder.int8.onnx", "decoder.int8.onnx"}
    return repo


def test_the_manifest_names_the_int8_graphs_and_the_embedding_lookup_still_works(quantized_repo):
    model = find_models(quantized_repo)[MODEL]
    assert model.manifest.variants["int8"].decoder_file == "decoder.int8.onnx"
    engine = load_engine(model, RuntimeOptions(variant="int8"))
    try:
        assert engine.info.variant == "int8"
        assert engine.runtime.decoder_signature.path.name == "decoder.int8.onnx"
        result = engine.generate(GenerationRequest(MODEL, "Save the file", "zh-TW"), WAIT)
        assert result.tokens and result.finish_reason.value in ("eos", "length")
    finally:
        engine.close()


def test_a_model_without_the_variant_serves_its_default_graphs(tiny_model_repo):
    engine = load_engine(find_models(tiny_model_repo)[MODEL], RuntimeOptions(variant="int8"))
    try:
        assert engine.info.variant == "" and engine.runtime.decoder_signature.path.name == "decoder.onnx"
    finally:
        engine.close()


def test_a_variant_file_that_is_missing_is_named(quantized_repo, tmp_path):
    broken = tmp_path / "repo"
    shutil.copytree(quantized_repo, broken)
    version = next((broken / MODEL).iterdir())
    (version / "decoder.int8.onnx").unlink()
    with pytest.raises(ValueError, match=r"decoder.int8.onnx: file named by .* field 'variants.int8.decoder'"):
        find_models(broken)


def test_serve_variant_flag_reaches_get_model(quantized_repo):
    engines = app.load_engines(app.ServeOptions(models=str(quantized_repo), variant="int8"))
    try:
        with app.BackgroundServer(engines) as background, Client(background.address) as client:
            assert client.get_model(MODEL).variant == "int8"
            assert client.translate("Save", to="zh-TW", model=MODEL).text is not None
    finally:
        for engine in engines.values():
            engine.close()


def test_manifest_variants_must_name_both_graphs(quantized_repo, tmp_path):
    broken = tmp_path / "repo"
    shutil.copytree(quantized_repo, broken)
    path = next((broken / MODEL).iterdir()) / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["variants"]["int8"]["decoder"]
    path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="variants.int8"):
        find_models(broken)


@pytest.fixture(scope="module")
def half_repo(tiny_model_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("half")
    shutil.copytree(tiny_model_repo / MODEL, repo / MODEL)
    version = next((repo / MODEL).iterdir())
    assert set(quantize_folder(version, "fp16")) == {"encoder.fp16.onnx", "decoder.fp16.onnx"}
    return repo


def test_the_float16_variant_computes_what_float32_does_to_half_precision(half_repo):
    """Same feeds through both decoders, step by step: the float16 graphs keep float32 inputs and
    outputs (the cache and the decode loop are unchanged) and their logits stay within float16's reach."""
    import numpy as np

    from attnserve.server.decoding.batch import Batch

    model = find_models(half_repo)[MODEL]
    engines = {v: load_engine(model, RuntimeOptions(variant=v)) for v in ("", "fp16")}
    try:
        assert engines["fp16"].info.variant == "fp16"
        texts = ["Save the file", "開啟檔案選單", "Open the File menu, then choose Save."]
        batches = {}
        for variant, engine in engines.items():
            prepared = [engine.prepare(GenerationRequest(MODEL, t, "zh-TW")) for t in texts]
            batches[variant] = Batch.build(engine.manifest, engine.runtime,
                                           engine.preprocessor.collate([p.source for p in prepared]))
        for token in [4, 9, 10, 11, 12, 13, 14, 15]:
            full, half = (batches[v].step(np.full(len(texts), token)) for v in ("", "fp16"))
            finite = np.isfinite(full.logits)
            assert half.logits.dtype == np.float32 and np.array_equal(finite, np.isfinite(half.logits))
            np.testing.assert_allclose(half.logits[finite], full.logits[finite], atol=0.05, rtol=0.01)
            np.testing.assert_allclose(half.attention, full.attention, atol=5e-3)
    finally:
        for engine in engines.values():
            engine.close()


def test_an_unknown_variant_kind_is_refused(tiny_model_repo, tmp_path):
    with pytest.raises(ValueError, match="unknown variant 'int4': use one of int8, fp16"):
        quantize_folder(tmp_path, "int4")
