"""Long sources decoding apart (SchedulingOptions.length_split) against one lane padded to the longest source.

    .venv/bin/python bench/length_split.py [--sentences 128] [--repeats 8] [--int8-models COPY]

In process, one intra-op thread: the first --sentences test-split sentences (half each direction) are
submitted at once, as a client with a burst would, to two engines of the bundled translator, one with the
split (the default) and one without (`--no-length-split`), in turn for --repeats rounds so that a slow spell
of the machine hits both. `--int8-models` (a copy of models/ that `attnserve.export.common.quantize` was run on)
adds the same pair on the int8 variant. Reported per engine: generated tokens/s (median), decoder calls,
rows per call, the source positions the decoder read per round and the share of them that was padding, and
how many outputs equal the other engine's.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import sentences  # bench/, beside this script
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine
from attnserve.server.engine.scheduler import SchedulingOptions
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions

WAIT = 600


class DecoderCalls:
    """Wraps an engine's decoder: per call, its rows, its source width and its rows' real source positions."""

    def __init__(self, engine):
        manifest = engine.manifest
        self._mask = next(s.target for s in manifest.static if s.source == manifest.encoder.inputs["attention_mask"])
        self._decode = engine.runtime.decode_step
        engine.runtime.decode_step = self
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, feeds, residency=None):
        mask = feeds[self._mask]  # (rows, width)
        self.calls.append((mask.shape[0], mask.shape[1], int(mask.sum())))
        return self._decode(feeds, residency)


def table(report: dict) -> list[str]:
    """The report as a markdown table."""
    lines = [f"| engine ({report['requests']} requests at once, in process) | tokens/s | decoder calls | rows per "
             "call | source positions read | padding | outputs equal to the other engine's |", "|---|---|---|---|---|---|---|"]
    for name, r in report["engines"].items():
        lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {r['decoder_calls_per_round']:.0f} | {r['rows_per_call']:.1f} | "
                     f"{r['source_positions_read_per_round']:,.0f} | {100 * r['padding_share']:.0f}% | "
                     f"{r['outputs_equal_to_the_other_engine']}/{report['requests']} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sentences.add_arguments(parser, sentences=128)
    parser.add_argument("--int8-models", type=pathlib.Path, help="a copy of --models with the int8 variant")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--max-batch-size", type=int, default=32, help="requests admitted (encoded) at one step")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()

    requests = sentences.requests(args)
    variants = {"float32": (args.models, RuntimeOptions())}
    if args.int8_models:
        variants["int8"] = (args.int8_models, RuntimeOptions(variant="int8"))
    engines, calls, partner = {}, {}, {}
    for variant, (models, runtime) in variants.items():
        version = find_models(models, only=[args.model])[args.model]
        names = [f"{variant}, split", f"{variant}, one lane"]
        partner.update({names[0]: names[1], names[1]: names[0]})
        for name, split in zip(names, (True, False)):
            scheduling = SchedulingOptions(length_split=split)
            engines[name] = load_engine(version, runtime, BatchingOptions(args.max_batch_size, continuous=scheduling))
    seconds = {name: [] for name in engines}
    outputs = {}
    try:
        for name, engine in engines.items():  # warm-up, and each engine's outputs
            outputs[name] = [[t.id for t in f.result(WAIT).tokens] for f in [engine.submit(r) for r in requests]]
            calls[name] = DecoderCalls(engine)
        for _ in range(args.repeats):
            for name, engine in engines.items():
                started = time.perf_counter()
                for future in [engine.submit(r) for r in requests]:
                    future.result(WAIT)
                seconds[name].append(time.perf_counter() - started)
    finally:
        for engine in engines.values():
            engine.close()

    report = {"model": args.model, "requests": len(requests), "repeats": args.repeats, "engines": {}}
    for name in engines:
        rows = [c[0] for c in calls[name].calls]
        positions = sum(c[0] * c[1] for c in calls[name].calls)
        real = sum(c[2] for c in calls[name].calls)
        report["engines"][name] = {
            "tokens_per_s": sum(map(len, outputs[name])) / statistics.median(seconds[name]),
            "decoder_calls_per_round": len(rows) / args.repeats,
            "rows_per_call": statistics.mean(rows),
            "source_positions_read_per_round": positions / args.repeats,
            "padding_share": 1 - real / positions,
            "outputs_equal_to_the_other_engine": sum(a == b for a, b in zip(outputs[name], outputs[partner[name]])),
        }
    print(json.dumps(report, indent=2))
    print("\n" + "\n".join(table(report)))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
