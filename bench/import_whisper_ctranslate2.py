"""An imported whisper-tiny-sized checkpoint served by attnserve against CTranslate2's Whisper converting the
same checkpoint: a ratio measured side by side, in one run.

    .venv/bin/pip install -e '.[cpu,export,bench]'
    .venv/bin/python bench/import_whisper_ctranslate2.py --work /work/data/whisper-bench [--clips 16 --max-new 24]
    .venv/bin/python bench/import_whisper_ctranslate2.py --work /work/data/whisper-base-bench --size base \
        --out bench/results/import_whisper_base_ctranslate2.json

The checkpoint has openai/whisper-tiny's published config.json, generation_config.json and
preprocessor_config.json and real sizes (d_model 384, 4+4 layers, 6 heads, FFN 1536, 51,865 tokens, the 30 s
window) with random weights (tests/tiny_whisper.py `real_sizes`: no hub access here). It is imported with
`attnserve import` and converted with CTranslate2's own `TransformersConverter` (float32). Then, greedy, English
transcription prompt, one intra-op thread on both sides, every clip capped at --max-new tokens after the prompt:
- attnserve: the engine in this process, every clip submitted at once as raw 16 kHz samples (so the server's
  own log-mel, the encoder, the batched decode, every layer's cross-attention kept and the DTW word
  timestamps are all in its time);
- CTranslate2: `Whisper.generate` on the whole batch of precomputed log-mel features (the features' time is
  not in its figure: CTranslate2 computes none), in a child process of its own so its peak RSS is its own;
- outputs compared token by token; throughput as clips/s and generated tokens/s; the ratio attnserve /
  CTranslate2; peak RSS and load times.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))  # tiny_whisper.py

from import_setup import import_and_convert, peak_rss_mb  # bench/, beside this script

NAME = "whisper-tiny-random"
PROMPT = 3  # <|en|> <|transcribe|> <|notimestamps|> after <|startoftranscript|>


def prepare(work: pathlib.Path, size: str = "tiny") -> tuple[pathlib.Path, pathlib.Path, pathlib.Path, dict]:
    """Builds, imports and converts the checkpoint once (kept under --work); returns the folders and times."""
    import tiny_whisper

    return import_and_convert(work, NAME, lambda checkpoint: tiny_whisper.build(
        checkpoint, real_sizes=True if size == "tiny" else size))


def attnserve_run(repo: pathlib.Path, clips, max_new: int) -> dict:
    from attnserve.server.engine.batcher import BatchingOptions
    from attnserve.server.engine.registry import load_engine
    from attnserve.api.generation import AudioInput, DecodingOptions, GenerationRequest
    from attnserve.server.model.repository import find_models
    from attnserve.server.model.runtime import RuntimeOptions

    started = time.perf_counter()
    engine = load_engine(find_models(repo)[NAME], RuntimeOptions(), BatchingOptions())
    load_s = time.perf_counter() - started
    try:
        requests = [GenerationRequest(NAME, "", "en", DecodingOptions(max_new + PROMPT, 1),
                                      audio=AudioInput(samples=c.tolist(), sample_rate_hz=16000)) for c in clips]
        started = time.perf_counter()
        results = [f.result(3600) for f in [engine.submit(r) for r in requests]]
        seconds = time.perf_counter() - started
    finally:
        engine.close()
    tokens = [[t.id for t in r.tokens[PROMPT:]] for r in results]
    return {"load_s": load_s, "seconds": seconds, "tokens": tokens, "words": sum(len(r.words) for r in results),
            "peak_rss_mb": peak_rss_mb()}


CT2_CHILD = """
import json, pathlib, sys, time
import numpy as np
import ctranslate2
folder, features_path, prompt, max_new = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
from import_setup import peak_rss_mb
started = time.perf_counter()
model = ctranslate2.models.Whisper(folder, device="cpu", compute_type="float32", intra_threads=1, inter_threads=1)
load_s = time.perf_counter() - started
features = ctranslate2.StorageView.from_array(np.load(features_path))
started = time.perf_counter()
# CTranslate2 4.8.5 stops this model at max_length / 2 new tokens (measured: 12 -> 6, 20 -> 10, 32 -> 16,
# 60 -> 30), so 2 x max_new gives max_new steps, as many as attnserve decodes after the prompt; the
# bench reports CTranslate2's own lengths to show it.
results = model.generate(features, [prompt] * features.shape[0], beam_size=1, max_length=2 * max_new)
seconds = time.perf_counter() - started
tokens = [r.sequences_ids[0][:max_new] for r in results]
print(json.dumps({"load_s": load_s, "seconds": seconds, "tokens": tokens, "peak_rss_mb": peak_rss_mb(),
                  "lengths": sorted({len(r.sequences_ids[0]) for r in results})}))
"""


def ctranslate2_run(ct2: pathlib.Path, repo: pathlib.Path, clips, prompt: list[int], max_new: int, work: pathlib.Path) -> dict:
    import numpy as np

    from attnserve.server.inputs.features import log_mel
    from attnserve.server.model.manifest import load_manifest

    spec = load_manifest(repo / NAME / "1" / "manifest.json").input.features
    features = np.stack([log_mel(c, spec).T for c in clips])  # (B, n_mels, 3000) as WhisperFeatureExtractor
    np.save(work / "features.npy", features)
    out = subprocess.run([sys.executable, "-c", CT2_CHILD, str(ct2), str(work / "features.npy"), json.dumps(prompt),
                          str(max_new), str(pathlib.Path(__file__).parent)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def attnserve_side(repo: pathlib.Path, args) -> dict:
    """attnserve_run in a child process without torch or transformers, so its peak RSS is the server's."""
    out = subprocess.run([sys.executable, __file__, "--work", str(args.work), "--clips", str(args.clips),
                          "--max-new", str(args.max_new), "--attnserve-only"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=pathlib.Path, required=True, help="folder for the checkpoint and conversions")
    parser.add_argument("--clips", type=int, default=16)
    parser.add_argument("--max-new", type=int, default=24, help="tokens after the prompt, both sides")
    parser.add_argument("--size", choices=("tiny", "base"), default="tiny",
                        help="whisper-tiny's or whisper-base's published sizes (use one --work folder per size)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/import_whisper_ctranslate2.json"))
    parser.add_argument("--attnserve-only", action="store_true", help=argparse.SUPPRESS)  # the child side
    args = parser.parse_args()
    import tiny_whisper

    if args.attnserve_only:
        for name in ("torch", "transformers"):
            sys.modules[name] = None  # the serving side never needs them
        print(json.dumps(attnserve_run(args.work / "repository", tiny_whisper.clips(args.clips, seed=11), args.max_new)))
        return

    args.work.mkdir(parents=True, exist_ok=True)
    _, repo, ct2, times = prepare(args.work, args.size)
    manifest = json.loads((repo / NAME / "1" / "manifest.json").read_text())
    prompt = [manifest["decoder_start"]["en"], *manifest["decoder_prompt"]["en"]]
    clips = tiny_whisper.clips(args.clips, seed=11)
    ours = attnserve_side(repo, args)
    theirs = ctranslate2_run(ct2, repo, clips, prompt, args.max_new, args.work)
    # CTranslate2 returns the sequence after the prompt, without EOS.
    equal = sum(a == b for a, b in zip(ours["tokens"], theirs["tokens"]))
    generated = sum(len(t) for t in ours["tokens"])
    report = {
        "size": args.size, "clips": args.clips, "max_new_tokens": args.max_new, "outputs_identical": f"{equal}/{args.clips}",
        "generated_tokens": generated,
        "attnserve": {"seconds": ours["seconds"], "clips_per_s": args.clips / ours["seconds"],
                      "tokens_per_s": generated / ours["seconds"], "load_s": ours["load_s"], "words_timed": ours["words"],
                      "peak_rss_mb": ours["peak_rss_mb"]},
        "ctranslate2": {"seconds": theirs["seconds"], "clips_per_s": args.clips / theirs["seconds"],
                        "tokens_per_s": sum(len(t) for t in theirs["tokens"]) / theirs["seconds"],
                        "load_s": theirs["load_s"], "peak_rss_mb": theirs["peak_rss_mb"],
                        "own_output_lengths": theirs["lengths"]},
        "ratio_attnserve_over_ctranslate2": theirs["seconds"] / ours["seconds"],
        **times,
    }
    if equal < args.clips:
        report["first_difference"] = next({"attnserve": a, "ctranslate2": b} for a, b in zip(ours["tokens"], theirs["tokens"]) if a != b)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
