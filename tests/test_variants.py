"""Manifest variants: an int8 copy of a model's graphs (export/quantize.py), served with --variant."""

from __future__ import annotations

import json
import shutil

import pytest

from attnserve.clients.client import Client
from attnserve.export.quantize import quantize_folder
from attnserve.server import app
from attnserve.server.engine import load_engine
from attnserve.server.generation import GenerationRequest
from attnserve.server.repository import find_models
from attnserve.server.runtime import RuntimeOptions

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
