"""Shallow fusion with an n-gram LM served end to end: the tiny speech model with its CTC head and an LM named
in the manifest (language_model). Served == the offline reference that adds the same LM score, with and
without joint CTC scoring; batched == alone under every batching mode; beam search runs on fused scores; a
weight of 0 changes nothing; a missing file or an LM over another vocabulary is refused at load."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from attnserve.clients.client import audio_request
from attnserve.export.common.ngram_build import build
from attnserve.server.edge import app
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import AudioInput, GenerationRequest
from attnserve.server.inputs.audio import read_wav, resample
from attnserve.server.inputs.features import log_mel
from attnserve.server.model.manifest import load_manifest
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
from conftest import TINY_SPEECH_NAME as NAME
from fakes import BATCHING_MODES, WAIT, batching
import test_joint_ctc as joint
from test_joint_ctc import CLIPS, assert_batched_equals_alone, assert_beam_search_ranked, wav

LM_WEIGHT = 0.6
CTC_WEIGHT = 0.5


def tiny_lm(vocab: int, start: int):
    """An LM that strongly prefers a few tokens in a fixed rhythm, so fusing it changes the output."""
    rng = np.random.default_rng(0)
    sequences = [list(rng.choice([7, 8, 9, 10], size=rng.integers(2, 9))) for _ in range(200)]
    return build(sequences, vocab, order=4, start_id=start, eos_id=2, min_count=1)


def write_repo(root, model, tokenizer, lm_weight: float | None, ctc_weight: float | None = CTC_WEIGHT, lm=None):
    """The tiny speech model with `tiny_lm` (or `lm`) fused at `lm_weight`; None ships no LM."""
    from attnserve.export.translation import bpe

    if lm_weight is not None and lm is None:
        lm = tiny_lm(tokenizer.get_vocab_size(), bpe.language_token_ids(tokenizer)["en"])
    return joint.write_repo(root, model, tokenizer, ctc_weight, lm if lm_weight is not None else None, lm_weight)


@pytest.fixture(scope="module")
def fused_repo(tmp_path_factory, tiny_speech_model, tiny_tokenizer):
    return write_repo(tmp_path_factory.mktemp("fused"), tiny_speech_model, tiny_tokenizer, LM_WEIGHT)


@pytest.fixture(scope="module")
def served(fused_repo):
    yield from joint.serve(fused_repo)


def reference(model, repo, data: bytes, ctc_weight: float, lm_weight: float) -> list[int]:
    from attnserve.server.decoding.ngram_lm import NgramLanguageModel

    folder = repo / NAME / "1"
    manifest = load_manifest(folder / "manifest.json")
    parsed = read_wav(data)
    features = log_mel(resample(parsed.samples(), parsed.sample_rate_hz, 16000), manifest.input.features)
    lm = NgramLanguageModel.load(folder / "lm.npz") if lm_weight else None
    tokens, _ = model.greedy_decode(torch.from_numpy(features), manifest.decoder_start["en"], eos=2, max_new=12,
                                    ctc_weight=ctc_weight, lm=lm, lm_weight=lm_weight)
    return tokens


@pytest.mark.parametrize("i", range(len(CLIPS)))
def test_served_fused_decoding_equals_the_offline_reference(served, fused_repo, tiny_speech_model, i):
    client, _ = served
    result = client.generate(audio_request(wav(i), model=NAME))
    expected = reference(tiny_speech_model, fused_repo, wav(i), CTC_WEIGHT, LM_WEIGHT)
    assert [t.id for t in result.tokens] == expected and expected


def test_the_lm_changes_what_is_decoded(fused_repo, tiny_speech_model):
    fused = [reference(tiny_speech_model, fused_repo, wav(i), CTC_WEIGHT, LM_WEIGHT) for i in range(len(CLIPS))]
    joint = [reference(tiny_speech_model, fused_repo, wav(i), CTC_WEIGHT, 0.0) for i in range(len(CLIPS))]
    assert fused != joint


def test_fusion_without_a_ctc_head_equals_the_offline_reference(tmp_path, tiny_speech_model, tiny_tokenizer):
    repo = write_repo(tmp_path, tiny_speech_model, tiny_tokenizer, LM_WEIGHT, ctc_weight=None)
    engine = load_engine(find_models(repo)[NAME], RuntimeOptions(), batching("window", 4))
    try:
        for i in range(len(CLIPS)):
            result = engine.generate(GenerationRequest(NAME, audio=AudioInput(wav=wav(i))), WAIT)
            assert [t.id for t in result.tokens] == reference(tiny_speech_model, repo, wav(i), 0.0, LM_WEIGHT)
    finally:
        engine.close()


@pytest.mark.parametrize("mode", BATCHING_MODES)
def test_a_batch_of_clips_decoded_with_the_lm_equals_each_clip_alone(served, fused_repo, mode):
    assert_batched_equals_alone(fused_repo, served[1], mode)


def test_beam_search_ranks_fused_scores_and_its_first_beam_of_one_is_greedy(served):
    assert_beam_search_ranked(served[0])


def test_a_weight_of_zero_changes_nothing(tmp_path, tiny_speech_model, tiny_tokenizer):
    joint.assert_same_tokens(*(write_repo(tmp_path / name, tiny_speech_model, tiny_tokenizer, weight)
                               for name, weight in (("zero", 0.0), ("none", None))))


def test_a_missing_lm_file_is_refused(tmp_path, fused_repo):
    shutil.copytree(fused_repo, tmp_path / "repo")
    (tmp_path / "repo" / NAME / "1" / "lm.npz").unlink()
    with pytest.raises(ValueError, match="lm.npz: file named by .* field 'language_model.file' does not exist"):
        app.load_engines(app.ServeOptions(models=str(tmp_path / "repo")))


def test_an_lm_over_another_vocabulary_is_refused(tmp_path, tiny_speech_model, tiny_tokenizer):
    other = build([[4, 5, 6]], 9, order=3, start_id=3, eos_id=2)
    repo = write_repo(tmp_path, tiny_speech_model, tiny_tokenizer, LM_WEIGHT, lm=other)
    with pytest.raises(ValueError, match="the language model scores 9 tokens, the decoder"):
        app.load_engines(app.ServeOptions(models=str(repo)))


def test_a_weight_above_one_is_refused(tmp_path, fused_repo):
    shutil.copytree(fused_repo, tmp_path / "repo")
    path = tmp_path / "repo" / NAME / "1" / "manifest.json"
    data = json.loads(path.read_text())
    data["language_model"]["weight"] = 1.5
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="'language_model.weight' must be in \\[0, 1\\], got 1.5"):
        app.load_engines(app.ServeOptions(models=str(tmp_path / "repo")))
