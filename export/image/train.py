"""Trains the Show-Attend-Tell captioner (export/image/model.py) on the composed scenes (export/image/build.py).

    python -m attnserve.export.image.train --corpus data/scenes --run ~/.cache/attnserve/runs/caption-emoji --minutes 60

Seeded and resumable, as the other trainers: the run folder keeps `last.pt` (rerunning the same command
continues from it, at the same batch of the same epoch; `touch <run>/STOP` makes a running training
checkpoint and end at once) and `best.pt` (highest dev exact match), and logs to `<run>/train.log`. Only
`dev` selects the model; `test` and `compositional` are for evaluation alone (export/image/evaluate.py).

The loss is the words' cross-entropy, 0.1 x the presence head's loss (model.py), plus the paper's doubly
stochastic attention regulariser,
lambda * sum_i (1 - sum_t alpha_ti)^2 over the cells i of each image and the steps t of its caption (EOS
included), averaged over images. With 64 cells and about 8 steps no caption can look at every cell once, so
the term's minimum is spread-out attention; its weight is kept small (0.01), enough to discourage looking at
the same cell for every word and no more.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import pathlib
import random
import time

import torch
from tokenizers import Tokenizer
from torch.nn import functional as F

from attnserve.export.common.training import RunClock, inverse_sqrt, save_checkpoint
from attnserve.export.image import scoring, vocabulary
from attnserve.export.image.build import load_split
from attnserve.export.image.model import ShowAttendTell, ShowAttendTellConfig, normalize
from attnserve.export.image.objects import OBJECTS

log = logging.getLogger("attnserve.image.train")


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    # Images per optimizer step.
    batch_size: int = 64
    # Peak learning rate (Adam) reached after `warmup_steps`, then inverse-square-root decay.
    lr: float = 2e-3
    warmup_steps: int = 200
    # Weight of the doubly stochastic attention regulariser (per image).
    attention_weight: float = 0.01
    # Weight of the presence head's loss (binary cross-entropy summed over the objects, per image).
    presence_weight: float = 0.1
    label_smoothing: float = 0.05
    # Gradient norm clip.
    clip_norm: float = 5.0
    seed: int = 1234
    # Minutes between checkpoints / dev evaluations.
    checkpoint_minutes: float = 5.0

    def __post_init__(self):
        if self.batch_size < 1 or self.lr <= 0 or self.attention_weight < 0:
            raise ValueError("batch_size and lr must be positive, attention_weight not negative")


@dataclasses.dataclass(frozen=True)
class Split:
    images: torch.Tensor  # (N, H, W, 3) uint8
    targets: list[list[int]]  # word ids, no start or EOS
    scenes: list  # scene graphs (export/image/scenes.py)
    present: torch.Tensor  # (N, objects) 1 where the scene holds the object (the caption names it)


def load(corpus: pathlib.Path, split: str, tokenizer: Tokenizer) -> Split:
    images, graphs = load_split(corpus, split)
    index = {o.name: k for k, o in enumerate(OBJECTS)}
    present = torch.zeros(len(graphs), len(OBJECTS))
    for row, scene in enumerate(graphs):
        present[row, [index[o.name] for o in scene.objects]] = 1
    return Split(torch.from_numpy(images), vocabulary.encode(tokenizer, [s.caption for s in graphs]), graphs, present)


def collate(split: Split, indices: list[int], cfg: ShowAttendTellConfig):
    """Normalised pixels (B, 3, H, W), tgt_in (B, U) start + words, tgt_out (B, U) words + EOS (<pad>-padded),
    and the objects present (B, objects)."""
    u = max(len(split.targets[i]) for i in indices) + 1
    tgt = torch.full((len(indices), u + 1), vocabulary.PAD_ID)
    for row, i in enumerate(indices):
        ids = [vocabulary.START_ID, *split.targets[i], vocabulary.EOS_ID]
        tgt[row, : len(ids)] = torch.tensor(ids)
    return normalize(split.images[indices], cfg), tgt[:, :-1], tgt[:, 1:], split.present[indices]


def loss_on(model: ShowAttendTell, pixels, tgt_in, tgt_out, present, opts: TrainOptions) -> tuple[torch.Tensor, dict]:
    """Cross-entropy per word + the attention regulariser and the presence loss per image, and the parts."""
    logits, weights, presence = model(pixels, tgt_in)  # (B, U, V), (B, U, S), (B, objects)
    words = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=vocabulary.PAD_ID,
                            label_smoothing=opts.label_smoothing)
    real = (tgt_out != vocabulary.PAD_ID).to(weights.dtype)  # (B, U)
    coverage = (weights * real[..., None]).sum(1)  # (B, S): how much each cell was looked at over the caption
    regulariser = ((1 - coverage) ** 2).sum(1).mean()
    objects = F.binary_cross_entropy_with_logits(presence, present, reduction="sum") / len(present)
    loss = words + opts.attention_weight * regulariser + opts.presence_weight * objects
    return loss, {"words": words.item(), "attention": regulariser.item(), "presence": objects.item()}


@torch.no_grad()
def evaluate(model: ShowAttendTell, split: Split, tokenizer: Tokenizer, batch: int = 250) -> dict:
    """Greedy exact match, BLEU and pointing accuracy of a split."""
    model.eval()
    hypotheses, trials = [], []
    for start in range(0, len(split.targets), batch):
        indices = list(range(start, min(start + batch, len(split.targets))))
        outputs, attentions = model.greedy_decode(normalize(split.images[indices], model.cfg))
        for i, ids, attention in zip(indices, outputs, attentions):
            text = tokenizer.decode(ids)
            hypotheses.append(text)
            trials += scoring.pointing_trials(text.split(), attention.numpy(), split.scenes[i], model.cfg.grid)
    model.train()
    references = [s.caption for s in split.scenes]
    return {"exact": scoring.exact_match(hypotheses, references), "bleu": scoring.bleu(hypotheses, references),
            "pointing": sum(trials) / max(len(trials), 1),
            "examples": [(references[i], hypotheses[i]) for i in range(3)]}


def load_model(path: pathlib.Path) -> tuple[ShowAttendTell, Tokenizer, dict]:
    """A checkpoint's model (eval mode), tokenizer and training state, for export and evaluation."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    config = {k: tuple(v) if isinstance(v, list) else v for k, v in ckpt["config"].items()}
    model = ShowAttendTell(ShowAttendTellConfig(**config))
    model.load_state_dict(ckpt["model"])
    return model.eval(), Tokenizer.from_str(ckpt["tokenizer"]), ckpt["state"]


def train(corpus: pathlib.Path, run: pathlib.Path, minutes: float, cfg: ShowAttendTellConfig, opts: TrainOptions):
    # Data: the training and dev splits, captions as word ids.
    run.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(opts.seed)
    tokenizer = vocabulary.word_tokenizer()
    train_split, dev_split = load(corpus, "train", tokenizer), load(corpus, "dev", tokenizer)
    log.info("train %d images, dev %d", len(train_split.targets), len(dev_split.targets))

    # Model and optimizer: fresh, or resumed from last.pt.
    last = run / "last.pt"
    ckpt = torch.load(last, map_location="cpu", weights_only=False) if last.exists() else None
    if ckpt is not None:
        cfg = ShowAttendTellConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in ckpt["config"].items()})
    model = ShowAttendTell(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=opts.lr)
    state = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "images": 0, "seconds": 0.0, "best_exact": -1.0,
             "history": []}
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        state = ckpt["state"]
        torch.set_rng_state(ckpt["rng"])
        log.info("resumed at step %d (%d images seen)", state["step"], state["images"])
    log.info("model: %s, %.2fM parameters", cfg, sum(p.numel() for p in model.parameters()) / 1e6)

    # Epochs until the deadline, with a checkpoint every opts.checkpoint_minutes, on STOP and at the end.
    run_epochs(model, optimizer, train_split, dev_split, tokenizer, state, run, minutes, opts)


def run_epochs(model, optimizer, split: Split, dev: Split, tokenizer, state, run, minutes, opts) -> None:
    model.train()
    clock = RunClock(run, minutes, opts.checkpoint_minutes)
    n = len(split.targets)
    while True:
        order = list(range(n))
        random.Random(opts.seed + state["epoch"]).shuffle(order)
        batches = [order[i : i + opts.batch_size] for i in range(0, n, opts.batch_size)]
        for indices in batches[state["batch_in_epoch"] :]:
            started = time.monotonic()
            for group in optimizer.param_groups:
                group["lr"] = inverse_sqrt(state["step"] + 1, opts)
            loss, parts = loss_on(model, *collate(split, indices, model.cfg), opts)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), opts.clip_norm)
            optimizer.step()
            state["step"] += 1
            state["batch_in_epoch"] += 1
            state["images"] += len(indices)
            state["seconds"] += time.monotonic() - started
            if state["step"] % 50 == 0:
                log.info("step %d epoch %d words %.3f attention %.2f presence %.3f lr %.2e, %.0f images/s",
                         state["step"], state["epoch"], parts["words"], parts["attention"], parts["presence"],
                         optimizer.param_groups[0]["lr"],
                         state["images"] / max(state["seconds"], 1e-9))
            if clock.after_step(lambda: checkpoint(model, optimizer, dev, tokenizer, state, run)):
                return
        state["epoch"] += 1
        state["batch_in_epoch"] = 0


def checkpoint(model, optimizer, dev: Split, tokenizer, state, run) -> None:
    started = time.monotonic()
    scores = evaluate(model, dev, tokenizer)
    log.info("step %d dev exact %.2f%% BLEU %.1f pointing %.2f%%, best exact %.2f%% [%.0f s]", state["step"],
             100 * scores["exact"], scores["bleu"], 100 * scores["pointing"], 100 * max(state["best_exact"], 0),
             time.monotonic() - started)
    for reference, hypothesis in scores["examples"]:
        log.info("  ref: %s\n  hyp: %s", reference, hypothesis)
    state["history"].append({"step": state["step"], "images": state["images"], "train_seconds": state["seconds"],
                             **{k: v for k, v in scores.items() if k != "examples"}})
    if scores["exact"] > state["best_exact"]:
        state["best_exact"] = scores["exact"]
        save_checkpoint(run / "best.pt", model, optimizer, state, tokenizer)
    save_checkpoint(run / "last.pt", model, optimizer, state, tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/scenes"))
    parser.add_argument("--run", type=pathlib.Path, default=pathlib.Path.home() / ".cache/attnserve/runs/caption-emoji")
    parser.add_argument("--minutes", type=float, default=60.0, help="stop (with a checkpoint) after this long")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint-minutes", type=float, default=TrainOptions.checkpoint_minutes)
    parser.add_argument("--lr", type=float, default=TrainOptions.lr)
    parser.add_argument("--attention-weight", type=float, default=TrainOptions.attention_weight)
    parser.add_argument("--stages", type=int, nargs="+", default=list(ShowAttendTellConfig.stages),
                        help="channels of each conv + max-pool stage; one stage gives a 16 x 16 grid on 64 pixels, "
                             "two an 8 x 8 one (a new run only: a resumed run keeps its checkpoint's)")
    parser.add_argument("--fine-grid", action="store_true",
                        help="attend over a grid twice as fine as the deep features (a new run only)")
    args = parser.parse_args()
    args.run.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        handlers=[logging.FileHandler(args.run / "train.log"), logging.StreamHandler()])
    torch.set_num_threads(args.threads)
    opts = TrainOptions(lr=args.lr, attention_weight=args.attention_weight, checkpoint_minutes=args.checkpoint_minutes)
    train(args.corpus, args.run, args.minutes, ShowAttendTellConfig(stages=tuple(args.stages), fine_grid=args.fine_grid), opts)


if __name__ == "__main__":
    main()
