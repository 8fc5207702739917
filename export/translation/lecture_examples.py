"""The phrases a demo audience types first: the lecture's own examples, in both directions.

A translation counts as right when it equals one of the accepted answers after case folding and without
final punctuation or spaces. The phrases are short on purpose: a wrong word is a wrong answer.

    python -m attnserve.export.translation.lecture_examples --checkpoint RUN/averaged.pt
    python -m attnserve.export.translation.lecture_examples --served-models models
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re

# (Traditional Chinese, English answers accepted for zh->en; the first is also the en->zh source).
PHRASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("知識就是力量", ("knowledge is power",)),
    ("深度學習", ("deep learning",)),
    ("機器學習", ("machine learning",)),
    ("人工智慧", ("artificial intelligence", "ai")),
    ("神經網路", ("neural network", "neural networks")),
    ("機器翻譯", ("machine translation",)),
    ("注意力機制", ("attention mechanism",)),
    ("語音辨識", ("speech recognition", "voice recognition")),
    ("自然語言處理", ("natural language processing",)),
    ("電腦視覺", ("computer vision",)),
)
# en->zh answers accepted besides the phrase itself (Taiwan usage has variants).
ZH_VARIANTS: dict[str, tuple[str, ...]] = {
    "神經網路": ("神經網絡",),
    "語音辨識": ("語音識別",),
    "人工智慧": ("人工智能",),
    "電腦視覺": ("計算機視覺",),
}
_TRAILING = re.compile(r"[\s.!?。！？]+$")


def normalise(text: str) -> str:
    return _TRAILING.sub("", text.strip()).casefold()


def cases() -> list[dict]:
    """Every check: source, target language, accepted answers."""
    checks = []
    for zh, answers in PHRASES:
        checks.append({"source": zh, "target": "en", "accepted": list(answers)})
        checks.append({"source": answers[0], "target": "zh-TW", "accepted": [zh, *ZH_VARIANTS.get(zh, ())]})
    return checks


def judge(checks: list[dict], outputs: list[str]) -> dict:
    results = []
    for check, output in zip(checks, outputs, strict=True):
        right = normalise(output) in {normalise(a) for a in check["accepted"]}
        results.append({**check, "output": output, "right": right})
    return {"right": sum(r["right"] for r in results), "total": len(results), "results": results}


def translate_all(checks: list[dict], translate) -> list[str]:
    """`translate(texts, target)` over the checks, one call per target language, in check order."""
    outputs = [""] * len(checks)
    for target in ("en", "zh-TW"):
        rows = [i for i, c in enumerate(checks) if c["target"] == target]
        for i, text in zip(rows, translate([checks[i]["source"] for i in rows], target)):
            outputs[i] = text
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=pathlib.Path, help="a training checkpoint (PyTorch)")
    parser.add_argument("--served-models", type=pathlib.Path, help="or a model repository (ONNX, as served)")
    parser.add_argument("--served-name", default="translate-zh-en")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    from attnserve.export.translation import evaluate

    checks = cases()
    if args.checkpoint:
        from attnserve.export.translation.architectures import load_checkpoint

        model, tokenizer = load_checkpoint(args.checkpoint)
        outputs = translate_all(checks, lambda texts, target: evaluate.translate(model, tokenizer, texts, target))
    elif args.served_models:
        engine = evaluate.open_engine(args.served_models, args.served_name)
        beams = engine.info.default_beam_size
        try:
            # beam_size 0 = unset: the model's default search, what a demo's request gets
            outputs = translate_all(checks, lambda texts, target: evaluate.translate_with(engine, texts, target,
                                                                                          beam_size=0))
        finally:
            engine.close()
    else:
        parser.error("give --checkpoint or --served-models")
    report = judge(checks, outputs)
    if args.served_models:
        report["beam_size"] = beams
    for result in report["results"]:
        print(f"{'ok ' if result['right'] else 'NO '} {result['source']} -> {result['output']}")
    print(f"{report['right']}/{report['total']} right")
    if args.out:
        args.out.write_text(json.dumps(report, ensure_ascii=False, indent=2) + "\n")


if __name__ == "__main__":
    main()
