"""Shared checks of imported seq2seq graphs against the eager transformers model (test_import_*.py)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort


def graph_differences(folder, ids: np.ndarray, mask: np.ndarray, sequences: np.ndarray,
                      want_logprobs: np.ndarray, want_attention: np.ndarray) -> tuple[float, float]:
    """step_differences of a text encoder fed `ids` (B, S) and their `mask`."""
    return step_differences(folder, {"input_ids": ids, "attention_mask": mask}, sequences, want_logprobs,
                            want_attention)


def step_differences(folder, encoder_feeds: dict, sequences: np.ndarray, want_logprobs: np.ndarray,
                     want_attention: np.ndarray) -> tuple[float, float]:
    """Runs encoder.onnx on `encoder_feeds` and a cached decode of decoder.onnx over `sequences` (B, T) (the
    decoder's inputs, start token first), its static inputs from the manifest, and returns the largest
    |log-prob| and |cross-attention| differences from the eager model's (B, T, V) log-probabilities and
    (B, L, H, T, S) cross-attention at every step."""
    import torch

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    encoder, decoder = (ort.InferenceSession(str(folder / f), opts, providers=["CPUExecutionProvider"])
                        for f in ("encoder.onnx", "decoder.onnx"))
    enc = dict(zip([o.name for o in encoder.get_outputs()], encoder.run(None, encoder_feeds)))
    enc.update(encoder_feeds)  # a static input may be an encoder input (the source mask)
    manifest = json.loads((folder / "manifest.json").read_text())
    b = len(sequences)
    cache = {s["input"]: np.zeros((b, s["shape"][1], 0, s["shape"][3]), np.float32) for s in manifest["state"]}
    worst_lp = worst_attention = 0.0
    for step in range(sequences.shape[1] - 1):
        feeds = {"input_ids": sequences[:, step : step + 1], "position_ids": np.full((b, 1), step),
                 "decoder_attention_mask": np.ones((b, step + 1), np.int64), **cache,
                 **{s["to"]: enc[s["from"]] for s in manifest["static"]}}
        res = dict(zip([o.name for o in decoder.get_outputs()], decoder.run(None, feeds)))
        for s in manifest["state"]:
            cache[s["input"]] = np.concatenate([cache[s["input"]], res[s["output"]]], axis=2)
        lp = torch.log_softmax(torch.from_numpy(res["logits"]), -1).numpy()
        worst_lp = max(worst_lp, _largest(lp - want_logprobs[:, step]))
        worst_attention = max(worst_attention, _largest(res["cross_attentions"] - want_attention[:, :, :, step]))
    return worst_lp, worst_attention


def imported(checkpoint, repository, name: str):
    """`attnserve import` of `checkpoint` into `repository` as `name`; returns the repository."""
    from attnserve.clients import cli

    assert cli.main(["import", str(checkpoint), "--name", name, "--repository", str(repository)]) == 0
    return repository


def serving(repository, name: str):
    """The engine of model `name` of `repository` (a generator for module fixtures: closed after)."""
    from attnserve.server.engine.batcher import BatchingOptions
    from attnserve.server.engine.registry import load_engine
    from attnserve.server.model.repository import find_models
    from attnserve.server.model.runtime import RuntimeOptions

    engine = load_engine(find_models(repository)[name], RuntimeOptions(), BatchingOptions())
    yield engine
    engine.close()


def edit_json(path, **changes) -> None:
    """Sets keys of a JSON object file (a checkpoint's config.json, generation_config.json, ...)."""
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def assert_import_refused(checkpoint, tmp_path, capsys, breakage, message: str) -> None:
    """A copy of `checkpoint` broken by `breakage(folder)` is refused with `message`, leaving no folder."""
    import shutil

    from attnserve.clients import cli

    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    breakage(broken)
    assert cli.main(["import", str(broken), "--name", "x", "--repository", str(tmp_path / "repo")]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "repo" / "x" / "1").exists()


def forward_with_attention(model, batch, sequences):
    """The eager model's teacher-forced forward over `sequences` (decoder inputs), with attentions."""
    import torch

    with torch.no_grad():
        return model(**batch, decoder_input_ids=sequences, output_attentions=True)


def tokens_served_without_torch(repo, name: str, request_code: str) -> list[int]:
    """Token ids of one request served in a fresh process where torch, transformers, sentencepiece and onnx
    cannot be imported (the serving install has none of them).

    Args:
        request_code: a Python expression building the GenerationRequest (GenerationRequest,
            DecodingOptions and ImageInput are in scope).
    """
    import subprocess
    import sys

    script = f"""
import sys
for name in ("torch", "transformers", "sentencepiece", "onnx"):
    sys.modules[name] = None  # importing any of them now raises ImportError
from attnserve.clients import cli
cli._parser()  # `attnserve import` is listed; its importer is not loaded
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import DecodingOptions, GenerationRequest, ImageInput
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
engine = load_engine(find_models({str(repo)!r})[{name!r}], RuntimeOptions(), BatchingOptions())
result = engine.generate({request_code})
engine.close()
print(" ".join(str(t.id) for t in result.tokens))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [int(t) for t in out.stdout.split()]


def _largest(difference: np.ndarray) -> float:
    """max |difference|, infinite where either side is NaN (a NaN must never compare as equal)."""
    return float(np.nan_to_num(np.abs(difference), nan=np.inf).max())
