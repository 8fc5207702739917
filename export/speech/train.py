"""Trains the listen-attend-spell recognizer (export/speech/model.py) on the synthesized speech corpus.

    python -m attnserve.export.speech.train --corpus data/speech --run ~/.cache/attnserve/runs/speech-en --minutes 120

On a GPU (`--device cuda`, with larger `--batch-seconds` / `--max-batch`) the model, batches, SpecAugment and
the losses run there, TF32 allowed; checkpoints load on any device. A run can start from another run's
weights (`--init-weights`, e.g. a float16 file from `--save-weights`) with a fresh optimizer.

Seeded and resumable: the run folder keeps `last.pt` (rerunning the same command continues from it, at the
same batch of the same epoch; `touch <run>/STOP` makes a running training checkpoint and end at once) and `best.pt` (lowest seen-voice dev CER), and logs to `<run>/train.log`.
The log-mel features of each split are computed once (server/inputs/features.py, so training features are the
served features) and cached under `--features` (fingerprinted: a rebuilt corpus is recomputed). Only `dev` (held-out sentences, seen voices) selects the
model; the held-out voices are for evaluation alone.

Each batch is padded and length-sorted (packed LSTMs train ~50x slower on CPU); the loss is the joint
CTC-attention loss, 0.3 CTC (on the 4x-reduced listener layer) + 0.7 label-smoothed attention
cross-entropy; a mel warp and SpecAugment masks perturb every training clip. `--mwer-weight` adds the
expected word errors of each clip's own candidates (export/speech/mwer.py), for fine-tuning a trained model.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import logging
import math
import pathlib
import random
import time

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.nn import functional as F
from tqdm import tqdm

from attnserve.export.common import cpu_bf16
from attnserve.export.common.training import RunClock, inverse_sqrt, save_checkpoint
from attnserve.export.speech import vocabulary
from attnserve.export.speech.feature_cache import SplitFeatures, load_split
from attnserve.export.speech.model import (ListenAttendSpell, ListenAttendSpellConfig, pad_features,
                                            teacher_forcing_targets)
from attnserve.export.speech.mwer import mwer_loss
from attnserve.export.speech.scoring import error_rate
from attnserve.export.speech.specaugment import AugmentOptions, SpecAugment

log = logging.getLogger("attnserve.speech.train")


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    # Padded audio per optimizer step, in seconds (longest clip x clips): batches of similar lengths.
    batch_seconds: float = 120.0
    # At most this many clips per batch, however short.
    max_batch: int = 64
    # Peak learning rate (Adam) reached after `warmup_steps`, then inverse-square-root decay.
    lr: float = 1e-3
    warmup_steps: int = 400
    # Joint loss: ctc_weight * CTC + (1 - ctc_weight) * attention cross-entropy (Kim et al. 2017).
    ctc_weight: float = 0.3
    label_smoothing: float = 0.1
    # Gradient norm clip (LSTMs occasionally spike).
    clip_norm: float = 5.0
    seed: int = 1234
    # Minutes between checkpoints / dev evaluations.
    checkpoint_minutes: float = 10.0
    # Dev clips scored at each checkpoint (the first N; None = all): a smoke run's checkpoints stay quick.
    dev_clips: int | None = None
    # Clips whose per-band spread sets the listener's feature scale on the first start.
    scale_clips: int = 1000
    augment: AugmentOptions = AugmentOptions()
    # Where the model trains and is evaluated: "cpu" or "cuda" (then TF32 matmuls and convolutions).
    device: str = "cpu"
    # Train the listener in bf16 autocast (CPUs with AMX / AVX512-BF16); the speller and the losses stay float32.
    bf16_listener: bool = False
    # Fine-tuning: add mwer_weight x the expected relative word errors per character over each clip's greedy
    # output and mwer_draws random ones (export/speech/mwer.py); 0 = cross-entropy and CTC alone.
    mwer_weight: float = 0.0
    mwer_draws: int = 4

    def __post_init__(self):
        if torch.device(self.device).type not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if not 0 <= self.ctc_weight <= 1:
            raise ValueError(f"ctc_weight must be in [0, 1], got {self.ctc_weight}")
        if self.batch_seconds <= 0 or self.max_batch < 1:
            raise ValueError("batch_seconds and max_batch must be positive")
        if self.mwer_weight < 0 or self.mwer_draws < 1:
            raise ValueError("mwer_weight must be >= 0 and mwer_draws >= 1")


@dataclasses.dataclass(frozen=True)
class Batch:
    features: torch.Tensor  # (B, T, M) raw log-mel, T a multiple of the time reduction
    mask: torch.Tensor  # (B, T)
    tgt_in: torch.Tensor  # (B, U) start token + characters, <pad>-padded
    tgt_out: torch.Tensor  # (B, U) characters + EOS, <pad>-padded
    seconds: float  # real audio in the batch

    @property
    def tokens(self) -> int:
        return int((self.tgt_out != vocabulary.PAD_ID).sum())

    def to(self, device: torch.device) -> Batch:
        """The batch with its tensors on `device` (itself on its own device)."""
        return dataclasses.replace(self, features=self.features.to(device), mask=self.mask.to(device),
                                   tgt_in=self.tgt_in.to(device), tgt_out=self.tgt_out.to(device))


def on_device(device: str):
    """A context in which tensors without a device are made on `device`: the model's decode loops and
    SpecAugment create their tensors so. Nothing at all on the CPU (the mode costs each torch call a little)."""
    return contextlib.nullcontext() if torch.device(device).type == "cpu" else torch.device(device)


def make_batches(frames: list[int], opts: TrainOptions, rng: random.Random) -> list[list[int]]:
    """Clip indices grouped by length (padding stays small) within the budget; batch order shuffled."""
    budget = opts.batch_seconds * 100  # frames (10 ms shift)
    order = sorted(range(len(frames)), key=lambda i: (frames[i], rng.random()))
    batches, current = [], []
    for i in order:
        if current and (frames[i] * (len(current) + 1) > budget or len(current) == opts.max_batch):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(split: SplitFeatures, targets: list[list[int]], indices: list[int], multiple: int) -> Batch:
    clips = [torch.from_numpy(np.array(split.features(i))) for i in indices]
    features, mask = pad_features(clips, multiple)
    tgt_in, tgt_out = teacher_forcing_targets([targets[i] for i in indices])
    seconds = sum(split.utterances[i].duration for i in indices)
    return Batch(features, mask, tgt_in, tgt_out, seconds)


def losses(model: ListenAttendSpell, batch: Batch, label_smoothing: float, augment: SpecAugment | None = None,
           bf16_listener: bool = False):
    """Summed attention cross-entropy and CTC loss of a batch (divide by batch.tokens for per-character), the
    CTC branch's (B, T', V) log-probabilities with their lengths, and the listener's (memory, mask)."""
    features = augment.warp(batch.features) if augment is not None else batch.features
    memory, reduced, ctc, ctc_lengths = model.listen(features, batch.mask, augment, bf16_listener)
    logits = model.spell(memory, reduced, batch.tgt_in)
    attention = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch.tgt_out.reshape(-1),
        ignore_index=vocabulary.PAD_ID, label_smoothing=label_smoothing, reduction="sum",
    )
    chars = batch.tgt_in[:, 1:]  # the transcript without start or EOS (EOS sits in tgt_out only)
    lengths = (batch.tgt_out != vocabulary.PAD_ID).sum(1) - 1
    ctc_loss = F.ctc_loss(
        ctc.transpose(0, 1), chars, ctc_lengths, lengths,
        blank=vocabulary.BLANK_ID, reduction="sum", zero_infinity=True,  # a few fast clips have too few frames
    )
    return attention, ctc_loss, (ctc, ctc_lengths), (memory, reduced)


def joint_loss(model, batch: Batch, opts: TrainOptions, augment: SpecAugment | None = None,
               references: list[str] | None = None, tokenizer: Tokenizer | None = None) -> torch.Tensor:
    """Per character: the joint CTC-attention loss, plus, with opts.mwer_weight, the expected relative word
    errors of the clips' own candidates against their `references` (decoded with `tokenizer`)."""
    attention, ctc, _, (memory, reduced) = losses(model, batch, opts.label_smoothing, augment, opts.bf16_listener)
    loss = opts.ctc_weight * ctc + (1 - opts.ctc_weight) * attention
    if opts.mwer_weight:
        if references is None or tokenizer is None:
            raise ValueError("mwer_weight needs the batch's reference transcripts and the tokenizer to score words")
        loss = loss + opts.mwer_weight * mwer_loss(model, memory, reduced, references, tokenizer.decode,
                                                   opts.mwer_draws, vocabulary.suppressed_ids())
    return loss / batch.tokens


def ctc_greedy(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best path of each row: argmax per frame, repeats merged, blanks dropped."""
    best = log_probs.argmax(-1)
    out = []
    for row, n in zip(best.tolist(), lengths.tolist()):
        ids = [t for k, t in enumerate(row[:n]) if t != vocabulary.BLANK_ID and (k == 0 or t != row[k - 1])]
        out.append(ids)
    return out


@torch.no_grad()
def evaluate(model, split: SplitFeatures, targets, tokenizer: Tokenizer, opts: TrainOptions) -> dict:
    """Dev losses per character, greedy attention CER / WER and CTC best-path CER (no augmentation)."""
    model.eval()
    frames = [u.frames for u in split.utterances]
    attention_sum = ctc_sum = tokens = 0.0
    hypotheses, ctc_hypotheses = [""] * len(frames), [""] * len(frames)
    r = model.cfg.time_reduction
    # Without gradients a batch can be 4x larger: fewer, wider decode loops.
    wide = dataclasses.replace(opts, batch_seconds=4 * opts.batch_seconds, max_batch=4 * opts.max_batch)
    for indices in make_batches(frames, wide, random.Random(0)):
        batch = collate(split, targets, indices, r).to(opts.device)
        longest = batch.features.shape[1] / 100  # seconds
        limit = math.ceil(vocabulary.MAX_CHARACTERS_PER_SECOND * longest) + 8
        with on_device(opts.device):
            attention, ctc, ctc_outputs, _ = losses(model, batch, 0.0)
            outputs, _ = model.greedy_decode(batch.features, batch.mask, limit, vocabulary.suppressed_ids())
        attention_sum, ctc_sum, tokens = attention_sum + attention.item(), ctc_sum + ctc.item(), tokens + batch.tokens
        for i, ids, ctc_ids in zip(indices, outputs, ctc_greedy(*ctc_outputs)):
            hypotheses[i], ctc_hypotheses[i] = tokenizer.decode(ids), tokenizer.decode(ctc_ids)
    model.train()
    references = [u.text for u in split.utterances]
    return {
        "attention_loss": attention_sum / tokens,
        "ctc_loss": ctc_sum / tokens,
        "cer": error_rate(hypotheses, references, "char"),
        "wer": error_rate(hypotheses, references, "word"),
        "ctc_cer": error_rate(ctc_hypotheses, references, "char"),
        "examples": [{"reference": references[i], "hypothesis": hypotheses[i]} for i in range(3)],
    }


def feature_scale(model: ListenAttendSpell, split: SplitFeatures, clips: int, seed: int) -> torch.Tensor:
    """Per-band standard deviation of clip-normalised features over a random sample of clips."""
    picked = random.Random(seed).sample(range(len(split.utterances)), min(clips, len(split.utterances)))
    total, square, count = torch.zeros(model.cfg.n_mels), torch.zeros(model.cfg.n_mels), 0
    for i in picked:
        x = torch.from_numpy(np.array(split.features(i)))[None]  # (1, T, M)
        mask = torch.ones(x.shape[:2], dtype=torch.int64)
        z = model.listener.normalize(x, mask)[0] * model.listener.feature_scale  # undo the current scale
        total, square, count = total + z.sum(0), square + (z**2).sum(0), count + len(z)
    mean = total / count
    return (square / count - mean**2).sqrt()


def data_id(split: SplitFeatures) -> str:
    """Identifies a split's clips, transcripts and lengths (what the batch order depends on)."""
    digest = hashlib.sha256()
    for u in split.utterances:
        digest.update(f"{u.id}\t{u.text}\t{u.frames}\n".encode())
    return digest.hexdigest()[:16]


def load_model(path: pathlib.Path) -> tuple[ListenAttendSpell, Tokenizer, dict]:
    """A checkpoint's model (eval mode), tokenizer and training state, for export and evaluation."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    model = ListenAttendSpell(ListenAttendSpellConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    # Today's tokenizer (its decoder may have been fixed since), provided it has the run's vocabulary.
    tokenizer = vocabulary.character_tokenizer()
    if Tokenizer.from_str(ckpt["tokenizer"]).get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"{path}: the run's character vocabulary differs from export/speech/vocabulary.py's")
    return model.eval(), tokenizer, ckpt["state"]


def save_weights(checkpoint: pathlib.Path, out: pathlib.Path, dtype: torch.dtype = torch.float16) -> None:
    """A checkpoint's model without optimizer or RNG state: what another machine needs to go on training from
    it (`--init-weights`) or to export it, at a sixth (float16) or a third (float32) of the size; the config,
    tokenizer and training state ride along."""
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    # Parameters only: buffers (the feature scale) are tiny and keep full precision.
    parameters = {name for name, _ in ListenAttendSpell(ListenAttendSpellConfig(**ckpt["config"])).named_parameters()}
    weights = {k: v.to(dtype) if k in parameters else v for k, v in ckpt["model"].items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": weights, "arch": ckpt["arch"], "config": ckpt["config"], "tokenizer": ckpt["tokenizer"],
                "state": ckpt["state"]}, out)


def load_weights(path: pathlib.Path) -> dict:
    """A `save_weights` file (or a full checkpoint) as a checkpoint without optimizer, weights in float32."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    ckpt["model"] = {k: v.float() if v.is_floating_point() else v for k, v in ckpt["model"].items()}
    ckpt.pop("optimizer", None)
    return ckpt


def fresh_state() -> dict:
    """The training state of a run that has not taken a step (a checkpoint's `state` carries it on)."""
    return {"step": 0, "epoch": 0, "batch_in_epoch": 0, "audio_seconds": 0.0, "seconds": 0.0, "best_cer": math.inf,
            "history": []}


DEFAULT_FEATURES = pathlib.Path.home() / ".cache/attnserve/speech-features"


def train(corpus: pathlib.Path, run: pathlib.Path, minutes: float, cfg: ListenAttendSpellConfig, opts: TrainOptions,
          features: pathlib.Path = DEFAULT_FEATURES, init_weights: pathlib.Path | None = None,
          fresh_optimizer: bool = False):
    """Trains for `minutes`, resuming from `run`/last.pt if there is one.

    Args:
        init_weights: without a last.pt, start from these weights (`save_weights`) and their training state,
            at a new epoch, with a fresh optimizer and no best CER yet (this run's dev decides best.pt).
        fresh_optimizer: resume last.pt's weights and state but not its optimizer (e.g. after the batch size
            changed).
    """
    # Data: cached features of the training split and the seen-voice dev split; transcripts as ids.
    run.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(opts.seed)
    tokenizer = vocabulary.character_tokenizer()
    train_split, train_targets, dev_split, dev_targets = _splits(corpus, features, tokenizer, opts)

    # Model and optimizer: resumed from last.pt, started from other weights, or fresh (feature scale measured
    # on training clips). The model moves to its device before the optimizer is made (and its state loaded).
    ckpt = _starting_point(run, init_weights)
    model, state = _model_and_state(ckpt, cfg, train_split, opts)
    state["data"] = data_id(train_split)
    state["ctc_weight"] = opts.ctc_weight  # the loss's mix, for the model card
    model.to(opts.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=opts.lr)
    if ckpt is not None and "optimizer" in ckpt and not fresh_optimizer:
        optimizer.load_state_dict(ckpt["optimizer"])  # its state moves to the parameters' device
    elif ckpt is not None:
        log.info("fresh optimizer")
    log.info("model: %s, %.2fM parameters, on %s", model.cfg, sum(p.numel() for p in model.parameters()) / 1e6,
             opts.device)

    # Epochs until the deadline, with a checkpoint every opts.checkpoint_minutes and at the end.
    run_epochs(model, optimizer, (train_split, train_targets), (dev_split, dev_targets), tokenizer, state, run,
               minutes, opts)


def _splits(corpus: pathlib.Path, features: pathlib.Path, tokenizer, opts: TrainOptions):
    """The training and dev splits (dev cut to opts.dev_clips) and their transcripts as character ids."""
    train_split = load_split(corpus, "train", features)
    dev_split = load_split(corpus, "dev", features)
    if opts.dev_clips is not None:
        dev_split = dataclasses.replace(dev_split, utterances=dev_split.utterances[: opts.dev_clips])
    train_targets = vocabulary.encode(tokenizer, [u.text for u in train_split.utterances])
    dev_targets = vocabulary.encode(tokenizer, [u.text for u in dev_split.utterances])
    log.info("train %d clips (%.2f h), dev %d clips (%.2f h)", len(train_targets), train_split.seconds / 3600,
             len(dev_targets), dev_split.seconds / 3600)
    return train_split, train_targets, dev_split, dev_targets


def _starting_point(run: pathlib.Path, init_weights: pathlib.Path | None) -> dict | None:
    """The run's last.pt; without one, `init_weights` at a new epoch with no best CER yet; else None (fresh)."""
    last = run / "last.pt"
    ckpt = torch.load(last, map_location="cpu", weights_only=False) if last.exists() else None
    if ckpt is None and init_weights is not None:
        ckpt = load_weights(init_weights)
        ckpt["state"] = {**ckpt["state"], "epoch": ckpt["state"]["epoch"] + 1, "batch_in_epoch": 0,
                         "best_cer": math.inf}
        log.info("starting from %s (step %d)", init_weights, ckpt["state"]["step"])
    elif ckpt is not None and init_weights is not None:
        log.info("%s exists: resuming it, not %s", last, init_weights)
    return ckpt


def _model_and_state(ckpt: dict | None, cfg: ListenAttendSpellConfig, train_split, opts: TrainOptions):
    """The model (the checkpoint's own config wins over `cfg`) and the training state to go on from."""
    if ckpt is not None and ListenAttendSpellConfig(**ckpt["config"]) != cfg:
        log.info("resuming with the run's own model config; the command line's differs")
        cfg = ListenAttendSpellConfig(**ckpt["config"])
    model = ListenAttendSpell(cfg)
    if ckpt is None:
        model.set_feature_scale(feature_scale(model, train_split, opts.scale_clips, opts.seed))
        return model, fresh_state()
    model.load_state_dict(ckpt["model"])
    state = ckpt["state"]
    if "rng" in ckpt:
        torch.set_rng_state(ckpt["rng"])
    log.info("resumed at step %d (%.2f h of audio seen)", state["step"], state["audio_seconds"] / 3600)
    if state.get("data") != data_id(train_split):
        # A rebuilt corpus orders its batches differently: the saved place in the epoch means nothing.
        log.info("the training clips changed since the last start: new epoch")
        state["epoch"], state["batch_in_epoch"] = state["epoch"] + 1, 0
    return model, state


def run_epochs(model, optimizer, train_data, dev_data, tokenizer, state, run, minutes, opts) -> None:
    split, targets = train_data
    augment = SpecAugment(opts.augment)
    frames = [u.frames for u in split.utterances]
    model.train()
    clock = RunClock(run, minutes, opts.checkpoint_minutes)
    while clock.running():
        batches = make_batches(frames, opts, random.Random(opts.seed + state["epoch"]))
        progress = tqdm(batches[state["batch_in_epoch"] :], desc=f"epoch {state['epoch']}", mininterval=30)
        for indices in progress:
            started = time.monotonic()
            for group in optimizer.param_groups:
                group["lr"] = inverse_sqrt(state["step"] + 1, opts)
            batch = collate(split, targets, indices, model.cfg.time_reduction).to(opts.device)
            with on_device(opts.device):
                references = [split.utterances[i].text for i in indices] if opts.mwer_weight else None
                loss = joint_loss(model, batch, opts, augment, references, tokenizer)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), opts.clip_norm)
            optimizer.step()
            state["step"] += 1
            state["batch_in_epoch"] += 1
            state["audio_seconds"] += batch.seconds
            state["seconds"] += time.monotonic() - started
            speed = state["audio_seconds"] / max(state["seconds"], 1e-9)
            progress.set_postfix(loss=f"{loss.item():.3f}", audio_s_per_s=f"{speed:.1f}", refresh=False)
            if state["step"] % 50 == 0:
                log.info("step %d epoch %d loss %.3f lr %.2e audio %.2f h, %.1f audio-s/s", state["step"],
                         state["epoch"], loss.item(), optimizer.param_groups[0]["lr"], state["audio_seconds"] / 3600,
                         speed)
            if clock.after_step(lambda: checkpoint(model, optimizer, dev_data, tokenizer, state, run, opts)):
                return
        state["epoch"] += 1
        state["batch_in_epoch"] = 0


def checkpoint(model, optimizer, dev_data, tokenizer, state, run, opts) -> None:
    started = time.monotonic()
    scores = evaluate(model, *dev_data, tokenizer, opts)
    log.info(
        "step %d dev attention loss %.3f ctc loss %.3f CER %.2f%% WER %.2f%% (CTC CER %.2f%%), best CER %.2f%% [%.0f s]",
        state["step"], scores["attention_loss"], scores["ctc_loss"], 100 * scores["cer"], 100 * scores["wer"],
        100 * scores["ctc_cer"], 100 * state["best_cer"], time.monotonic() - started,
    )
    for example in scores["examples"]:
        log.info("  ref: %s\n  hyp: %s", example["reference"], example["hypothesis"])
    state["history"].append({"step": state["step"], "audio_hours": state["audio_seconds"] / 3600,
                             "train_seconds": state["seconds"], **{k: v for k, v in scores.items() if k != "examples"}})
    if scores["cer"] < state["best_cer"]:
        state["best_cer"] = scores["cer"]
        save_checkpoint(run / "best.pt", model, optimizer, state, tokenizer)
    save_checkpoint(run / "last.pt", model, optimizer, state, tokenizer)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=pathlib.Path, default=pathlib.Path("data/speech"))
    parser.add_argument("--run", type=pathlib.Path, default=pathlib.Path.home() / ".cache/attnserve/runs/speech-en")
    parser.add_argument("--minutes", type=float, default=60.0, help="stop (with a checkpoint) after this long")
    parser.add_argument("--features", type=pathlib.Path, default=DEFAULT_FEATURES, help="feature cache folder")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--checkpoint-minutes", type=float, default=TrainOptions.checkpoint_minutes)
    parser.add_argument("--dev-clips", type=int, help="score only the first N dev clips at each checkpoint")
    parser.add_argument("--batch-seconds", type=float, default=TrainOptions.batch_seconds)
    parser.add_argument("--max-batch", type=int, default=TrainOptions.max_batch, help="most clips per batch")
    parser.add_argument("--device", default=TrainOptions.device, help="cpu or cuda")
    parser.add_argument("--bf16-listener", action="store_true",
                        help="the listener in bf16 autocast: 1.3x per training step on an AMX CPU (bench/README); "
                             "refused on CPUs without bf16 units")
    parser.add_argument("--init-weights", type=pathlib.Path,
                        help="without RUN/last.pt, start from these weights (a --save-weights file)")
    parser.add_argument("--fresh-optimizer", action="store_true", help="resume RUN/last.pt without its optimizer")
    parser.add_argument("--save-weights", type=pathlib.Path, metavar="OUT",
                        help="write a checkpoint's weights without optimizer to OUT, and exit")
    parser.add_argument("--weights-of", default="last.pt", help="the RUN checkpoint --save-weights reads")
    parser.add_argument("--weights-dtype", choices=["float16", "float32"], default="float16")
    parser.add_argument("--lr", type=float, default=TrainOptions.lr)
    parser.add_argument("--listener-hidden", type=int, default=ListenAttendSpellConfig.listener_hidden)
    parser.add_argument("--speller-hidden", type=int, default=ListenAttendSpellConfig.speller_hidden)
    parser.add_argument("--stack-frames", type=int, default=ListenAttendSpellConfig.stack_frames,
                        help="log-mel frames stacked side by side before the first BiLSTM")
    parser.add_argument("--bottom-layers", type=int, default=ListenAttendSpellConfig.bottom_layers,
                        help="BiLSTMs at the stacked frame rate, before the pyramid")
    parser.add_argument("--pyramid-layers", type=int, default=ListenAttendSpellConfig.pyramid_layers)
    parser.add_argument("--ctc-layer", type=int, default=ListenAttendSpellConfig.ctc_layer,
                        help="pyramid layers below the CTC head")
    parser.add_argument("--ctc-weight", type=float, default=TrainOptions.ctc_weight)
    parser.add_argument("--mwer-weight", type=float, default=TrainOptions.mwer_weight,
                        help="fine-tune with this weight on the expected word errors of each clip's own candidates "
                             "(export/speech/mwer.py); 0 = off")
    parser.add_argument("--mwer-draws", type=int, default=TrainOptions.mwer_draws,
                        help="random candidates per clip beside the greedy one")
    parser.add_argument("--warp", type=float, nargs=2, metavar=("MIN", "MAX"),
                        default=(AugmentOptions.warp_min, AugmentOptions.warp_max),
                        help="range of the random mel-axis warp factor (above 1: spectra moved up, as a smaller "
                             "vocal tract; default %(default)s)")
    return parser


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    if args.bf16_listener and (why := cpu_bf16.refusal("--bf16-listener", args.device)):
        parser.error(why)
    if args.save_weights:
        save_weights(args.run / args.weights_of, args.save_weights, getattr(torch, args.weights_dtype))
        return
    args.run.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(message)s",
        handlers=[logging.FileHandler(args.run / "train.log"), logging.StreamHandler()],
    )
    torch.set_num_threads(args.threads)
    if torch.device(args.device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    cfg = ListenAttendSpellConfig(
        listener_hidden=args.listener_hidden, speller_hidden=args.speller_hidden, stack_frames=args.stack_frames,
        bottom_layers=args.bottom_layers, pyramid_layers=args.pyramid_layers, ctc_layer=args.ctc_layer,
    )
    opts = TrainOptions(batch_seconds=args.batch_seconds, max_batch=args.max_batch, lr=args.lr, ctc_weight=args.ctc_weight,
                        checkpoint_minutes=args.checkpoint_minutes, dev_clips=args.dev_clips, device=args.device,
                        bf16_listener=args.bf16_listener, mwer_weight=args.mwer_weight, mwer_draws=args.mwer_draws,
                        augment=AugmentOptions(warp_min=args.warp[0], warp_max=args.warp[1]))
    train(args.corpus, args.run, args.minutes, cfg, opts, args.features, args.init_weights, args.fresh_optimizer)


if __name__ == "__main__":
    main()
