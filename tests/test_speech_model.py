"""The listen-attend-spell recognizer (export/speech/) on tiny random weights: teacher-forced == step by step,
a padded batch == each clip alone, ONNX == PyTorch at lengths and batch sizes unlike the export example
with the time axes symbolic, served == PyTorch through the real server, training features == served
features (the feature cache included), and one training step lowers the loss."""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import onnx
import pytest
import torch

from attnserve.export.common.cpu_bf16 import has_native_bf16
from attnserve.export.speech import vocabulary
from attnserve.export.speech.export import CTC_WEIGHT, PARITY_CASES, export_model, parity, served_length_limit
from attnserve.export.speech.feature_cache import FEATURES, load_split, wav_features
from attnserve.export.speech.model import ListenAttendSpell, ListenAttendSpellConfig, pad_features
from attnserve.export.speech.specaugment import AugmentOptions, SpecAugment, warp_mel
from attnserve.export.speech.train import Batch, TrainOptions, collate, joint_loss, make_batches
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import AttentionOptions, AudioInput, DecodingOptions, GenerationRequest
from attnserve.server.inputs.audio import AudioPreprocessor
from attnserve.server.model.manifest import load_manifest
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
from attnserve.server.model.tokenization import Tokenizer as ServedTokenizer
from fakes import BATCHING_MODES, WAIT, batching, submit_together, wav_bytes

NAME = "tiny-las"
ATOL = 1e-5
MAX_NEW = 10
RNG = np.random.default_rng(0)


def tiny_config(**changes) -> ListenAttendSpellConfig:
    base = dict(listener_hidden=12, speller_hidden=16, embed_dim=8, attention_dim=10, dropout=0.0)
    return ListenAttendSpellConfig(**{**base, **changes})


def frames(t: int) -> torch.Tensor:
    """(t, 80) frames in the range of real log-mel features."""
    return torch.from_numpy(RNG.normal(-5.0, 3.0, (t, 80)).astype(np.float32))


def speech(seconds: float, rate: int = 16000, seed: int = 0) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    noise = 0.05 * np.random.default_rng(seed).standard_normal(len(t))
    return 0.3 * np.sin(2 * np.pi * (150 + 700 * t) * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2 + noise


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def model() -> ListenAttendSpell:
    torch.manual_seed(0)
    return ListenAttendSpell(tiny_config()).eval()


@pytest.fixture(scope="module")
def repo(tmp_path_factory, model):
    repo = tmp_path_factory.mktemp("speech_model_repo")
    export_model(model, vocabulary.character_tokenizer(), repo / NAME / "1", NAME, max_seconds=5, max_new_tokens=MAX_NEW)
    return repo


# ---- the model ---------------------------------------------------------------------------------------------


def test_teacher_forced_logits_equal_the_step_by_step_decoder(model):
    features, mask = pad_features([frames(70), frames(45)], model.cfg.time_reduction)
    tgt_in = torch.tensor([[vocabulary.START_ID, 9, 4, 12, 7], [vocabulary.START_ID, 20, 5, 0, 0]])
    with torch.no_grad():
        teacher_forced, _, _ = model(features, mask, tgt_in)
        memory, keys, reduced, h, c = model.encode(features, mask)
        context, previous, steps = model.initial_context(2), torch.zeros(reduced.shape), []
        for u in range(tgt_in.shape[1]):
            logits, h, c, context, previous = model.decode_step(
                tgt_in[:, u], h, c, context, previous, memory, keys, reduced)
            steps.append(logits)
    torch.testing.assert_close(teacher_forced, torch.stack(steps, 1), atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def stacked() -> ListenAttendSpell:
    """Frames stacked 4 at a time, 2 BiLSTMs at 25 steps/s (the CTC layer), one pyramid layer: 8x as well."""
    torch.manual_seed(1)
    return ListenAttendSpell(tiny_config(stack_frames=4, bottom_layers=2, pyramid_layers=1, ctc_layer=0)).eval()


def test_stacked_frames_reduce_time_as_the_pyramid_does(stacked):
    assert (stacked.cfg.time_reduction, stacked.cfg.ctc_reduction) == (8, 4)
    features, mask = pad_features([frames(83)], 8)
    _, ctc, ctc_lengths = stacked(features, mask, torch.tensor([[vocabulary.START_ID]]))
    assert ctc.shape == (1, 88 // 4, stacked.cfg.vocab_size) and ctc_lengths.tolist() == [-(-83 // 4)]


@pytest.mark.parametrize("which", ["model", "stacked"])
def test_a_padded_batch_equals_each_clip_alone(which, request):
    model = request.getfixturevalue(which)
    clips = [frames(37), frames(101), frames(8), frames(64)]  # 64 = a multiple of the 8x reduction
    features, mask = pad_features(clips, model.cfg.time_reduction)
    with torch.no_grad():
        memory, keys, reduced, h, c = model.encode(features, mask)
    tokens, attention = model.greedy_decode(features, mask, MAX_NEW, vocabulary.suppressed_ids())
    for row, clip in enumerate(clips):
        alone_features, alone_mask = pad_features([clip], model.cfg.time_reduction)
        with torch.no_grad():
            alone = model.encode(alone_features, alone_mask)
        s = alone[0].shape[1]
        assert s == -(-len(clip) // 8) and int(reduced[row].sum()) == s
        torch.testing.assert_close(memory[row, :s], alone[0][0], atol=1e-6, rtol=0)
        assert not memory[row, s:].any()  # zero on padding
        torch.testing.assert_close(h[row], alone[3][0], atol=1e-6, rtol=0)
        alone_tokens, alone_attention = model.greedy_decode(alone_features, alone_mask, MAX_NEW, vocabulary.suppressed_ids())
        assert tokens[row] == alone_tokens[0]
        torch.testing.assert_close(attention[row][:, :s], alone_attention[0], atol=1e-6, rtol=0)


def test_the_ctc_branch_reads_the_4x_layer_and_the_speller_the_8x_layer(model):
    features, mask = pad_features([frames(83)], 8)
    logits, ctc, ctc_lengths = model(features, mask, torch.tensor([[vocabulary.START_ID]]))
    assert (model.cfg.time_reduction, model.cfg.ctc_reduction) == (8, 4)
    assert ctc.shape == (1, 88 // 4, model.cfg.vocab_size) and ctc_lengths.tolist() == [-(-83 // 4)]


# ---- export ------------------------------------------------------------------------------------------------


def test_onnx_equals_pytorch_at_lengths_and_batch_sizes_unlike_the_export_example(model, repo):
    # The example is 2 rows of 48 frames; the cases are batches of 1, 3 and 4 with 9 to 611 frames.
    assert all(batch != 2 for batch, _ in PARITY_CASES)
    worst = parity(model, repo / NAME / "1", steps=3)
    assert set(worst) >= {"encoder_hidden_states", "logits", "present_state.context", "cross_attentions",
                          "ctc_log_probs", "ctc_lengths"}
    assert max(worst.values()) < ATOL, worst


def test_a_stacked_listener_exports_with_onnx_equal_to_pytorch(stacked, tmp_path):
    folder = export_model(stacked, vocabulary.character_tokenizer(), tmp_path / NAME / "1", NAME)
    worst = parity(stacked, folder, steps=3)
    assert max(worst.values()) < ATOL, worst
    assert load_manifest(folder / "manifest.json").input.time_reduction == 8


def test_batch_frame_and_source_axes_stay_symbolic(repo):
    def dims(path, name):
        graph = onnx.load(str(path)).graph
        value = next(v for v in [*graph.input, *graph.output] if v.name == name)
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    folder = repo / NAME / "1"
    assert dims(folder / "encoder.onnx", "input_features") == ["batch", "frames", 80]
    assert dims(folder / "encoder.onnx", "attention_mask") == ["batch", "frames"]
    assert dims(folder / "encoder.onnx", "encoder_hidden_states") == ["batch", "source", 24]
    assert dims(folder / "encoder.onnx", "initial_state.hidden") == ["batch", 16]
    assert dims(folder / "decoder.onnx", "encoder_keys") == ["batch", "source", 10]
    assert dims(folder / "decoder.onnx", "past_state.context") == ["batch", 24]
    assert dims(folder / "decoder.onnx", "cross_attentions") == ["batch", 1, 1, "source"]


def test_the_manifest_is_the_contracts_audio_speller(repo):
    manifest = load_manifest(repo / NAME / "1" / "manifest.json")
    assert manifest.input.kind == "audio" and manifest.input.time_reduction == 8
    assert manifest.input.features == FEATURES  # the training features' parameters, from one home
    assert [s.update for s in manifest.state] == ["replace"] * 4
    assert [s.source_axis for s in manifest.state] == [None, None, None, 1]  # the previous attention
    assert manifest.decoder_start == {"en": vocabulary.START_ID}


@pytest.mark.parametrize("mode", BATCHING_MODES)
def test_served_transcripts_equal_the_pytorch_greedy_decode(model, repo, mode):
    engine = load_engine(find_models(repo)[NAME], RuntimeOptions(), batching(mode, 3))
    tokenizer = vocabulary.character_tokenizer()
    wavs = [wav_bytes(speech(s, seed=i), 16000) for i, s in enumerate([0.9, 2.3, 0.37])]
    try:
        requests = [GenerationRequest(NAME, audio=AudioInput(wav=w), attention=AttentionOptions(True),
                                      decoding=DecodingOptions(MAX_NEW, beam_size=1)) for w in wavs]
        futures = submit_together(engine, requests)
        results = [f.result(WAIT) for f in futures]
    finally:
        engine.close()
    assert {r.timings.batch_size for r in results} == {3}
    for data, result in zip(wavs, results):
        features, mask = pad_features([torch.from_numpy(wav_features(data))], 8)
        with torch.no_grad():
            ctc_length = int(model.encode_for_serving(features, mask)[5][0])
        limit = served_length_limit(ctc_length, MAX_NEW)  # the served row stops there too
        tokens, attention = model.greedy_decode(features, mask, limit, vocabulary.suppressed_ids(), CTC_WEIGHT)
        assert [t.id for t in result.tokens] == tokens[0] and len(tokens[0]) > 1
        assert result.text == tokenizer.decode(tokens[0])
        np.testing.assert_allclose(result.attention.weights, attention[0].numpy(), atol=ATOL)


def hinted_copy(repo, tmp_path, **hint) -> pathlib.Path:
    """The tiny model's repository with its manifest's encoder.length_hint changed."""
    copy = tmp_path / "repo"
    shutil.copytree(repo, copy)
    path = copy / NAME / "1" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["encoder"]["length_hint"].update(hint)
    path.write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize("mode", BATCHING_MODES)
def test_the_length_hint_stops_each_row_at_its_budget(repo, tmp_path, mode):
    # scale ~0: every row may decode `offset` characters, unless it asks for more with min_new_tokens.
    engine = load_engine(find_models(hinted_copy(repo, tmp_path, scale=1e-9, offset=2))[NAME], RuntimeOptions(),
                         batching(mode, 2))
    wav = wav_bytes(speech(2.3, seed=1), 16000)
    try:
        short, insisting = submit_together(engine, [
            GenerationRequest(NAME, audio=AudioInput(wav=wav), decoding=DecodingOptions(MAX_NEW)),
            GenerationRequest(NAME, audio=AudioInput(wav=wav), decoding=DecodingOptions(MAX_NEW, min_new_tokens=4)),
        ])
        short, insisting = short.result(WAIT), insisting.result(WAIT)
    finally:
        engine.close()
    assert len(short.tokens) <= 3 and short.finish_reason.value == "length"  # offset 2, +1 for ceil(1e-9 x n)
    assert len(insisting.tokens) == 4 and insisting.finish_reason.value == "length"  # its own floor, not EOS


def test_a_length_hint_naming_no_encoder_output_is_refused(repo, tmp_path):
    with pytest.raises(ValueError, match=r"encoder.onnx: has no output 'missing' \(encoder.length_hint.output\)"):
        load_engine(find_models(hinted_copy(repo, tmp_path, output="missing"))[NAME], RuntimeOptions())


# ---- features and vocabulary -------------------------------------------------------------------------------


@pytest.mark.parametrize("rate,fmt", [(16000, "pcm16"), (44100, "float32")])
def test_training_features_equal_served_features(repo, tmp_path, rate, fmt):
    data = wav_bytes(speech(1.3, rate), rate, fmt)
    manifest = load_manifest(repo / NAME / "1" / "manifest.json")
    served = AudioPreprocessor(manifest, None).prepare(GenerationRequest(NAME, audio=AudioInput(wav=data))).features
    assert np.array_equal(wav_features(data), served)
    # The cache holds the same frames, bit for bit.
    (tmp_path / "a.wav").write_bytes(data)
    row = {"id": "u0", "path": "a.wav", "text": "a test", "engine": "sox", "voice": "chirp", "duration": 1.3}
    (tmp_path / "train.jsonl").write_text(json.dumps(row) + "\n")
    cached = load_split(tmp_path, "train", tmp_path / "cache")
    assert np.array_equal(cached.features(0), served) and cached.utterances[0].frames == len(served)


def test_characters_round_trip_and_group_into_the_servers_words():
    tokenizer = vocabulary.character_tokenizer()
    (ids,) = vocabulary.encode(tokenizer, ["he didn't go"])
    assert tokenizer.get_vocab_size() == 32 and len(ids) == len("he didn't go")
    assert tokenizer.decode(ids) == "he didn't go"
    space = tokenizer.token_to_id(vocabulary.METASPACE)
    assert tokenizer.decode([space]) == "" and tokenizer.decode([ids[0], space]) == "h "  # no panic on a lone space
    served = ServedTokenizer(tokenizer, vocabulary.EOS_ID, vocabulary.suppressed_ids(), "metaspace-cjk")
    assert served.words(ids).labels == ("he", "didn't", "go")
    with pytest.raises(ValueError, match="outside the speller's vocabulary"):
        vocabulary.encode(tokenizer, ["route 66"])


# ---- training ----------------------------------------------------------------------------------------------


def test_augmentation_leaves_padding_alone_and_a_unit_warp_changes_nothing():
    features, mask = pad_features([frames(50), frames(20)], 8)
    torch.testing.assert_close(warp_mel(features, torch.ones(2)), features)
    augment = SpecAugment(AugmentOptions())
    assert not augment.warp(features)[1, 20:].any()
    masked = augment(torch.ones_like(features), mask.sum(1))
    assert masked[0].sum() < 50 * 80 or masked[1].sum() < 20 * 80  # something was masked
    assert (masked <= 1).all() and (masked >= 0).all()


def test_batches_respect_the_budget_and_cover_every_clip_once():
    import random

    lengths = [int(x) for x in RNG.integers(50, 1400, 300)]
    opts = TrainOptions(batch_seconds=30, max_batch=16)
    batches = make_batches(lengths, opts, random.Random(1))
    assert sorted(i for b in batches for i in b) == list(range(300))
    assert all(len(b) <= 16 and (len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 3000) for b in batches)
    assert batches == make_batches(lengths, opts, random.Random(1))  # seeded: a resumed epoch is the same


def test_one_training_step_lowers_the_loss():
    torch.manual_seed(1)
    model = ListenAttendSpell(tiny_config()).train()
    features, mask = pad_features([frames(90), frames(60)], 8)
    tgt = torch.tensor([[vocabulary.START_ID, 11, 8, 4, 9, vocabulary.EOS_ID], [vocabulary.START_ID, 13, 5, 9, vocabulary.EOS_ID, 0]])
    batch = Batch(features, mask, tgt[:, :-1], tgt[:, 1:], 1.5)
    opts = TrainOptions(label_smoothing=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = joint_loss(model, batch, opts)
    optimizer.zero_grad()
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after = joint_loss(model, batch, opts)
    assert after.item() < before.item()


@pytest.mark.skipif(not has_native_bf16(), reason="this CPU has no bf16 units: oneDNN offers no bf16 LSTM "
                    "(the trainer refuses --bf16-listener: tests/test_train_bf16.py)")
def test_a_bf16_listener_trains_the_listener_in_bf16_and_leaves_the_speller_and_the_loss_float32():
    torch.manual_seed(1)
    model = ListenAttendSpell(tiny_config()).eval()  # no dropout: both passes see the same network
    features, mask = pad_features([frames(90), frames(60)], 8)
    tgt = torch.tensor([[vocabulary.START_ID, 11, 8, 4, 9, vocabulary.EOS_ID], [vocabulary.START_ID, 13, 5, 9, vocabulary.EOS_ID, 0]])
    batch = Batch(features, mask, tgt[:, :-1], tgt[:, 1:], 1.5)
    dtypes = []
    model.listener.bottom.register_forward_hook(lambda m, i, out: dtypes.append(("listener", out.dtype)))
    model.speller.out.register_forward_hook(lambda m, i, out: dtypes.append(("speller", out.dtype)))
    full = joint_loss(model, batch, TrainOptions(label_smoothing=0.0))
    half_start = len(dtypes)
    half = joint_loss(model, batch, TrainOptions(label_smoothing=0.0, bf16_listener=True))
    assert set(dtypes[:half_start]) == {("listener", torch.float32), ("speller", torch.float32)}
    assert set(dtypes[half_start:]) == {("listener", torch.bfloat16), ("speller", torch.float32)}
    assert half.dtype == torch.float32 and abs(half.item() - full.item()) / full.item() < 0.02
    half.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)


def test_collate_pads_frames_to_the_reduction_and_targets_with_start_and_eos(tmp_path):
    data = [wav_bytes(speech(s, seed=i), 16000) for i, s in enumerate([0.5, 0.8])]
    rows = []
    for i, d in enumerate(data):
        (tmp_path / f"{i}.wav").write_bytes(d)
        rows.append({"id": f"u{i}", "path": f"{i}.wav", "text": ["ab", "a b c"][i], "engine": "x", "voice": "y",
                     "duration": [0.5, 0.8][i]})
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    split = load_split(tmp_path, "dev", tmp_path / "cache")
    targets = vocabulary.encode(vocabulary.character_tokenizer(), [u.text for u in split.utterances])
    batch = collate(split, targets, [0, 1], 8)
    assert batch.features.shape[1] % 8 == 0 and batch.mask.sum(1).tolist() == [u.frames for u in split.utterances]
    assert batch.tgt_in[:, 0].tolist() == [vocabulary.START_ID] * 2
    assert batch.tgt_out[0, 2].item() == vocabulary.EOS_ID and batch.tokens == 3 + 6


# ---- evaluation --------------------------------------------------------------------------------------------


def test_error_rates_count_edits_over_reference_units():
    from attnserve.export.speech.scoring import error_rate

    assert error_rate(["he asked"], ["he asked"], "char") == 0.0
    assert error_rate(["he askd me"], ["he asked"], "char") == pytest.approx(4 / 8)  # 1 deletion, 3 insertions
    assert error_rate(["he askd me", "go"], ["he asked", "go"], "word") == pytest.approx(2 / 3)


def test_served_word_times_are_compared_with_the_matching_reference_words():
    from types import SimpleNamespace

    from attnserve.export.speech.evaluate import timing_summary, voice_group, word_time_errors
    from attnserve.api.generation import WordTiming

    row = {"text": "go on now", "inexact_words": 0, "words": [["go", 0.0, 0.16], ["on", 0.16, 0.40], ["now", 0.5, 0.9]]}
    # "go an now": "an" matches nothing; "go" and "now" are compared with their reference times.
    served = SimpleNamespace(words=[WordTiming("go", 0.08, 0.16), WordTiming("an", 0.16, 0.4), WordTiming("now", 0.5, 1.1)])
    np.testing.assert_allclose(word_time_errors(row, served), [(0.08, 0.0), (0.0, 0.2)], atol=1e-9)
    assert word_time_errors({**row, "inexact_words": 1}, served) == []
    summary = timing_summary(word_time_errors(row, served))
    assert summary["words"] == 2 and summary["boundaries_within_100ms"] == pytest.approx(3 / 4)
    assert summary["start_median_s"] == pytest.approx(0.04) and timing_summary([]) == {"words": 0}
    assert voice_group({"engine": "espeak-ng", "voice": "en-gb-x-rp+f3"}) == "espeak-ng:en-gb-x-rp"


def test_evaluation_decoding_variants_change_only_the_manifests_decoding_fields(repo, tmp_path):
    from attnserve.export.speech.evaluate import decoding_variant

    folder = repo / NAME / "1"
    with decoding_variant(folder, None, True) as same:
        assert same == folder
    with decoding_variant(folder, 0.0, False) as variant:
        original, changed = (load_manifest(f / "manifest.json") for f in (folder, variant))
        assert changed.encoder.ctc.weight == 0.0 and original.encoder.ctc.weight == CTC_WEIGHT
        assert changed.encoder.length_hint is None and original.encoder.length_hint is not None
        assert (variant / "encoder.onnx").resolve() == (folder / "encoder.onnx").resolve()
    assert not variant.exists()
    plain = tmp_path / NAME / "1"
    shutil.copytree(folder, plain)
    data = json.loads((plain / "manifest.json").read_text())
    del data["encoder"]["ctc"]
    (plain / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="has no CTC head"), decoding_variant(plain, 0.3, True):
        pass


def test_evaluation_can_fuse_an_lm_the_model_does_not_ship(repo, tmp_path):
    from attnserve.export.common.ngram_build import build
    from attnserve.export.speech.evaluate import decoding_variant

    folder = repo / NAME / "1"
    build([[4, 5, 6]], 32, order=3, start_id=3, eos_id=2).save(tmp_path / "lm.npz")
    with decoding_variant(folder, None, True, tmp_path / "lm.npz", 0.2) as variant:
        fused = load_manifest(variant / "manifest.json")
        assert fused.language_model.weight == 0.2
        assert (variant / fused.language_model.file).resolve() == (tmp_path / "lm.npz").resolve()
    assert load_manifest(folder / "manifest.json").language_model is None
    with pytest.raises(ValueError, match="has no language model"), decoding_variant(folder, None, True, None, 0.2):
        pass


def test_the_card_says_whether_the_previous_version_was_scored_on_the_same_clips():
    from attnserve.export.speech.model_card import comparison_lines

    split = {"clips": 900, "hours": 0.72, "cer": 0.3, "wer": 0.6}
    now = {"splits": {"test_seen": split}}
    same = {"model": "models/speech-en/2", "beam_size": 1, "splits": {"test_seen": {**split, "cer": 0.4}}}
    other = {**same, "splits": {"test_seen": {**split, "clips": 880}}}
    assert "on the same test clips" in comparison_lines(now, same)[1]
    assert "its own corpus build's test clips" in comparison_lines(now, other)[1]
    assert comparison_lines(now, same)[-1] == "| test_seen | 40.0% | 30.0% | 60.0% | 60.0% |"


def test_noise_mixed_in_for_evaluation_has_the_asked_snr_and_is_the_same_every_run():
    from attnserve.export.speech.evaluate import noisy
    from fakes import wav_bytes

    rate = 16000
    clean = 0.3 * np.sin(2 * np.pi * 220 * np.arange(rate) / rate)
    wav = wav_bytes(clean, rate, "float32")
    for snr_db in (20.0, 5.0):
        mixed = noisy(wav, snr_db, seed=7)
        assert mixed.sample_rate_hz == rate and mixed.samples.dtype == np.float32
        noise = mixed.samples.astype(np.float64) - clean
        measured = 10 * np.log10(np.mean(clean**2) / np.mean(noise**2))
        assert abs(measured - snr_db) < 0.2
        np.testing.assert_array_equal(mixed.samples, noisy(wav, snr_db, seed=7).samples)
        assert not np.array_equal(mixed.samples, noisy(wav, snr_db, seed=8).samples)
