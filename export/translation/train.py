"""Trains a bidirectional zh-TW <-> en translator on data/corpus (built by attnserve.export.translation.corpus.build):
the Transformer (`--arch transformer`, the default) or the recurrent translator (`--arch recurrent`).

Seeded, resumable (the run folder keeps `last.pt`; rerunning the same command continues from it; `touch <run>/STOP`
makes a running training checkpoint and end at once), logs to
`<run>/train.log`. One model serves both directions: every pair gives an en->zh and a zh->en example, and
the decoder starts with the target-language token.

    python -m attnserve.export.translation.train --corpus data/corpus --run ~/.cache/attnserve/runs/zh-en --minutes 90
    python -m attnserve.export.translation.train --arch recurrent --tokenizer models/translate-zh-en/1/tokenizer.json \
        --corpus data/corpus --run ~/.cache/attnserve/runs/zh-en-rnn --minutes 90
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import logging
import pathlib
import random
import time

import torch
from tokenizers import Tokenizer
from torch.nn import functional as F
from tqdm import tqdm

from attnserve.export.common import cpu_bf16
from attnserve.export.common.average_checkpoints import average_state_dicts
from attnserve.export.common.training import RunClock, checkpoint_fields, inverse_sqrt, save_checkpoint
from attnserve.export.translation import bpe
from attnserve.export.translation.architectures import build_model
from attnserve.export.translation.recurrent import ATTENTION_SCORES

log = logging.getLogger("attnserve.train")


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    # Shared BPE vocabulary size (both languages).
    vocab_size: int = 16000
    # Examples longer than this many tokens on either side are skipped.
    max_tokens: int = 128
    # Target tokens per optimizer step (batches are built from length-sorted buckets).
    batch_tokens: int = 3000
    # Peak learning rate reached after `warmup_steps`, then inverse-square-root decay.
    lr: float = 1e-3
    warmup_steps: int = 600
    label_smoothing: float = 0.1
    seed: int = 1234
    # Minutes between checkpoints / dev evaluations.
    checkpoint_minutes: float = 5.0
    # Corpus family -> how many times its training pairs are repeated (e.g. {"hsk": 5}: the everyday
    # sentences are 4% of the corpus, and a demo translates everyday sentences).
    upsample: tuple[tuple[str, int], ...] = ()
    # Dev families whose loss chooses best.pt (empty: the whole dev split), e.g. the everyday ones.
    select_families: tuple[str, ...] = ()
    # Also write averaged.pt: the mean weights of the last N checkpoints (0: off).
    average_last: int = 0
    # "cpu", or "cuda" (bf16 autocast, larger batches; checkpoints still load on CPU).
    device: str = "cpu"
    # bf16 autocast on a CPU too: its matrix products run on AMX / AVX512-BF16 units where the CPU has them.
    cpu_bf16: bool = False


def read_pairs(path: pathlib.Path) -> list[tuple[str, str]]:
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        en, _, zh = line.partition("\t")
        if en and zh:
            pairs.append((en, zh))
    return pairs


def upsample_pairs(pairs, families: list[str], factors: dict[str, int]):
    """Repeats the pairs of each family in `factors` that many times in all (`families` is line-aligned)."""
    if len(families) != len(pairs):
        raise ValueError(f"the .source file has {len(families)} lines for {len(pairs)} pairs")
    return [pair for pair, family in zip(pairs, families) for _ in range(factors.get(family, 1))]


def make_examples(pairs, tokenizer: Tokenizer, max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """Both directions of every pair as (source ids + EOS, [lang] + target ids + EOS)."""
    lang = bpe.language_token_ids(tokenizer)
    en_ids = [e.ids for e in tokenizer.encode_batch([en for en, _ in pairs])]
    zh_ids = [e.ids for e in tokenizer.encode_batch([zh for _, zh in pairs])]
    examples = []
    for en, zh in zip(en_ids, zh_ids):
        if len(en) >= max_tokens or len(zh) >= max_tokens:
            continue
        examples.append((en + [bpe.EOS_ID], [lang["zh-TW"]] + zh + [bpe.EOS_ID]))
        examples.append((zh + [bpe.EOS_ID], [lang["en"]] + en + [bpe.EOS_ID]))
    return examples


def make_batches(examples, batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Groups example indices of similar length so padding stays small; shuffles the batch order."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][1]), len(examples[i][0]), rng.random()))
    batches, current, longest = [], [], 0
    for i in order:
        longest = max(longest, len(examples[i][1]), len(examples[i][0]))
        if current and longest * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, longest = [], max(len(examples[i][1]), len(examples[i][0]))
        current.append(i)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(examples, indices, device: str = "cpu"):
    """-> src (B, S), src_mask, tgt_in (B, T), tgt_out (B, T) padded with PAD, on `device`."""
    srcs = [examples[i][0] for i in indices]
    tgts = [examples[i][1] for i in indices]
    s, t = max(map(len, srcs)), max(map(len, tgts)) - 1
    src = torch.full((len(indices), s), bpe.PAD_ID)
    tgt = torch.full((len(indices), t + 1), bpe.PAD_ID)
    for row, (a, b) in enumerate(zip(srcs, tgts)):
        src[row, : len(a)] = torch.tensor(a)
        tgt[row, : len(b)] = torch.tensor(b)
    src, tgt = src.to(device, non_blocking=True), tgt.to(device, non_blocking=True)
    return src, (src != bpe.PAD_ID).long(), tgt[:, :-1], tgt[:, 1:]


def loss_on(model, batch, label_smoothing: float, cpu_bf16: bool = False) -> tuple[torch.Tensor, int]:
    src, src_mask, tgt_in, tgt_out = batch
    # bf16 matrix products on a GPU, and on a CPU when asked; the loss itself is taken in float32.
    with torch.autocast(src.device.type, dtype=torch.bfloat16, enabled=src.device.type == "cuda" or cpu_bf16):
        logits = model(src, src_mask, tgt_in, (tgt_in != bpe.PAD_ID).long())
    loss = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        tgt_out.reshape(-1),
        ignore_index=bpe.PAD_ID,
        label_smoothing=label_smoothing,
        reduction="sum",
    )
    return loss, int((tgt_out != bpe.PAD_ID).sum())


@torch.no_grad()
def dev_loss(model, examples, batch_tokens: int, device: str = "cpu") -> float:
    """Per-token cross-entropy (no smoothing) on up to 2,000 dev examples."""
    model.eval()
    subset = examples[:2000]
    total, tokens = 0.0, 0
    for indices in make_batches(subset, batch_tokens, random.Random(0)):
        loss, n = loss_on(model, collate(subset, indices, device), 0.0)
        total, tokens = total + loss.item(), tokens + n
    model.train()
    return total / max(tokens, 1)


def load_or_train_tokenizer(run: pathlib.Path, train_pairs, vocab_size: int, given: pathlib.Path | None) -> Tokenizer:
    """The run's tokenizer: kept from an earlier start, else copied from `given`, else trained on the pairs."""
    path = run / "tokenizer.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    if given is not None:
        # Sharing another model's vocabulary makes two models comparable token for token.
        tokenizer = Tokenizer.from_file(str(given))
        tokenizer.save(str(path))
        return tokenizer
    texts = [text for pair in train_pairs for text in pair]
    tokenizer = bpe.train_tokenizer(texts, vocab_size)
    tokenizer.save(str(path))
    return tokenizer


def read_families(path: pathlib.Path) -> list[str]:
    """The corpus family of each line of a `.source` file (`hsk/level3` -> `hsk`)."""
    return [line.split("/")[0] for line in path.read_text(encoding="utf-8").splitlines()]


def dev_sets(corpus: pathlib.Path, tokenizer: Tokenizer, opts: TrainOptions) -> dict[str, list]:
    """Dev examples by role: "all", and "select" (the families that choose best.pt) when they are named."""
    pairs = read_pairs(corpus / "dev.tsv")
    sets = {"all": make_examples(pairs, tokenizer, opts.max_tokens)}
    if opts.select_families:
        families = read_families(corpus / "dev.source")
        chosen = [pair for pair, family in zip(pairs, families) if family in opts.select_families]
        if not chosen:
            raise ValueError(f"the dev split has no pairs of {', '.join(opts.select_families)}")
        sets["select"] = make_examples(chosen, tokenizer, opts.max_tokens)
    return sets


def train(
    corpus: pathlib.Path,
    run: pathlib.Path,
    minutes: float,
    arch: str,
    model_cfg: dict,
    opts: TrainOptions,
    tokenizer_file: pathlib.Path | None = None,
    init_from: pathlib.Path | None = None,
) -> None:
    run.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(opts.seed)
    train_pairs = read_pairs(corpus / "train.tsv")
    start = None
    if init_from is not None and not (run / "last.pt").exists():
        # A further phase of an earlier model: its weights, architecture and vocabulary; a fresh optimizer.
        start = torch.load(init_from, map_location="cpu", weights_only=False)
        arch, model_cfg = start.get("arch", "transformer"), {k: v for k, v in start["config"].items()
                                                              if k != "vocab_size"}
        if not (run / "tokenizer.json").exists():
            Tokenizer.from_str(start["tokenizer"]).save(str(run / "tokenizer.json"))
    tokenizer = load_or_train_tokenizer(run, train_pairs, opts.vocab_size, tokenizer_file)
    if opts.upsample:
        train_pairs = upsample_pairs(train_pairs, read_families(corpus / "train.source"), dict(opts.upsample))
    examples = make_examples(train_pairs, tokenizer, opts.max_tokens)
    dev = dev_sets(corpus, tokenizer, opts)
    log.info("train examples %d (both directions), dev %s", len(examples), {k: len(v) for k, v in dev.items()})

    model = build_model(arch, {"vocab_size": tokenizer.get_vocab_size(), **model_cfg}).to(opts.device)
    cfg = model.cfg
    optimizer = torch.optim.AdamW(model.parameters(), lr=opts.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0)
    state = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "tokens": 0, "seconds": 0.0, "best_dev": float("inf")}
    if start is not None:
        model.load_state_dict({k: v.float() for k, v in start["model"].items()})
        state["initialised_from"] = {"checkpoint": str(init_from), **{
            k: start.get("state", {}).get(k) for k in ("recovered_from", "step", "tokens", "vocabulary_extended")}}
        log.info("initialised from %s", init_from)
    last = run / "last.pt"
    if last.exists():
        ckpt = torch.load(last, map_location="cpu", weights_only=False)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        state = ckpt["state"]
        torch.set_rng_state(ckpt["rng"])
        if state.get("examples") != len(examples):
            # A different (or unrecorded) data mix, e.g. a new --upsample: its batch order differs, so the
            # saved position in the epoch means nothing; start a fresh epoch.
            log.info("training data changed (%s -> %d examples): new epoch", state.get("examples"), len(examples))
            state["epoch"], state["batch_in_epoch"] = state["epoch"] + 1, 0
        log.info("resumed at step %d (%d target tokens seen)", state["step"], state["tokens"])
    state["examples"] = len(examples)
    # Each invocation is a phase; the model card lists them (e.g. a final phase with upsampled sentences).
    state.setdefault("phases", []).append(
        {"start_step": state["step"], "upsample": dict(opts.upsample), "device": device_name(opts.device, opts.cpu_bf16)}
    )
    log.info("model: %s, %.2fM parameters", cfg, sum(p.numel() for p in model.parameters()) / 1e6)
    run_epochs(model, optimizer, examples, dev, tokenizer, state, run, minutes, opts)


def device_name(device: str, cpu_bf16: bool = False) -> str:
    """What the model card says the run trained on."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({torch.get_num_threads()} threads{', bf16 autocast' if cpu_bf16 else ''})"


def run_epochs(model, optimizer, examples, dev, tokenizer, state, run, minutes, opts) -> None:
    model.train()
    clock = RunClock(run, minutes, opts.checkpoint_minutes)
    recent: list[dict] = []  # the last checkpoints' weights, for averaged.pt
    while clock.running():
        batches = make_batches(examples, opts.batch_tokens, random.Random(opts.seed + state["epoch"]))
        remaining = batches[state["batch_in_epoch"] :]
        progress = tqdm(total=len(remaining), desc=f"epoch {state['epoch']}", mininterval=30)
        for batch in prefetched(lambda indices: collate(examples, indices), remaining, opts.device):
            progress.update()
            started = time.monotonic()
            for group in optimizer.param_groups:
                group["lr"] = inverse_sqrt(state["step"] + 1, opts)
            loss, n = loss_on(model, batch, opts.label_smoothing, opts.cpu_bf16)
            optimizer.zero_grad(set_to_none=True)
            (loss / n).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            state["step"] += 1
            state["batch_in_epoch"] += 1
            state["tokens"] += n
            state["seconds"] += time.monotonic() - started
            if state["step"] % 50 == 0:
                log.info(
                    "step %d epoch %d loss %.3f lr %.2e tokens %d tok/s %.0f",
                    state["step"], state["epoch"], loss.item() / n, optimizer.param_groups[0]["lr"],
                    state["tokens"], state["tokens"] / max(state["seconds"], 1e-9),
                )
            if clock.after_step(lambda: checkpoint(model, optimizer, dev, tokenizer, state, run, opts, recent)):
                return
        state["epoch"] += 1
        state["batch_in_epoch"] = 0


def prefetched(make_batch, items, device: str, depth: int = 4):
    """Yields make_batch(item) for each item, moved to `device`; on a GPU the next few are built on a thread
    meanwhile, so padding in Python does not leave the accelerator idle."""
    if device == "cpu":
        yield from map(make_batch, items)
        return
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = collections.deque(pool.submit(make_batch, item) for item in items[:depth])
        for item in items[depth:]:
            batch = pending.popleft().result()
            pending.append(pool.submit(make_batch, item))
            yield tuple(t.to(device, non_blocking=True) for t in batch)
        while pending:
            yield tuple(t.to(device, non_blocking=True) for t in pending.popleft().result())


def checkpoint(model, optimizer, dev, tokenizer, state, run, opts, recent: list[dict]) -> None:
    losses = {role: dev_loss(model, examples, opts.batch_tokens, opts.device) for role, examples in dev.items()}
    loss = losses.get("select", losses["all"])
    log.info("step %d dev loss %s (best %.3f)", state["step"], {k: round(v, 3) for k, v in losses.items()},
             state["best_dev"])
    state.setdefault("dev_history", []).append({"step": state["step"], **losses})
    if loss < state["best_dev"]:
        state["best_dev"] = loss
        state["best_step"] = state["step"]
        save_checkpoint(run / "best.pt", model, optimizer, state, tokenizer)
    save_checkpoint(run / "last.pt", model, optimizer, state, tokenizer)
    if opts.average_last > 1:
        recent.append({k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()})
        del recent[: -opts.average_last]
        averaged = average_state_dicts(recent)
        torch.save(
            {"model": averaged, **checkpoint_fields(model), "tokenizer": tokenizer.to_str(),
             "state": {**state, "averaged_checkpoints": len(recent)}},
            run / "averaged.pt",
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/corpus"))
    parser.add_argument("--run", type=pathlib.Path, default=pathlib.Path.home() / ".cache/attnserve/runs/zh-en")
    parser.add_argument("--minutes", type=float, default=60.0, help="stop (with a checkpoint) after this long")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--arch", choices=["transformer", "recurrent"], default="transformer")
    parser.add_argument(
        "--tokenizer", type=pathlib.Path, help="use this tokenizer.json (e.g. another model's) instead of training one"
    )
    parser.add_argument("--d-model", type=int, default=256, help="transformer width; recurrent embedding width")
    parser.add_argument("--heads", type=int, default=4, help="transformer only")
    parser.add_argument("--d-ff", type=int, default=1024, help="transformer only")
    parser.add_argument("--layers", type=int, default=3, help="transformer: encoder and decoder layers each")
    parser.add_argument("--encoder-layers", type=int, default=2, help="recurrent: bidirectional LSTM layers")
    parser.add_argument("--encoder-hidden", type=int, default=256, help="recurrent: units per direction")
    parser.add_argument("--decoder-hidden", type=int, default=512, help="recurrent: decoder LSTM units")
    parser.add_argument("--attention", choices=ATTENTION_SCORES, default="additive", help="recurrent: score")
    parser.add_argument("--batch-tokens", type=int, default=TrainOptions.batch_tokens)
    parser.add_argument("--lr", type=float, default=TrainOptions.lr)
    parser.add_argument("--warmup-steps", type=int, default=TrainOptions.warmup_steps)
    parser.add_argument("--vocab-size", type=int, default=TrainOptions.vocab_size)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (bf16 autocast)")
    parser.add_argument("--cpu-bf16", action="store_true",
                        help="bf16 autocast on the CPU too (CPUs with AMX or AVX512-BF16): 1.1-1.3x on an AMX CPU "
                             "(bench/README.md); refused on CPUs without bf16 units")
    parser.add_argument("--checkpoint-minutes", type=float, default=TrainOptions.checkpoint_minutes)
    parser.add_argument("--select", default="", metavar="FAMILY,...",
                        help="dev families whose loss chooses best.pt (default: the whole dev split), e.g. hsk,cedict")
    parser.add_argument("--init-from", type=pathlib.Path, metavar="CHECKPOINT",
                        help="start from this checkpoint's weights, architecture and vocabulary (new optimizer)")
    parser.add_argument("--average-last", type=int, default=0, metavar="N",
                        help="also write averaged.pt, the mean of the last N checkpoints' weights")
    parser.add_argument(
        "--upsample", action="append", default=[], metavar="FAMILY=N",
        help="repeat a corpus family's training pairs N times (families as in train.source), e.g. hsk=5",
    )
    return parser


def _model_config(args: argparse.Namespace) -> dict:
    """The architecture's size from the flags."""
    if args.arch == "transformer":
        return {
            "d_model": args.d_model,
            "heads": args.heads,
            "d_ff": args.d_ff,
            "encoder_layers": args.layers,
            "decoder_layers": args.layers,
            "max_positions": 512,
        }
    return {
        "embed_dim": args.d_model,
        "encoder_layers": args.encoder_layers,
        "encoder_hidden": args.encoder_hidden,
        "decoder_hidden": args.decoder_hidden,
        "attention": args.attention,
    }


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    if args.cpu_bf16 and (why := cpu_bf16.refusal("--cpu-bf16", args.device)):
        parser.error(why)
    args.run.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(message)s",
        handlers=[logging.FileHandler(args.run / "train.log"), logging.StreamHandler()],
    )
    torch.set_num_threads(args.threads)
    model_cfg = _model_config(args)
    upsample = tuple((family, int(n)) for family, _, n in (u.partition("=") for u in args.upsample))
    opts = TrainOptions(
        batch_tokens=args.batch_tokens, lr=args.lr, warmup_steps=args.warmup_steps, vocab_size=args.vocab_size,
        upsample=upsample, device=args.device, cpu_bf16=args.cpu_bf16, checkpoint_minutes=args.checkpoint_minutes,
        select_families=tuple(f for f in args.select.split(",") if f), average_last=args.average_last,
    )
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    train(args.corpus, args.run, args.minutes, args.arch, model_cfg, opts, args.tokenizer, args.init_from)


if __name__ == "__main__":
    main()
