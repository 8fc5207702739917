"""`attnserve import` of a Whisper checkpoint: the served speech model computes what transformers computes.

The checkpoint (tests/tiny_whisper.py) has openai/whisper-tiny's published configs with tiny sizes, a
byte-level BPE tokenizer trained here with Whisper's special tokens, and widened random weights. Decisive
comparisons: the server's log-mel features == WhisperFeatureExtractor's; the graphs' log-probabilities and
every layer's and head's cross-attention == the eager model's at every step; served greedy and beam
outputs == `generate(language=..., task="transcribe")` token for token (padded batch, requests joining a
running batch), with the prompt forced, suppress_tokens and begin_suppress_tokens applied, and the
language detected when the request names none; word timestamps from the alignment heads == generate's
`return_token_timestamps`; tokenizer decode == WhisperTokenizer; refusals by name.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

import tiny_whisper
from import_parity import imported, serving, step_differences
from attnserve.clients import cli
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import AttentionOptions, AudioInput, DecodingOptions, GenerationRequest
from attnserve.server.inputs.features import log_mel
from attnserve.server.model.manifest import load_manifest
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

NAME = "whisper-tiny"
ATOL = 5e-5
MAX_NEW = 20  # generated after the prompt
PROMPT = 3  # <|lang|> <|transcribe|> <|notimestamps|>, forced outputs of the served model
CLIPS = tiny_whisper.clips(8, seed=3)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.set_num_threads(1)
    return tiny_whisper.build(tmp_path_factory.mktemp("whisper") / "whisper-tiny")


@pytest.fixture(scope="module")
def repo(checkpoint, tmp_path_factory):
    return imported(checkpoint, tmp_path_factory.mktemp("imported"), NAME)


@pytest.fixture(scope="module")
def hf(checkpoint):
    return tiny_whisper.transformers_model(checkpoint)


@pytest.fixture(scope="module")
def engine(repo):
    yield from serving(repo, NAME)


def features_of(clips) -> "torch.Tensor":
    fe = tiny_whisper.feature_extractor()
    return torch.from_numpy(fe(clips, sampling_rate=16000, return_tensors="np").input_features)


def generate(hf, clips, language="en", task="transcribe", **options):
    with torch.no_grad():
        return hf.generate(features_of(clips), language=language, task=task, max_new_tokens=MAX_NEW,
                           return_dict_in_generate=True, **options)


def tokens_of(row, eos) -> list[int]:
    """generate's output after <|startoftranscript|> (the prompt included), up to EOS or the limit."""
    ids = row[1:].tolist()
    return ids[: ids.index(eos)] if eos in ids else ids


def request(clip, language="en", beam=1, **attention) -> GenerationRequest:
    return GenerationRequest(NAME, "", language, DecodingOptions(MAX_NEW + PROMPT, beam),
                             AttentionOptions(True, **attention) if attention else AttentionOptions(),
                             audio=AudioInput(samples=clip.tolist(), sample_rate_hz=16000))


def test_features_equal_whisper_feature_extractor(repo):
    spec = load_manifest(repo / NAME / "1" / "manifest.json").input.features
    want = features_of(CLIPS[:3]).numpy()  # (B, 80, 3000)
    worst = max(float(np.abs(log_mel(c, spec).T - w).max()) for c, w in zip(CLIPS, want))
    print(f"log-mel vs WhisperFeatureExtractor: max |diff| {worst:.2e}")
    assert worst < 1e-4


@pytest.fixture(scope="module")
def eos(checkpoint):
    return json.loads((checkpoint / "config.json").read_text())["eos_token_id"]


@pytest.fixture(scope="module")
def greedy(hf):
    """generate's greedy output on CLIPS (with its processed scores) and the eager forward over it."""
    out = generate(hf, CLIPS, output_scores=True)
    with torch.no_grad():
        forward = hf(input_features=features_of(CLIPS), decoder_input_ids=out.sequences, output_attentions=True)
    return out, forward


def test_graphs_equal_the_eager_model_at_every_step_layer_and_head(repo, greedy):
    out, forward = greedy
    frames = features_of(CLIPS[:4]).transpose(1, 2).numpy()  # (B, T, M) as the server feeds them
    mask = np.ones(frames.shape[:2], np.int64)
    sequences = out.sequences[:4].numpy()
    worst_lp, worst_attention = step_differences(
        repo / NAME / "1", {"input_features": frames, "attention_mask": mask}, sequences,
        torch.log_softmax(forward.logits[:4], -1).numpy(), torch.stack(forward.cross_attentions, 1)[:4].numpy())
    print(f"Whisper graphs vs eager: max |log-prob diff| {worst_lp:.2e}, max |attention diff| {worst_attention:.2e}")
    assert worst_lp < ATOL and worst_attention < ATOL


def test_the_widened_random_weights_attend_peakedly_and_outputs_vary(greedy, eos):
    out, forward = greedy
    weights = torch.stack(forward.cross_attentions)  # (L, B, H, T, 1500)
    assert weights.max(-1).values.mean() > 0.2 > 100 / weights.shape[-1]
    lengths = [len(tokens_of(row, eos)) for row in out.sequences]
    assert min(lengths) < MAX_NEW + PROMPT and max(lengths) == MAX_NEW + PROMPT
    assert len({tuple(tokens_of(r, eos)) for r in out.sequences}) > len(CLIPS) // 2


def test_served_greedy_equals_generate_with_the_prompt_forced(engine, greedy, eos):
    out, forward = greedy
    # generate's scores are after suppress_tokens / begin_suppress_tokens, as the server's distribution.
    want_lp = torch.stack([torch.log_softmax(s, -1) for s in out.scores], 1)  # (B, steps, V)
    results = [f.result(120) for f in [engine.submit(request(c, layer=1)) for c in CLIPS]]
    assert max(r.timings.batch_size for r in results) > 1
    worst_lp = 0.0
    for row, lp, attention, result in zip(out.sequences, want_lp, forward.cross_attentions[1], results):
        assert [t.id for t in result.tokens] == tokens_of(row, eos)
        assert result.target_language == "en"
        assert all(t.logprob == 0 for t in result.tokens[:PROMPT])  # forced
        worst_lp = max([worst_lp, *(abs(t.logprob - float(lp[k, t.id])) for k, t in enumerate(result.tokens[PROMPT:]))])
        rows = np.asarray(result.attention.weights)  # (T, 1500): layer 1, mean over heads
        assert np.abs(rows - attention.mean(0)[: len(rows)].numpy()).max() < ATOL
    print(f"Whisper served log-probs vs generate's scores: max |diff| {worst_lp:.2e}")
    assert worst_lp < ATOL


def test_served_beam_equals_generate_and_joining_requests_agree(engine, hf, greedy, eos):
    out = generate(hf, CLIPS[:6], num_beams=3)
    results = [f.result(120) for f in [engine.submit(request(c, beam=3)) for c in CLIPS[:6]]]
    assert [[t.id for t in r.tokens] for r in results] == [tokens_of(row, eos) for row in out.sequences]
    first = engine.submit(request(CLIPS[0]))
    joined = [engine.submit(request(c)) for c in CLIPS[1:5]]  # while the first decodes
    got = [[t.id for t in f.result(120).tokens] for f in [first, *joined]]
    assert got == [tokens_of(row, eos) for row in greedy[0].sequences[:5]]


def test_language_is_detected_when_the_request_names_none(engine, hf, checkpoint, eos):
    out = generate(hf, CLIPS[:4], language=None)  # transformers detects it: one step, argmax over languages
    results = [f.result(120) for f in [engine.submit(request(c, language="")) for c in CLIPS[:4]]]
    lang_to_id = json.loads((checkpoint / "generation_config.json").read_text())["lang_to_id"]
    for row, result in zip(out.sequences, results):
        assert [t.id for t in result.tokens] == tokens_of(row, eos)
        assert lang_to_id[f"<|{result.target_language}|>"] == result.tokens[0].id


def test_word_timestamps_equal_generates_token_timestamps(engine, hf, eos):
    """DTW over the alignment heads, as `generate(return_token_timestamps=True)` (each clip alone: in a
    batch transformers also normalises over the rows of sequences that already ended)."""
    fe = tiny_whisper.feature_extractor()
    timed, worst = 0, 0.0
    for clip in CLIPS[:5]:
        inputs = fe([clip], sampling_rate=16000, return_tensors="pt", return_attention_mask=True)
        with torch.no_grad():
            out = hf.generate(inputs.input_features, attention_mask=inputs.attention_mask, language="en",
                              task="transcribe", max_new_tokens=MAX_NEW, return_dict_in_generate=True,
                              return_token_timestamps=True)
        stamps = out["token_timestamps"][0].tolist()  # one per token of sequences (the prompt's are 0)
        sequences = out["sequences"]
        result = engine.submit(request(clip)).result(120)
        assert [t.id for t in result.tokens] == tokens_of(sequences[0], eos)
        text = result.tokens[PROMPT:]
        firsts = [k for k, t in enumerate(text) if k == 0 or t.piece.startswith("Ġ")]
        timed_tokens = len(text) - (result.finish_reason.name != "EOS")  # the last has no row without EOS
        want = [stamps[1 + PROMPT + k] for k in firsts if k < timed_tokens]
        got = [w.start_seconds for w in result.words]
        assert len(got) == len(want) and np.abs(np.array(got) - want).max() <= 0.02 + 1e-6  # one frame
        worst = max(worst, float(np.abs(np.array(got) - want).max()))
        assert all(w.start_seconds < w.end_seconds for w in result.words)
        timed += len(got)
    print(f"Whisper word starts vs return_token_timestamps: {timed} words, max |diff| {worst:.3f} s")
    assert timed >= 5


def test_tokenizer_decodes_as_whisper_tokenizer(repo, checkpoint):
    from attnserve.server.model.tokenization import Tokenizer

    ours = Tokenizer.from_manifest(repo / NAME / "1", load_manifest(repo / NAME / "1" / "manifest.json"))
    theirs = tiny_whisper.transformers_tokenizer(checkpoint)
    rng = np.random.default_rng(0)
    first_timestamp = theirs.convert_tokens_to_ids("<|0.00|>")
    # <|startofprev|> makes WhisperTokenizer drop the text before <|startoftranscript|> (a prompt of previous
    # text); it is in suppress_tokens and never fed, so the server never outputs it.
    prev = theirs.convert_tokens_to_ids("<|startofprev|>")
    equal = 0
    for _ in range(1000):  # text pieces with special and language tokens among them
        ids = [i for i in rng.integers(0, first_timestamp, rng.integers(1, 12)).tolist() if i != prev] or [0]
        stamps = rng.integers(first_timestamp, len(theirs), 2).tolist()  # timestamps around the text
        equal += ours.decode([stamps[0], *ids, stamps[1]]) == theirs.decode(ids, skip_special_tokens=True).strip(" ")
    print(f"Whisper tokenizer decode == WhisperTokenizer: {equal}/1000")
    assert equal == 1000
    words = ours.words(theirs.encode(" Hello big world", add_special_tokens=False))
    assert words.labels == ("Hello", "big", "world")


def test_graph_batch_axes_stay_dynamic(repo):
    import onnx

    for name in ("encoder.onnx", "decoder.onnx"):
        graph = onnx.load(str(repo / NAME / "1" / name)).graph
        for value in [*graph.input, *graph.output]:
            assert value.type.tensor_type.shape.dim[0].dim_param == "batch", (name, value.name)


def test_refusals_name_the_problem_and_leave_nothing(checkpoint, tmp_path):
    from attnserve.export.importers.command import import_checkpoint

    cases = [("config.json", "rope_theta", 10000.0, "rope_theta"),
             ("config.json", "scale_embedding", True, "scale_embedding"),
             ("generation_config.json", "return_timestamps", True, "return_timestamps"),
             ("preprocessor_config.json", "dither", 1.0, "dither"),
             ("preprocessor_config.json", "feature_size", 128, "num_mel_bins")]
    for file, key, value, named in cases:
        bad = tmp_path / f"bad-{key}"
        shutil.copytree(checkpoint, bad)
        data = json.loads((bad / file).read_text())
        data[key] = value
        (bad / file).write_text(json.dumps(data))
        with pytest.raises(ValueError, match=named):
            import_checkpoint(bad, tmp_path / "repo", "x")
        assert not (tmp_path / "repo" / "x" / "1").exists()
    (bad / "preprocessor_config.json").unlink()
    with pytest.raises(ValueError, match="preprocessor_config.json"):
        import_checkpoint(bad, tmp_path / "repo", "x")


def test_the_imported_model_serves_without_torch_or_transformers(repo, engine):
    import subprocess
    import sys

    clip = CLIPS[1]
    script = f"""
import sys
import numpy as np
for name in ("torch", "transformers", "onnx"):
    sys.modules[name] = None  # importing any of them now raises ImportError
sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
import tiny_whisper
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.api.generation import AudioInput, DecodingOptions, GenerationRequest
from attnserve.server.engine.registry import load_engine
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
engine = load_engine(find_models({str(repo)!r})[{NAME!r}], RuntimeOptions(), BatchingOptions())
clip = tiny_whisper.clips(8, seed=3)[1]
result = engine.generate(GenerationRequest({NAME!r}, "", "en", DecodingOptions({MAX_NEW + PROMPT}, 1),
                                           audio=AudioInput(samples=clip.tolist(), sample_rate_hz=16000)))
engine.close()
print(" ".join(str(t.id) for t in result.tokens))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(t.id) for t in engine.generate(request(clip)).tokens]


def test_audio_over_the_30_s_window_is_transcribed_in_segments(engine):
    """36 s: two segments, cut at a pause, their words' times shifted by the segments' starts."""
    from attnserve.server.engine.longform import LongFormEngine, LongFormOptions

    assert engine.info.audio.max_seconds == 30.0  # the window long-form cuts at
    pause = np.zeros(16000, np.float32)
    parts = [np.concatenate([c, pause]) for c in tiny_whisper.clips(12, seed=5)]
    recording = np.concatenate(parts)[: 16000 * 36]
    longform = LongFormEngine(engine, LongFormOptions(vad_aggressiveness=None))
    result = longform.generate(GenerationRequest(NAME, "", "en", DecodingOptions(MAX_NEW + PROMPT, 1),
                                                 audio=AudioInput(samples=recording.tolist(), sample_rate_hz=16000)),
                               timeout=300)
    assert len(recording) / 16000 > 30 and result.tokens
    starts = [w.start_seconds for w in result.words]
    assert starts == sorted(starts) and starts[-1] > 10  # the later segment's words shifted by its start


def test_speech_translation_equals_generate_task_translate(engine, hf, eos):
    """source_language de, target en: Whisper's task=translate prompt, `<|de|> <|translate|> <|notimestamps|>`."""
    out = generate(hf, CLIPS[:4], language="de", task="translate")
    results = [f.result(120) for f in [engine.submit(dataclasses.replace(request(c), source_language="de"))
                                       for c in CLIPS[:4]]]
    for row, result in zip(out.sequences, results):
        assert [t.id for t in result.tokens] == tokens_of(row, eos)
        assert result.target_language == "en"


def test_dtw_and_median_filter_equal_transformers_on_random_matrices():
    from transformers.models.whisper.generation_whisper import _dynamic_time_warping, _median_filter

    from attnserve.server.attention.alignment import dtw, median_filter

    rng = np.random.default_rng(4)
    for rows, cols in [(1, 5), (3, 3), (7, 40), (12, 150), (30, 9)]:
        matrix = rng.standard_normal((rows, cols))
        matrix[:, rng.integers(0, cols, 2)] = 0.5  # ties: the tie rules must agree too
        want = _dynamic_time_warping(matrix.copy())
        got = dtw(matrix)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (rows, cols)
        x = rng.standard_normal((2, rows, cols)).astype(np.float32)
        assert np.array_equal(median_filter(x, 7), _median_filter(torch.from_numpy(x), 7).numpy())


def test_a_large_v3_checkpoint_with_128_mels_and_100_languages_serves_as_generate(tmp_path):
    """openai/whisper-large-v3's configs (tests/fixtures/hf/whisper-large-v3) at the tiny sizes: 128-mel
    features == WhisperFeatureExtractor(feature_size=128), the <|yue|>-shifted prompt ids, served greedy ==
    generate with the language detected among 100, on a padded batch."""
    checkpoint = tiny_whisper.build(tmp_path / "v3", seed=1, fixture="whisper-large-v3")
    assert cli.main(["import", str(checkpoint), "--name", "v3", "--repository", str(tmp_path / "repo")]) == 0
    manifest = load_manifest(tmp_path / "repo" / "v3" / "1" / "manifest.json")
    assert manifest.input.features.n_mels == 128 and len(manifest.decoder_prompt) == 100
    clips, fe = CLIPS[:2], tiny_whisper.feature_extractor("whisper-large-v3")
    features = torch.from_numpy(fe(clips, sampling_rate=16000, return_tensors="np").input_features)  # (B, 128, 3000)
    assert max(float(np.abs(log_mel(c, manifest.input.features).T - f.numpy()).max()) for c, f in zip(clips, features)) < 1e-4
    hf = tiny_whisper.transformers_model(checkpoint)
    eos = json.loads((checkpoint / "config.json").read_text())["eos_token_id"]
    engine = load_engine(find_models(tmp_path / "repo")["v3"], RuntimeOptions(), BatchingOptions())
    try:
        with torch.no_grad():  # the language detected among 100, then its prompt
            out = hf.generate(features, task="transcribe", max_new_tokens=MAX_NEW, return_dict_in_generate=True)
        futures = [engine.submit(dataclasses.replace(request(c, language=""), model="v3")) for c in clips]
        assert [[t.id for t in f.result(120).tokens] for f in futures] == [tokens_of(r, eos) for r in out.sequences]
    finally:
        engine.close()


def test_the_spoken_language_crosses_the_wire_for_speech_translation():
    from attnserve.api import convert

    sent = dataclasses.replace(request(CLIPS[0][:1600]), source_language="de")
    assert convert.request_from_proto(convert.request_to_proto(sent)).source_language == "de"
    assert not convert.request_to_proto(request(CLIPS[0][:1600])).audio.HasField("source_language")


@pytest.mark.parametrize("variant", ["int8", "fp16"])
def test_lower_precision_variants_serve_and_their_agreement_with_float32_is_reported(repo, engine, variant, tmp_path):
    from attnserve.export.common.quantize import quantize_folder

    shutil.copytree(repo / NAME, tmp_path / NAME)
    quantize_folder(tmp_path / NAME / "1", variant)
    other = load_engine(find_models(tmp_path)[NAME], RuntimeOptions(variant=variant), BatchingOptions())
    try:
        assert other.info.variant == variant
        fp32 = [[t.id for t in f.result(120).tokens] for f in [engine.submit(request(c)) for c in CLIPS]]
        low = [[t.id for t in f.result(120).tokens] for f in [other.submit(request(c)) for c in CLIPS]]
    finally:
        other.close()
    same = sum(a == b for a, b in zip(fp32, low))
    prefix = sum(len(a[PROMPT:]) and a[PROMPT] == b[PROMPT] for a, b in zip(fp32, low))
    print(f"Whisper {variant}: outputs equal to float32 on {same}/{len(CLIPS)} clips, first word on {prefix}")
    assert all(a[:PROMPT] == b[:PROMPT] for a, b in zip(fp32, low))  # the forced prompt
    assert same >= {"int8": 0.25, "fp16": 0.75}[variant] * len(CLIPS)


def test_streamed_tokens_equal_the_unary_result(engine):
    streamed = []
    result = engine.submit(request(CLIPS[2]), on_token=streamed.append).result(120)
    assert [s.token.id for s in streamed] == [t.id for t in result.tokens]
    assert "".join(s.text for s in streamed).strip() == result.text


def test_transcribe_over_grpc_translates_detects_and_times_words(repo, engine, tmp_path, capsys):
    import wave

    from attnserve.server.edge import app

    pcm = np.clip(CLIPS[3] * 32768, -32768, 32767).astype("<i2")
    path = tmp_path / "clip.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000), w.writeframes(pcm.tobytes())
    samples = (pcm.astype(np.float32) / 32768).tolist()
    engines = app.load_engines(app.ServeOptions(models=str(repo)))
    outputs = []
    try:
        with app.BackgroundServer(engines) as background:
            for flags in (["--from", "de", "--to", "en"], []):
                status = cli.main(["transcribe", str(path), "--model", NAME, "--json", "--address", background.address,
                                   *flags])
                assert status in (0, None)
                outputs.append(json.loads(capsys.readouterr().out))
    finally:
        for e in engines.values():
            e.close()
    for out, (source, target) in zip(outputs, [("de", "en"), ("", "")]):
        want = engine.generate(GenerationRequest(NAME, "", target, DecodingOptions(0, 1), source_language=source,
                                                 audio=AudioInput(samples=samples, sample_rate_hz=16000)))
        assert [t["id"] for t in out["tokens"]] == [t.id for t in want.tokens]
        assert out["target_language"] == want.target_language and out["words"]


def test_the_page_transcribes_an_upload_as_grpc_does(repo):
    """The web page's endpoint (a WAV upload, words with their attention) on the imported model == gRPC."""
    pytest.importorskip("aiohttp")
    import urllib.request

    import gateway_thread
    from attnserve.clients.client import audio_request
    from fakes import wav_bytes

    data = wav_bytes(CLIPS[1], 16000)
    with gateway_thread.demo(repo) as (url, client):
        upload = urllib.request.Request(f"{url}/api/generate?model={NAME}", data=data,
                                        headers={"Content-Type": "audio/wav"})
        with urllib.request.urlopen(upload, timeout=120) as response:
            page = json.loads(response.read())
        want = client.generate(audio_request(data, model=NAME, attention=True, granularity="words"))
    assert page["text"] == want.text and page["target_language"] == want.target_language
    assert [w["word"] for w in page["words"]] == [w.word for w in want.words] and want.words
    assert [w["start_seconds"] for w in page["words"]] == pytest.approx([w.start_seconds for w in want.words])
    # The page draws words against a time axis over the 30 s window.
    assert page["columns"]["kind"] == "time" and len(page["attention"]["weights"]) == len(want.attention.weights)


def test_hotwords_are_matched_in_the_byte_level_spelling(engine):
    """A hotword the random-weight model never writes is written once boosted, "é" and all: the bias finds
    its pieces (Ġ-marked, bytes spelled in GPT-2's alphabet) in Whisper's vocabulary."""
    plain = engine.generate(request(CLIPS[0]), 120)
    boosted = dataclasses.replace(request(CLIPS[0]).decoding, hotwords=("café",), hotword_boost=10.0)
    helped = engine.generate(dataclasses.replace(request(CLIPS[0]), decoding=boosted), 120)
    assert "café" not in plain.text and "café" in helped.text


def test_the_byte_alphabet_is_byte_level_bpes():
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from attnserve.server.decoding.hotwords import BYTE_ALPHABET, Vocabulary

    assert list(BYTE_ALPHABET) == [bytes_to_unicode()[b] for b in range(256)]
    spelled = Vocabulary((), frozenset(), "Ġ").spell
    for word in ("café", "naïve", "東京", "it's"):  # the pre-tokenizer splits "it's" too; the bytes are the same
        assert spelled(word) == "".join(p for p, _ in ByteLevel(add_prefix_space=False).pre_tokenize_str(word))
