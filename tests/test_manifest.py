"""manifest.json parsing: the exported manifest reads back, and every broken field is named in the error."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from attnserve.server.model.manifest import load_manifest, parse_manifest
from fakes import captioner_manifest, speller_manifest


def contract_example() -> dict:
    """The example manifest of docs/model-contract.md (one decoder layer's worth of static and state)."""
    return {
        "format_version": 1,
        "name": "translate-zh-en",
        "version": 1,
        "task": "translation",
        "description": "Traditional Chinese <-> English Transformer",
        "languages": {"source": ["en", "zh-TW"], "target": ["en", "zh-TW"]},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "metaspace-cjk"},
        "special_tokens": {"pad": 0, "unk": 1, "eos": 2},
        "decoder_start": {"en": 4, "zh-TW": 5},
        "limits": {"max_source_tokens": 256, "max_new_tokens": 256},
        "attention": {"output": "cross_attentions", "layers": 3, "heads": 4},
        "encoder": {"file": "encoder.onnx", "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}},
        "decoder": {
            "file": "decoder.onnx",
            "inputs": {
                "input_ids": "input_ids",
                "position_ids": "position_ids",
                "self_attention_mask": "decoder_attention_mask",
            },
            "outputs": {"logits": "logits"},
        },
        "static": [
            {"from": "attention_mask", "to": "encoder_attention_mask", "batch_axis": 0, "source_axis": 1},
            {"from": "present.0.encoder.key", "to": "past_key_values.0.encoder.key", "batch_axis": 0, "source_axis": 2},
        ],
        "state": [
            {
                "input": "past_key_values.0.decoder.key",
                "output": "present.0.decoder.key",
                "update": "append",
                "batch_axis": 0,
                "time_axis": 2,
                "dtype": "float32",
                "shape": ["batch", 4, 0, 64],
                "init": "zeros",
            }
        ],
    }


def test_exported_manifest_reads_back(tiny_model_dir):
    m = load_manifest(tiny_model_dir / "manifest.json")
    raw = json.loads((tiny_model_dir / "manifest.json").read_text())
    layers = raw["attention"]["layers"]
    assert (m.name, m.version, m.task) == ("tiny-translate", 1, "translation")
    assert m.target_languages == ("en", "zh-TW")
    assert dict(m.decoder_start) == raw["decoder_start"]
    assert m.special_tokens.eos == raw["special_tokens"]["eos"]
    assert m.limits.max_new_tokens == raw["limits"]["max_new_tokens"]
    assert len(m.static) == 1 + 2 * layers and len(m.state) == 2 * layers
    assert {s.update for s in m.state} == {"append"} and {s.time_axis for s in m.state} == {2}
    assert m.state[0].shape[0] == "batch" and m.state[0].init_from is None
    assert m.decoder.self_attention_mask == "decoder_attention_mask"


def test_contract_example_parses_and_is_frozen():
    m = parse_manifest(contract_example())
    assert m.static[1].source == "present.0.encoder.key" and m.static[1].source_axis == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.name = "other"


def test_optional_decoder_inputs_and_replace_state_from_encoder():
    data = contract_example()
    del data["decoder"]["inputs"]["position_ids"], data["decoder"]["inputs"]["self_attention_mask"]
    data["state"] = [
        {"input": "h", "output": "h_out", "update": "replace", "batch_axis": 0, "dtype": "float32",
         "shape": ["batch", 8], "init": {"from": "encoder_final"}}
    ]
    m = parse_manifest(data)
    assert m.decoder.position_ids is None and m.decoder.self_attention_mask is None
    assert m.state[0].time_axis is None and m.state[0].init_from == "encoder_final"


def _set(data: dict, path: str, value) -> None:
    keys = path.split(".")
    for key in keys[:-1]:
        data = data[int(key)] if isinstance(data, list) else data[key]
    if value is KeyError:
        del data[keys[-1]]
    else:
        data[keys[-1]] = value


@pytest.mark.parametrize(
    "path,value,message",
    [
        ("limits.max_new_tokens", KeyError, "missing field 'limits.max_new_tokens'"),
        ("limits.max_source_tokens", "256", "field 'limits.max_source_tokens' must be int"),
        ("limits.max_source_tokens", 0, "field 'limits.max_source_tokens' must be >= 1"),
        ("special_tokens.eos", True, "field 'special_tokens.eos' must be int"),
        ("attention.default_layer", 7, "field 'attention.default_layer' 7 is not a layer of"),
        ("special_tokens.suppress", [0, "4"], "field 'special_tokens.suppress' must be a list of token ids"),
        ("special_tokens.suppress", [0, 2], "field 'special_tokens.suppress' holds the eos id 2"),
        ("format_version", 2, "format_version 2 is not supported"),
        ("tokenizer.word_boundary", "spaces", "word_boundary 'spaces' is not one of"),
        ("languages.target", [], "field 'languages.target' must be a non-empty list"),
        ("decoder_start", {"en": 4}, "no token for target language(s) ['zh-TW']"),
        ("decoder_start", {"en": 4, "zh-TW": 5, "fr": 6}, "decoder_start names ['fr']"),
        ("state.0.update", "grow", "field 'state[0]' update 'grow' is not one of"),
        ("state.0.time_axis", KeyError, "an 'append' state needs a time_axis"),
        ("state.0.shape", [4, 4, 0, 64], "must say 'batch' exactly once"),
        ("state.0.shape", ["batch", 4, "source", 64], "may say 'source' once, and only in a 'replace' state"),
        ("state.0.shape", ["batch", 4, "time", 64], "must hold non-negative ints and the strings"),
        ("state.0.dtype", "complex64", "dtype 'complex64'"),
        ("state.0.init", "ones", "init must be \"zeros\" or"),
        ("static.0.to", "past_key_values.0.decoder.key", "fed more than once"),
        ("static.1.source_axis", 0, "batch_axis and source_axis must differ"),
        ("static.1.from", KeyError, "missing field 'static[1].from'"),
        ("decoder.outputs", KeyError, "missing field 'decoder.outputs'"),
        ("attention.output", "logits", "used more than once"),
    ],
)
def test_broken_fields_are_named(path, value, message):
    data = copy.deepcopy(contract_example())
    _set(data, path, value)
    with pytest.raises(ValueError, match="^where.json:") as info:
        parse_manifest(data, where="where.json")
    assert message in str(info.value)


def test_unreadable_files_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="manifest.json: cannot read manifest"):
        load_manifest(tmp_path / "manifest.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not valid JSON"):
        load_manifest(bad)
    bad.write_text("[]")
    with pytest.raises(ValueError, match="bad.json: must be an object"):
        load_manifest(bad)


def test_a_manifest_that_is_not_utf8_names_the_file(tmp_path):
    bad = tmp_path / "manifest.json"
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match="manifest.json: not UTF-8 text"):
        load_manifest(bad)


# ---- input kinds ----------------------------------------------------------------------------------------


def test_a_manifest_without_input_is_text_and_so_is_an_explicit_text_input():
    implicit = parse_manifest(contract_example())
    data = contract_example()
    data["input"] = {"kind": "text"}
    explicit = parse_manifest(data)
    assert implicit.input == explicit.input and implicit.input.kind == "text"
    assert implicit.encoder.inputs == {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    assert implicit.limits.max_source_tokens == 256


def test_the_bundled_manifest_still_loads_as_text():
    """The translator's manifests predate the `input` section: without one a model reads text."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "models" / "translate-zh-en"
    newest = max((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    m = load_manifest(newest / "manifest.json")
    assert "input" not in json.loads((newest / "manifest.json").read_text())
    assert m.input.kind == "text" and set(m.encoder.inputs) == {"input_ids", "attention_mask"}


def test_the_speller_example_parses_as_audio():
    m = parse_manifest(speller_manifest())
    spec = m.input
    assert spec.kind == "audio" and spec.time_reduction == 4 and spec.max_seconds == 30.0
    f = spec.features
    assert (f.sample_rate_hz, f.n_mels, f.window_ms, f.shift_ms, f.fft_size) == (16000, 80, 25, 10, 512)
    assert f.log_floor == 1e-10
    assert spec.seconds_per_column == pytest.approx(0.04)
    assert spec.encoder_inputs()["input_features"].shape == (None, None, 80)
    assert m.limits.max_source_tokens is None and m.limits.max_new_tokens == 400
    assert [s.init_from for s in m.state] == ["initial_state.hidden", "initial_state.cell", None, None]
    assert [s.source_axis for s in m.state] == [None, None, None, 1]


def test_the_captioner_example_parses_as_image():
    spec = parse_manifest(captioner_manifest()).input
    assert spec.kind == "image" and (spec.height, spec.width, spec.channels) == (224, 224, 3)
    assert spec.std == (0.229, 0.224, 0.225) and (spec.grid_rows, spec.grid_cols) == (7, 7)
    assert spec.encoder_inputs()["pixel_values"].shape == (None, 3, 224, 224)


@pytest.mark.parametrize(
    "example,path,value,message",
    [
        ("speller", "input.kind", "point-cloud",
         "field 'input' kind 'point-cloud' is not one of ['text', 'audio', 'image', 'video']"),
        ("speller", "input.kind", KeyError, "missing field 'input.kind'"),
        ("speller", "input.sample_rate_hz", 0, "field 'input.sample_rate_hz' must be >= 1"),
        ("speller", "input.features.type", "mfcc", "field 'input.features' type 'mfcc' is not one of ['log-mel']"),
        ("speller", "input.features.n_mels", KeyError, "missing field 'input.features.n_mels'"),
        ("speller", "input.features.shift_ms", "10", "field 'input.features.shift_ms' must be int or float"),
        ("speller", "input.features.log_floor", 0, "field 'input.features.log_floor' must be > 0"),
        ("speller", "input.features.n_fft", 256, "field 'input.features' n_fft 256 is shorter than the window"),
        ("speller", "input.time_reduction", 0, "field 'input.time_reduction' must be >= 1"),
        ("speller", "input.max_seconds", -1, "field 'input.max_seconds' must be > 0"),
        ("speller", "input.max_bytes", KeyError, "missing field 'input.max_bytes'"),
        ("speller", "limits.max_source_tokens", 9, "max_source_tokens applies to text input"),
        ("speller", "encoder.inputs", {"input_ids": "x", "attention_mask": "y"},
         "field 'encoder.inputs' must name the encoder input of each role of audio input"),
        ("text", "encoder.inputs", {"input_ids": "input_ids"}, "role of text input, ['attention_mask', 'input_ids']"),
        ("text", "limits.max_source_tokens", KeyError, "missing field 'limits.max_source_tokens'"),
        ("captioner", "input.channels", 2, "field 'input' channels 2 is not 1 (grey) or 3 (RGB)"),
        ("captioner", "input.normalize.mean", [0.5, 0.5], "field 'input.normalize.mean' must be a list of 3 numbers"),
        ("captioner", "input.normalize.std", [1, 0, 1], "must be a list of 3 positive numbers"),
        ("captioner", "input.grid.rows", 300, "300 x 7 cells do not fit a 224 x 224 image"),
    ],
)
def test_broken_input_fields_are_named(example, path, value, message):
    data = {"speller": speller_manifest, "captioner": captioner_manifest, "text": contract_example}[example]()
    _set(data, path, value)
    with pytest.raises(ValueError, match="^where.json:") as info:
        parse_manifest(data, where="where.json")
    assert message in str(info.value)


def test_the_contract_documents_the_speller_example_that_parses():
    import pathlib
    import re

    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "model-contract.md").read_text()
    section = doc[doc.index("## A third worked example") :]
    block = re.search(r"```json\n(.*?)\n```", section, re.S).group(1)
    assert json.loads(block) == speller_manifest()
    assert parse_manifest(json.loads(block)).input.kind == "audio"
