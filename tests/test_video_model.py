"""The clip captioner's export and its data: ONNX Runtime == PyTorch at several batch sizes and clip lengths,
the batch and frame axes stay symbolic in the graphs; clips are drawn the same from the same seed, the
compositional split holds exactly the held-out (verb, doer) pairs, action windows cover model frames, and a
training step on drawn clips lowers the loss."""

from __future__ import annotations

import numpy as np
import pytest

from attnserve.export.video import clips, scoring
from tiny_video import captioner, video_model, video_repo  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def exported(video_model, video_repo):
    return video_model, video_repo / "tiny-video" / "1"


def test_onnx_equals_pytorch_at_several_batch_sizes_and_clip_lengths(exported):
    from attnserve.export.video.export import parity

    model, folder = exported
    worst = parity(model, folder, shapes=((1, 4), (3, 2), (2, 9), (5, 1)), steps=5)
    assert set(worst) >= {"encoder_hidden_states", "encoder_keys", "logits", "cross_attentions"}
    assert max(worst.values()) < 1e-5, worst


def test_the_batch_and_frame_axes_stay_dynamic(exported):
    import onnx

    _, folder = exported
    encoder = onnx.load(str(folder / "encoder.onnx")).graph

    def dims(value):
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    assert dims(encoder.input[0]) == ["batch", "frames", 3, 16, 16]
    assert {o.name: dims(o) for o in encoder.output}["encoder_hidden_states"] == ["batch", "source", 8]
    decoder = onnx.load(str(folder / "decoder.onnx")).graph
    assert {i.name: dims(i) for i in decoder.input}["encoder_keys"] == ["batch", "source", 8]


@pytest.fixture(scope="module")
def sampler_parts():
    aspect = {name: 1.0 for name in clips.NAMES}
    return aspect, clips.held_out_pairs(1)


def test_clips_are_drawn_the_same_from_the_same_seed_and_split(sampler_parts):
    aspect, held = sampler_parts
    sampler = clips.ClipSampler(aspect, held)
    first, again = clips.generate(sampler, 1, "train", 5, 20), clips.generate(sampler, 1, "train", 10, 5)
    assert first[5:10] == again
    other = clips.generate(sampler, 1, "test", 5, 20)
    assert [c.caption for c in other] != [c.caption for c in first]
    assert clips.Clip.from_json(first[0].to_json()) == first[0]


def test_held_out_pairs_appear_only_in_the_compositional_split(sampler_parts):
    aspect, held = sampler_parts
    assert len(held) == 2 * len(clips.VERBS) and {v for v, _ in held} == set(clips.VERBS)
    train = clips.generate(clips.ClipSampler(aspect, held), 1, "train", 0, 300)
    compositional = clips.generate(clips.ClipSampler(aspect, held, compositional=True), 1, "compositional", 0, 100)
    assert not any({(v, d) for v, d, _ in c.verbs} & held for c in train)
    assert all({(v, d) for v, d, _ in c.verbs} & held for c in compositional)
    assert {c.event for c in train} == set(clips.EVENTS)


def test_every_action_window_covers_model_frames_and_the_actors_move_only_inside_it(sampler_parts):
    aspect, held = sampler_parts
    for clip in clips.generate(clips.ClipSampler(aspect, held), 1, "dev", 0, 100):
        times = clips.sample_times(clip.duration)
        for verb, _, window in clip.verbs:
            assert verb in clip.caption.split() and clips.action_frames(window, times).sum() >= 2
        for actor in clip.actors:
            before, after = actor.at(actor.window[0] - 1e-6), actor.at(actor.window[1] + 1e-6)
            assert before == actor.at(0.0) and after == actor.at(clip.duration)


def test_temporal_and_spatial_pointing_score_the_attention_they_are_given(sampler_parts):
    aspect, held = sampler_parts
    clip = next(c for c in clips.generate(clips.ClipSampler(aspect, held), 1, "test", 0, 50) if c.event == "jump")
    words, grid = clip.caption.split(), 4
    inside = clips.action_frames(clip.verbs[0][2], clips.sample_times(clip.duration))
    attention = np.zeros((len(words), clips.FRAMES, grid * grid))
    attention[:, inside, :] = 1.0 / (inside.sum() * grid * grid)  # every word: all on the action frames
    trial = scoring.temporal_trials(words, attention, clip)[0]
    assert trial.verb == "jumps" and trial.mass == pytest.approx(1.0) and trial.chance == pytest.approx(inside.mean())
    name, box = clip.boxes(float(clips.sample_times(clip.duration)[0]))[0]
    col, row = int((box[0] + box[2]) / 2 * grid), int((box[1] + box[3]) / 2 * grid)
    attention[:] = 0
    attention[:, 0, row * grid + col] = 1.0  # every word: the cell at the object's centre in frame 0
    hits = scoring.spatial_trials(words, attention, clip, grid)
    assert [t.name for t in hits] == [name] * len(name.split()) and all(t.hit for t in hits)


def test_a_few_training_steps_on_drawn_clips_lower_the_loss():
    import torch

    from attnserve.export.video.train import ClipData, TrainOptions, loss_on
    from tiny_video import config

    torch.manual_seed(0)
    sprites = {name: np.full((8, 8, 4), 255, np.uint8) for name in clips.NAMES}
    cfg, opts = config(), TrainOptions(batch_size=8, large_share=0.5)
    data = ClipData(sprites, "train", cfg, opts)
    batch, drawn = data.batch(0, 8)
    assert batch.frames.shape == (8, cfg.frames, 3, 16, 16) and (batch.acting.sum(1) >= 1).all()
    model = captioner(seed=1).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    losses = []
    for _ in range(10):
        loss, _ = loss_on(model, batch, opts)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
