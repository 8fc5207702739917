"""The decoding engine's benchmark in one command: every measurement, the targets met or missed, and a plot.

    .venv/bin/pip install -e '.[cpu,export,dev,bench]'
    .venv/bin/python bench/report.py --out bench/results                 # ~15 minutes on 2 cores
    .venv/bin/python bench/report.py --out /tmp/quick --quick            # ~4 minutes, for trying it out

It runs, one after the other on the bundled translator and the same test-split sentences (one intra-op thread
everywhere; each benchmark alternates what it compares internally, so a slow spell hits all sides):
1. bench/concurrency.py: attnserve over gRPC at 1, 8, 32 and 64 streaming clients, batching on and off, and
   batched with the engine in a child process (--engine-process); every server again with unary clients
   (--unary) and with streaming clients taking 4 tokens a message (--stream-interval 4); one request at a time
   in process, unary and streamed;
2. bench/ctranslate2_compare.py: CTranslate2 on the same weights (float32 and int8), attnserve float32 and its
   int8 variant (quantized into a temporary copy of the model), PyTorch eager with and without its cache,
   batch 1 and 32;
3. bench/step_positions.py: the decoder step at positions 10, 100 and 200, batch 1 and 32;
4. bench/engine_time.py: where an in-process engine's time goes under 32 clients (the largest gap's profile);
5. bench/length_split.py: the same sentences submitted at once with long sources decoding apart and without,
   float32 and int8.
Each writes its JSON into --out; this script adds `results.json` (all of them and the targets), `report.md`
(the tables) and `throughput.png` (tokens/s by clients, with CTranslate2's batch-32 rates as lines).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

import length_split  # bench/, beside this script

BENCH = pathlib.Path(__file__).resolve().parent


def run(script: str, *arguments: str) -> None:
    command = [sys.executable, str(BENCH / script), *arguments]
    print("+", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def int8_copy(models: pathlib.Path, model: str, into: pathlib.Path) -> pathlib.Path:
    """A repository holding the newest version of `model` with its int8 variant."""
    from attnserve.server.model.repository import find_models

    version = find_models(models, only=[model])[model]
    target = into / model / str(version.version)
    shutil.copytree(version.path, target)
    subprocess.run([sys.executable, "-m", "attnserve.export.common.quantize", "--model-dir", str(target)], check=True,
                   stdout=subprocess.DEVNULL)
    return into


# The streaming clients' GenerateRequest.stream_interval in the report's extra streaming run.
STREAM_INTERVAL = 4


def served_targets(prefix: str, report: dict, levels: dict, server: str, ctranslate2: float,
                   rss: tuple[str, float]):
    """The targets of one served configuration (`report`: concurrency.py's report, or its `process` part;
    `levels`: every server's levels, `server`: this one's name there)."""
    rows = [(f"{prefix}served tokens/s at 32 streaming clients >= CTranslate2 float32 at batch 32",
             levels[server]["32"]["tokens_per_s"], ctranslate2, ">=")]
    if f"{server}/unary" in levels:  # the same, clients calling Generate: one message per request, not per token
        rows.append((f"{prefix}served tokens/s at 32 unary clients (Generate) >= CTranslate2 float32 at batch 32",
                     levels[f"{server}/unary"]["32"]["tokens_per_s"], ctranslate2, ">="))
    interval = f"{server}/interval {STREAM_INTERVAL}"
    if interval in levels:  # streaming clients that take their tokens STREAM_INTERVAL at a time after the first
        rows.append((f"{prefix}served tokens/s at 32 streaming clients with stream_interval {STREAM_INTERVAL} "
                     ">= CTranslate2 float32 at batch 32", levels[interval]["32"]["tokens_per_s"], ctranslate2, ">="))
    rows.append((f"{prefix}batching gain at 32 streaming clients >= 5x", report["batching_gain"]["32"], 5.0, ">="))
    if "batching_gain_unary" in report:  # unary clients on both sides: the engine's batching without the messages
        rows.append((f"{prefix}batching gain at 32 unary clients >= 5x", report["batching_gain_unary"]["32"], 5.0,
                     ">="))
    return rows + [
        (f"{prefix}1 client, unary gRPC / in process <= 1.15", report["grpc_over_in_process"], 1.15, "<="),
        (f"{prefix}1 client, streamed gRPC / in process <= 1.15", report["grpc_stream_over_in_process"], 1.15, "<="),
        (f"{prefix}serving RSS <= 400 MB ({rss[0]})", rss[1], 400.0, "<="),
    ]


def targets(results: dict) -> list[dict]:
    """The issue's targets, each with what was measured and whether it was met."""
    concurrency, same = results["concurrency"], results["same_weights"]["tokens_per_s"]
    levels, rss = concurrency["levels"], concurrency["server_peak_rss_mb"]
    ctranslate2 = same["ctranslate2 float32 batch_32"]
    steps = {r["batch"]: r["ratio_200_to_10"] for r in results["step_positions"]}
    rows = served_targets("", concurrency, levels, "batched", ctranslate2, ("peak, batched server", rss["batched"]))
    rows.append(("decoder step at position 200 / 10, batch 32 <= 1.3", steps.get(32), 1.3, "<="))
    if "process" in concurrency:  # the same server with its engine in a child process (--engine-process)
        rows += served_targets("--engine-process: ", concurrency["process"], levels, "process", ctranslate2,
                               ("peaks of server + engine process", rss["process"]))
    if "attnserve int8 batch_32" in same:
        rows.append(("moonshot: attnserve int8 >= CTranslate2 int8, in process at batch 32",
                     same["attnserve int8 batch_32"], same["ctranslate2 int8 batch_32"], ">="))
    return [{"target": name, "measured": round(value, 3), "threshold": round(threshold, 3),
             "met": value >= threshold if sense == ">=" else value <= threshold}
            for name, value, threshold, sense in rows if value is not None]


def markdown(results: dict) -> str:
    lines = ["| target | measured | threshold | met |", "|---|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']:g} | {t['threshold']:g} | {'yes' if t['met'] else 'no'} |"
              for t in results["targets"]]
    lines += ["", "| server | clients | tokens/s | requests/s | p50 / p95 / p99 latency | first token p50 / p95 |",
              "|---|---|---|---|---|---|"]
    for name, levels in results["concurrency"]["levels"].items():
        for clients, r in levels.items():
            lines.append(f"| {name} | {clients} | {r['tokens_per_s']:.0f} | {r['requests_per_s']:.1f} | "
                         f"{r['latency_p50_ms']:.0f} / {r['latency_p95_ms']:.0f} / {r['latency_p99_ms']:.0f} ms | "
                         f"{r['first_token_p50_ms']:.0f} / {r['first_token_p95_ms']:.0f} ms |")
    for name, report in [("batched", results["concurrency"]), ("process", results["concurrency"].get("process"))]:
        if report is not None:
            single = report["single_request_latency_p50_ms"]
            lines += ["", f"One request at a time ({name} server), median latency: " +
                      ", ".join(f"{way.replace('_', ' ')} {ms:.1f} ms" for way, ms in single.items())]
    lines.append("")
    same = results["same_weights"]
    systems = list(dict.fromkeys(key.rsplit(" ", 1)[0] for key in same["tokens_per_s"]))  # in the run's order
    lines += ["| system (same weights, in process) | batch 1 tokens/s | batch 32 tokens/s | vs CTranslate2 float32 "
              "(1 / 32) | outputs identical to attnserve float32 (1 / 32) |", "|---|---|---|---|---|"]
    for name in systems:
        modes = ("batch_1", "batch_32")
        rate = [f"{same['tokens_per_s'][f'{name} {m}']:.0f}" for m in modes]
        ratio = " / ".join(f"{same['speed_vs_ctranslate2_float32'][f'{name} {m}']:.2f}" for m in modes)
        agree = " / ".join(str(same["identical_to_attnserve_float32"][f"{name} {m}"]) for m in modes)
        lines.append(f"| {name} | {rate[0]} | {rate[1]} | {ratio} | {agree} of {same['requests']} |")
    lines += ["", "| batch | step at 10 | at 100 | at 200 | 200 / 10 |", "|---|---|---|---|---|"]
    for r in results["step_positions"]:
        lines.append(f"| {r['batch']} | {r['ms_at_10']:.2f} ms | {r['ms_at_100']:.2f} ms | {r['ms_at_200']:.2f} ms | "
                     f"{r['ratio_200_to_10']:.2f} |")
    engine = results["engine_time"]
    lines += ["", f"Where an in-process engine's time goes under {engine['clients']} clients "
              f"({engine['requests_per_s']} requests/s; newcomers are encoded on a second thread while the "
              "batch steps, so the shares add up to more than 100%):", "",
              "| operation | share of wall time | ms per call |", "|---|---|---|"]
    lines += [f"| `{name}` | {r['share_of_wall']:.1%} | {r['ms_per_call']} |" for name, r in engine["operations"].items()]
    lines += ["", *length_split.table(results["length_split"])]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, levels in results["concurrency"]["levels"].items():
        clients = [int(c) for c in levels]
        axes.plot(clients, [levels[c]["tokens_per_s"] for c in levels], marker="o", label=f"attnserve gRPC, {name}")
    same = results["same_weights"]["tokens_per_s"]
    for key, style, colour in (("ctranslate2 float32 batch_32", "--", "tab:red"),
                               ("ctranslate2 int8 batch_32", ":", "tab:red"),
                               ("attnserve float32 batch_32", "--", "tab:green"),
                               ("attnserve int8 batch_32", ":", "tab:green")):
        if key in same:
            axes.axhline(same[key], linestyle=style, color=colour, label=f"{key.replace('_', ' ')}, in process")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("concurrent clients")
    axes.set_ylabel("generated tokens / s")
    axes.set_title(f"{results['same_weights']['model']}, one intra-op thread")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=pathlib.Path, default=pathlib.Path("models"))
    parser.add_argument("--model", default="translate-zh-en")
    parser.add_argument("--sentences", type=int, default=128, help="test-split sentences, half each direction")
    parser.add_argument("--seconds", type=float, default=10.0, help="per concurrency level and server")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="short levels, one repeat, 32 sentences")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    if args.quick:
        args.sentences, args.seconds, args.repeats = 32, 3.0, 1
    args.out.mkdir(parents=True, exist_ok=True)
    common = ["--models", str(args.models), "--model", args.model]
    sentences = ["--sentences", str(args.sentences)]
    run("concurrency.py", *common, *sentences, "--clients", "1", "8", "32", "64", "--seconds", str(args.seconds),
        "--paired-requests", str(min(200, args.sentences)), "--engine-process", "--unary",
        "--stream-interval", str(STREAM_INTERVAL),
        "--out", str(args.out / "concurrency.json"))
    with tempfile.TemporaryDirectory() as tmp:
        int8 = int8_copy(args.models, args.model, pathlib.Path(tmp))
        run("ctranslate2_compare.py", *common, *sentences, "--repeats", str(args.repeats), "--int8-models", str(int8),
            "--out", str(args.out / "same_weights.json"))
        run("length_split.py", *common, *sentences, "--repeats", str(2 * args.repeats), "--int8-models", str(int8),
            "--out", str(args.out / "length_split.json"))
    run("step_positions.py", *common, "--repeats", str(args.repeats), "--out", str(args.out / "step_positions.json"))
    run("engine_time.py", *common, "--clients", "32", "--seconds", str(args.seconds),
        "--out", str(args.out / "engine_time.json"))
    results = {name: json.loads((args.out / f"{name}.json").read_text())
               for name in ("concurrency", "same_weights", "step_positions", "engine_time", "length_split")}
    results["targets"] = targets(results)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "report.md").write_text(markdown(results))
    plot(results, args.out / "throughput.png")
    print(markdown(results))


if __name__ == "__main__":
    main()
