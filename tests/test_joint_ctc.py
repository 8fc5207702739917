"""Joint CTC/attention decoding served end to end: the tiny speech model with its CTC head exported and named
in the manifest (encoder.ctc). Served == the offline reference that ranks each token by the same joint score,
batched == alone under every batching mode, beam search runs on joint scores, a weight of 0 is plain attention
decoding, and a manifest naming outputs the encoder lacks is refused at load."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from attnserve.clients.client import Client, audio_request
from attnserve.server.edge import app
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import AudioInput, GenerationRequest
from attnserve.server.inputs.audio import read_wav, resample
from attnserve.server.inputs.features import log_mel
from attnserve.server.model.manifest import load_manifest
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
from conftest import TINY_SPEECH_NAME as NAME
from fakes import BATCHING_MODES, WAIT, batching, generate_together, wav_bytes
from test_speech import clip

WEIGHT = 0.5
CLIPS = [(1.0, 16000), (0.4, 8000), (2.2, 44100), (0.6, 16000), (1.7, 22050)]


def wav(i: int) -> bytes:
    seconds, rate = CLIPS[i]
    return wav_bytes(clip(seconds, rate, seed=10 + i), rate, "pcm16")


def write_repo(root, model, tokenizer, weight: float | None, lm=None, lm_weight: float = 0.0):
    """The tiny speech model with its CTC head; `weight` None leaves encoder.ctc out of the manifest, and an
    n-gram `lm` is shipped as lm.npz with `lm_weight` (manifest language_model)."""
    import tiny_speech

    from attnserve.export.translation import bpe

    folder = root / NAME / "1"
    tiny_speech.export(model, folder, ctc=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    data = tiny_speech.manifest(NAME, bpe.language_token_ids(tokenizer)["en"])
    if weight is not None:
        data["encoder"]["ctc"] = {"log_probs": "ctc_log_probs", "lengths": "ctc_lengths", "blank_id": 0,
                                  "weight": weight}
    if lm is not None:
        lm.save(folder / "lm.npz")
        data["language_model"] = {"file": "lm.npz", "weight": lm_weight}
    tiny_speech.write_manifest(folder, data)
    return root


@pytest.fixture(scope="module")
def joint_repo(tmp_path_factory, tiny_speech_model, tiny_tokenizer):
    return write_repo(tmp_path_factory.mktemp("joint"), tiny_speech_model, tiny_tokenizer, WEIGHT)


def serve(repo):
    """A client of a background server of the repository's models, and the engines."""
    engines = app.load_engines(app.ServeOptions(models=str(repo)))
    with app.BackgroundServer(engines) as background, Client(background.address, timeout=WAIT) as client:
        yield client, engines


@pytest.fixture(scope="module")
def served(joint_repo):
    yield from serve(joint_repo)


def reference(model, repo, data: bytes, weight: float) -> list[int]:
    manifest = load_manifest(repo / NAME / "1" / "manifest.json")
    parsed = read_wav(data)
    features = log_mel(resample(parsed.samples(), parsed.sample_rate_hz, 16000), manifest.input.features)
    start = manifest.decoder_start["en"]
    tokens, _ = model.greedy_decode(torch.from_numpy(features), start, eos=2, max_new=12, ctc_weight=weight)
    return tokens


@pytest.mark.parametrize("i", range(len(CLIPS)))
def test_served_joint_decoding_equals_the_offline_reference(served, joint_repo, tiny_speech_model, i):
    client, _ = served
    result = client.generate(audio_request(wav(i), model=NAME))
    expected = reference(tiny_speech_model, joint_repo, wav(i), WEIGHT)
    assert [t.id for t in result.tokens] == expected and expected


def test_the_ctc_scores_change_what_is_decoded(served, joint_repo, tiny_speech_model):
    """Not a no-op: on these clips the joint reference and plain attention disagree somewhere."""
    joint = [reference(tiny_speech_model, joint_repo, wav(i), WEIGHT) for i in range(len(CLIPS))]
    plain = [reference(tiny_speech_model, joint_repo, wav(i), 0.0) for i in range(len(CLIPS))]
    assert joint != plain


def assert_batched_equals_alone(repo, engines, mode: str) -> None:
    """Every clip decoded in one batch (batching `mode`) gives the tokens and log-probs it gets alone."""
    requests = [GenerationRequest(NAME, audio=AudioInput(wav=wav(i))) for i in range(len(CLIPS))]
    batched = generate_together(repo, NAME, mode, requests)
    for request, result in zip(requests, batched):
        alone = engines[NAME].generate(request, WAIT)
        assert [t.id for t in result.tokens] == [t.id for t in alone.tokens]
        np.testing.assert_allclose([t.logprob for t in result.tokens], [t.logprob for t in alone.tokens], atol=1e-5)


def assert_beam_search_ranked(client) -> None:
    """Beam 1 equals greedy; beam 4's n-best come ranked by score, best first, and the first is the output."""
    for i in range(len(CLIPS)):
        greedy = client.generate(audio_request(wav(i), model=NAME))
        beam1 = client.generate(audio_request(wav(i), model=NAME, beam_size=1))
        beam4 = client.generate(audio_request(wav(i), model=NAME, beam_size=4, num_return_sequences=4))
        assert beam1.tokens == greedy.tokens
        scores = [s.score for s in beam4.nbest]
        assert len(scores) > 1 and scores == sorted(scores, reverse=True) and np.all(np.isfinite(scores))
        assert beam4.tokens == beam4.nbest[0].tokens


@pytest.mark.parametrize("mode", BATCHING_MODES)
def test_a_batch_of_clips_decoded_jointly_equals_each_clip_alone(served, joint_repo, mode):
    assert_batched_equals_alone(joint_repo, served[1], mode)


def test_beam_search_ranks_joint_scores_and_its_first_beam_of_one_is_greedy(served):
    assert_beam_search_ranked(served[0])


def assert_same_tokens(*repos) -> None:
    """Each repository's model decodes every clip to the same tokens."""
    engines = [load_engine(find_models(r)[NAME], RuntimeOptions(), batching("window", 4)) for r in repos]
    try:
        for i in range(len(CLIPS)):
            request = GenerationRequest(NAME, audio=AudioInput(wav=wav(i)))
            first, *others = (e.generate(request, WAIT) for e in engines)
            assert all(first.tokens == o.tokens for o in others)
    finally:
        for e in engines:
            e.close()


def test_a_weight_of_zero_is_plain_attention_decoding(tmp_path, tiny_speech_model, tiny_tokenizer, tiny_speech_repo):
    assert_same_tokens(write_repo(tmp_path, tiny_speech_model, tiny_tokenizer, 0.0), tiny_speech_repo)


def test_a_manifest_naming_ctc_outputs_the_encoder_lacks_is_refused(tmp_path, tiny_speech_repo):
    import json

    shutil.copytree(tiny_speech_repo, tmp_path / "repo")
    path = tmp_path / "repo" / NAME / "1" / "manifest.json"
    data = json.loads(path.read_text())
    data["encoder"]["ctc"] = {"log_probs": "ctc_log_probs", "lengths": "ctc_lengths"}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="has no output 'ctc_log_probs' \\(encoder.ctc.log_probs\\)"):
        app.load_engines(app.ServeOptions(models=str(tmp_path / "repo")))
    data["encoder"]["ctc"]["weight"] = 1.5
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="field 'encoder.ctc.weight' must be in \\[0, 1\\], got 1.5"):
        app.load_engines(app.ServeOptions(models=str(tmp_path / "repo")))
