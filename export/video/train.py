"""Trains the clip captioner (export/video/model.py) on clips drawn on the fly (export/video/clips.py).

    python -m attnserve.export.video.train --run /work/data/video/runs/caption-video --minutes 60

Training clips are never stored: batch k holds training clips k*B .. k*B + B - 1, each drawn from its own
seed, so a resumed run continues with exactly the clips it would have seen, and no clip repeats. Seeded and
resumable as the other trainers: the run folder keeps `last.pt` (rerunning the same command continues from
it; `touch <run>/STOP` checkpoints and ends at once) and `best.pt` (highest dev exact match), and logs to
`<run>/train.log`. Only `dev` selects the model; `test` and `compositional` are for export/video/evaluate.py.

A share of the training clips (`large_share`) is drawn at twice the frame size and brought down by the
server's own resize (server/inputs/image.py), as the server resizes every decoded video frame.

The loss is the words' cross-entropy plus each training-only head's (model.py), weighted: per frame, the
objects visible in it (opacity at least one half), and whether an action is under way (the clip's action
windows). Version 1 trained its first 901 steps with the presence head over the whole clip (the objects the
caption names) at weight 0.1, then per frame at 0.5: objects were learned slowly (dev spatial pointing 9%).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import pathlib
import time

import numpy as np
import torch
from tokenizers import Tokenizer
from torch.nn import functional as F

from attnserve.export.common.training import RunClock, inverse_sqrt, save_checkpoint
from attnserve.export.video import clips, scoring, vocabulary
from attnserve.export.video.model import VideoCaptionerConfig, VideoShowAttendTell, normalize
from attnserve.export.video.render import FrameRenderer

log = logging.getLogger("attnserve.video.train")


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    # Clips per optimizer step.
    batch_size: int = 32
    # Peak learning rate (Adam) after `warmup_steps`, then inverse-square-root decay.
    lr: float = 2e-3
    warmup_steps: int = 200
    # Weights of the training-only heads' losses (binary cross-entropy, per clip).
    presence_weight: float = 0.5
    action_weight: float = 0.1
    label_smoothing: float = 0.05
    clip_norm: float = 5.0
    # Share of training clips drawn at twice the frame size and resized as the server resizes.
    large_share: float = 0.2
    seed: int = 1234
    # The corpus seed: which clips each split holds and which (verb, doer) pairs are held out.
    data_seed: int = 1
    # Minutes between checkpoints / dev evaluations; dev clips scored each time.
    checkpoint_minutes: float = 5.0
    dev_clips: int = 400


@dataclasses.dataclass
class Batch:
    frames: torch.Tensor  # (B, T, 3, H, W) normalised
    tgt_in: torch.Tensor  # (B, U) start + words
    tgt_out: torch.Tensor  # (B, U) words + EOS, <pad>-padded
    present: torch.Tensor  # (B, T, objects) 1 where the object is visible in the frame
    acting: torch.Tensor  # (B, T) 1 where a model frame lies in an action window


class ClipData:
    """Clips of one split drawn and rendered on demand, with their targets."""

    def __init__(self, sprites: dict, split: str, cfg: VideoCaptionerConfig, opts: TrainOptions):
        aspect = {name: s.shape[0] / s.shape[1] for name, s in sprites.items()}
        held_out = clips.held_out_pairs(opts.data_seed)
        self.sampler = clips.ClipSampler(aspect, held_out, compositional=split == "compositional")
        self.renderer = FrameRenderer(sprites)
        self.tokenizer = vocabulary.word_tokenizer()
        self.split, self.cfg, self.opts = split, cfg, opts
        self.object_index = {o.name: k for k, o in enumerate(clips.OBJECT_SET)}

    def clips(self, start: int, count: int) -> list[clips.Clip]:
        return clips.generate(self.sampler, self.opts.data_seed, self.split, start, count)

    def frames(self, clip: clips.Clip, large: bool) -> np.ndarray:
        """(T, S, S, 3) uint8 of the model's frames."""
        size = self.cfg.frame_size
        times = clips.sample_times(clip.duration, self.cfg.frames)
        if not large:
            return self.renderer.frames(clip, size, times)
        from PIL import Image

        from attnserve.server.inputs.image import resize

        return np.stack([resize(Image.fromarray(f), size, size) for f in self.renderer.frames(clip, 2 * size, times)])

    def batch(self, start: int, count: int) -> tuple[Batch, list[clips.Clip]]:
        drawn = self.clips(start, count)
        rng = np.random.default_rng([self.opts.seed, start])
        large = rng.random(count) < (self.opts.large_share if self.split == "train" else 0.0)
        frames = torch.from_numpy(np.stack([self.frames(c, bool(g)) for c, g in zip(drawn, large)]))
        targets = vocabulary.encode(self.tokenizer, [c.caption for c in drawn])
        u = max(len(t) for t in targets) + 1
        tgt = torch.full((count, u + 1), vocabulary.PAD_ID)
        for row, ids in enumerate(targets):
            ids = [vocabulary.START_ID, *ids, vocabulary.EOS_ID]
            tgt[row, : len(ids)] = torch.tensor(ids)
        present = torch.zeros(count, self.cfg.frames, len(clips.OBJECT_SET))
        acting = torch.zeros(count, self.cfg.frames)
        for row, clip in enumerate(drawn):
            times = clips.sample_times(clip.duration, self.cfg.frames)
            for t, when in enumerate(times):
                present[row, t, [self.object_index[name] for name, _ in clip.boxes(float(when))]] = 1
            for _, _, window in clip.verbs:
                acting[row] = torch.maximum(acting[row], torch.from_numpy(clips.action_frames(window, times)).float())
        return Batch(normalize(frames, self.cfg), tgt[:, :-1], tgt[:, 1:], present, acting), drawn


def loss_on(model: VideoShowAttendTell, batch: Batch, opts: TrainOptions) -> tuple[torch.Tensor, dict]:
    logits, _, presence, action = model(batch.frames, batch.tgt_in)
    words = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.tgt_out.reshape(-1),
                            ignore_index=vocabulary.PAD_ID, label_smoothing=opts.label_smoothing)
    objects = F.binary_cross_entropy_with_logits(presence, batch.present, reduction="sum") / presence[..., 0].numel()
    acting = F.binary_cross_entropy_with_logits(action, batch.acting, reduction="sum") / len(action)
    loss = words + opts.presence_weight * objects + opts.action_weight * acting
    return loss, {"words": words.item(), "presence": objects.item(), "action": acting.item()}


@torch.no_grad()
def evaluate(model: VideoShowAttendTell, data: ClipData, count: int, batch: int = 100) -> dict:
    """Greedy exact match, BLEU, temporal and spatial pointing of the first `count` clips of a split."""
    model.eval()
    hypotheses, references, temporal, spatial = [], [], [], []
    for start in range(0, count, batch):
        prepared, drawn = data.batch(start, min(batch, count - start))
        outputs, attentions = model.greedy_decode(prepared.frames)
        for clip, ids, attention in zip(drawn, outputs, attentions):
            text = data.tokenizer.decode(ids)
            hypotheses.append(text)
            references.append(clip.caption)
            grid = attention.numpy().reshape(len(ids), model.cfg.frames, -1)
            temporal += [t.mass for t in scoring.temporal_trials(text.split(), grid, clip)]
            spatial += [t.hit for t in scoring.spatial_trials(text.split(), grid, clip, model.cfg.grid)]
    model.train()
    return {"exact": scoring.exact_match(hypotheses, references), "bleu": scoring.bleu(hypotheses, references),
            "temporal": float(np.mean(temporal)) if temporal else 0.0,
            "spatial": float(np.mean(spatial)) if spatial else 0.0,
            "examples": list(zip(references[:3], hypotheses[:3]))}


def load_model(path: pathlib.Path) -> tuple[VideoShowAttendTell, Tokenizer, dict]:
    """A checkpoint's model (eval mode), tokenizer and training state."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    model = VideoShowAttendTell(_config(ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    return model.eval(), Tokenizer.from_str(ckpt["tokenizer"]), ckpt["state"]


def _config(fields: dict) -> VideoCaptionerConfig:
    return VideoCaptionerConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def train(sprites: dict, run: pathlib.Path, minutes: float, cfg: VideoCaptionerConfig, opts: TrainOptions) -> None:
    # Model and optimizer: fresh, or resumed from last.pt (whose config wins).
    run.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(opts.seed)
    last = run / "last.pt"
    ckpt = torch.load(last, map_location="cpu", weights_only=False) if last.exists() else None
    if ckpt is not None:
        cfg = _config(ckpt["config"])
    model = VideoShowAttendTell(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=opts.lr)
    state = {"step": 0, "clips": 0, "seconds": 0.0, "best_exact": -1.0, "history": []}
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        state = ckpt["state"]
        torch.set_rng_state(ckpt["rng"])
        log.info("resumed at step %d (%d clips seen)", state["step"], state["clips"])
    log.info("model: %s, %.2fM parameters", cfg, sum(p.numel() for p in model.parameters()) / 1e6)

    # Data: training clips drawn on the fly, dev clips the same way (the first dev_clips of the split).
    data, dev = ClipData(sprites, "train", cfg, opts), ClipData(sprites, "dev", cfg, opts)
    run_steps(model, optimizer, data, dev, state, run, minutes, opts)


def run_steps(model, optimizer, data: ClipData, dev: ClipData, state: dict, run, minutes: float,
              opts: TrainOptions) -> None:
    model.train()
    clock = RunClock(run, minutes, opts.checkpoint_minutes)
    while True:
        started = time.monotonic()
        for group in optimizer.param_groups:
            group["lr"] = inverse_sqrt(state["step"] + 1, opts)
        batch, _ = data.batch(state["step"] * opts.batch_size, opts.batch_size)
        loss, parts = loss_on(model, batch, opts)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opts.clip_norm)
        optimizer.step()
        state["step"] += 1
        state["clips"] += opts.batch_size
        state["seconds"] += time.monotonic() - started
        if state["step"] % 25 == 0:
            log.info("step %d words %.3f presence %.3f action %.3f lr %.2e, %.1f clips/s", state["step"],
                     parts["words"], parts["presence"], parts["action"], optimizer.param_groups[0]["lr"],
                     state["clips"] / max(state["seconds"], 1e-9))
        if clock.after_step(lambda: checkpoint(model, optimizer, dev, state, run, opts)):
            return


def checkpoint(model, optimizer, dev: ClipData, state: dict, run: pathlib.Path, opts: TrainOptions) -> None:
    started = time.monotonic()
    scores = evaluate(model, dev, opts.dev_clips)
    log.info("step %d dev exact %.2f%% BLEU %.1f temporal %.2f%% spatial %.2f%%, best exact %.2f%% [%.0f s]",
             state["step"], 100 * scores["exact"], scores["bleu"], 100 * scores["temporal"], 100 * scores["spatial"],
             100 * max(state["best_exact"], 0), time.monotonic() - started)
    for reference, hypothesis in scores["examples"]:
        log.info("  ref: %s\n  hyp: %s", reference, hypothesis)
    state["history"].append({"step": state["step"], "clips": state["clips"], "train_seconds": state["seconds"],
                             **{k: v for k, v in scores.items() if k != "examples"}})
    if scores["exact"] > state["best_exact"]:
        state["best_exact"] = scores["exact"]
        save_checkpoint(run / "best.pt", model, optimizer, state, dev.tokenizer)
    save_checkpoint(run / "last.pt", model, optimizer, state, dev.tokenizer)


def main() -> None:
    from attnserve.export.image import objects

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=pathlib.Path, default=pathlib.Path("/work/data/video/runs/caption-video"))
    parser.add_argument("--minutes", type=float, default=60.0, help="stop (with a checkpoint) after this long")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint-minutes", type=float, default=TrainOptions.checkpoint_minutes)
    parser.add_argument("--batch-size", type=int, default=TrainOptions.batch_size)
    parser.add_argument("--lr", type=float, default=TrainOptions.lr)
    parser.add_argument("--frame-size", type=int, default=VideoCaptionerConfig.frame_size, help="a new run only")
    parser.add_argument("--stages", type=int, nargs="+", default=list(VideoCaptionerConfig.stages), help="a new run only")
    args = parser.parse_args()
    args.run.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        handlers=[logging.FileHandler(args.run / "train.log"), logging.StreamHandler()])
    torch.set_num_threads(args.threads)
    opts = TrainOptions(batch_size=args.batch_size, lr=args.lr, checkpoint_minutes=args.checkpoint_minutes)
    cfg = VideoCaptionerConfig(frame_size=args.frame_size, stages=tuple(args.stages))
    if objects.CLDR_ANNOTATIONS.exists():  # Debian unicode-cldr-core: the names are CLDR's, as for images
        objects.check_names(objects=clips.OBJECT_SET)
    sprites = objects.render_sprites(objects=clips.OBJECT_SET)
    train(sprites, args.run, args.minutes, cfg, opts)


if __name__ == "__main__":
    main()
