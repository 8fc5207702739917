"""manifest.json parsing: the exported manifest reads back, and every broken field is named in the error."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from attnserve.server.manifest import load_manifest, parse_manifest


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
