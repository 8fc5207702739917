"""Model repository loading: newest version, missing files, and graphs that disagree with their manifest."""

from __future__ import annotations

import json
import shutil

import onnxruntime as ort
import pytest

from attnserve.server.model.repository import find_models, newest_version, open_runtime
from attnserve.server.model.runtime import RuntimeOptions


@pytest.fixture
def repo_copy(tmp_path, tiny_model_repo):
    """A private copy of the tiny model repository that a test may break."""
    copy = tmp_path / "repo"
    shutil.copytree(tiny_model_repo, copy)
    return copy


def edit_manifest(folder, change) -> None:
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_finds_the_tiny_model_and_its_graphs_match(tiny_model_repo):
    models = find_models(tiny_model_repo)
    assert list(models) == ["tiny-translate"]
    model = models["tiny-translate"]
    assert model.version == 1 and model.encoder_path.is_file() and model.tokenizer_path.is_file()
    runtime = open_runtime(model, RuntimeOptions())
    assert runtime.providers == ["CPUExecutionProvider"]
    assert runtime.decoder_signature.inputs["past_key_values.0.decoder.key"].rank == 4


def test_highest_integer_version_wins(repo_copy):
    model = repo_copy / "tiny-translate"
    for version in ("2", "10"):
        shutil.copytree(model / "1", model / version)
        edit_manifest(model / version, lambda d, v=version: d.update(version=int(v)))
    (model / "latest").mkdir()  # not an integer: ignored
    assert newest_version(model).name == "10"
    assert find_models(repo_copy)["tiny-translate"].version == 10


def test_a_broken_newest_version_gives_way_to_the_newest_intact_one(repo_copy, caplog):
    from attnserve.server.engine.registry import load_engines

    model = repo_copy / "tiny-translate"
    for version in ("2", "3"):
        shutil.copytree(model / "1", model / version)
        edit_manifest(model / version, lambda d, v=version: d.update(version=int(v)))
    (model / "3" / "manifest.json").write_text("{ not json")  # caught when the repository is read
    decoder = next((model / "2").glob("decoder*.onnx"))
    decoder.write_bytes(b"not an onnx graph")  # caught when the graphs load
    assert find_models(repo_copy)["tiny-translate"].version == 2
    registry = load_engines(repo_copy)
    try:
        assert registry.get("tiny-translate").info.version == 1
    finally:
        registry.close()
    warnings = [r.getMessage() for r in caplog.records if "serving version" in r.getMessage()]
    assert any("version 3 is broken" in w for w in warnings) and any("version 2 is broken" in w for w in warnings)
    shutil.rmtree(model / "1")
    with pytest.raises(ValueError, match="cannot load the graph"):  # nothing intact left: the newest's error
        load_engines(repo_copy)


def test_repository_problems_are_named(tmp_path, repo_copy):
    with pytest.raises(ValueError, match="model repository folder does not exist"):
        find_models(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no model folders"):
        find_models(tmp_path / "empty")
    (repo_copy / "no-versions").mkdir()
    with pytest.raises(ValueError, match="no-versions: no version folder"):
        find_models(repo_copy)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda d: d.update(name="other"), "name 'other' differs from its model folder 'tiny-translate'"),
        (lambda d: d.update(version=3), "version 3 differs from its version folder '1'"),
        (lambda d: d["decoder"].update(file="missing.onnx"), "missing.onnx: file named by .* field 'decoder.file'"),
        (lambda d: d["tokenizer"].update(file="vocab.json"), "vocab.json: file named by"),
    ],
)
def test_manifest_and_folder_must_agree(repo_copy, change, message):
    edit_manifest(repo_copy / "tiny-translate" / "1", change)
    with pytest.raises(ValueError, match=message):
        find_models(repo_copy)


STATE_0 = r"decoder.onnx: input 'past_key_values.0.decoder.key' \(state\[0\].input\)"


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda d: d["state"][0].update(dtype="float16"), STATE_0 + r" is float32, the manifest needs float16"),
        (lambda d: d["state"][0].update(shape=["batch", 4, 0, 8, 1]), STATE_0 + " has rank 4"),
        (lambda d: d["state"][0].update(shape=["batch", 5, 0, 8]), "axis 1 is 4, the manifest says 5"),
        (lambda d: d["state"].pop(), r"input\(s\) \['past_key_values.1.decoder.value'\] are fed by neither"),
        (lambda d: d["static"][0].update(to="encoder_mask"), "decoder.onnx: has no input 'encoder_mask'"),
        (lambda d: d["static"][1].update(**{"from": "present.9.encoder.key"}), "encoder.onnx: static 'from'"),
        (lambda d: d["encoder"]["inputs"].update(input_ids="ids"), r"encoder.onnx: input\(s\) \['input_ids'\] are not"),
        (lambda d: d["decoder"]["outputs"].update(logits="scores"), "decoder.onnx: has no output 'scores'"),
        (lambda d: d["attention"].update(heads=8), "'cross_attentions' axis 2 is 4, the manifest says 8"),
    ],
)
def test_graphs_must_match_the_manifest(repo_copy, change, message):
    edit_manifest(repo_copy / "tiny-translate" / "1", change)
    model = find_models(repo_copy)["tiny-translate"]
    with pytest.raises(ValueError, match=message):
        open_runtime(model)


def test_unloadable_graph_names_the_file(repo_copy):
    (repo_copy / "tiny-translate" / "1" / "encoder.onnx").write_bytes(b"not a graph")
    with pytest.raises(ValueError, match="encoder.onnx: ONNX Runtime cannot load the graph"):
        open_runtime(find_models(repo_copy)["tiny-translate"])


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="CUDA is available here")
def test_cuda_without_the_provider_is_a_clear_error(tiny_model_repo):
    with pytest.raises(ValueError, match="device 'cuda' asked for, but this onnxruntime build offers only"):
        open_runtime(find_models(tiny_model_repo)["tiny-translate"], RuntimeOptions(device="cuda"))


def test_runtime_options_are_validated():
    with pytest.raises(ValueError, match="RuntimeOptions.device .tpu. is not one of cpu, cuda"):
        RuntimeOptions(device="tpu")
