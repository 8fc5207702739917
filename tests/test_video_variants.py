"""Version 2's options of the clip captioner (export/video/model.py): the fine grid and keys from the cells
alone export with ONNX Runtime == PyTorch at several (batch, frames); a fine-grid model warm-started from a
coarse one (export/video/warm_start.py) computes what the coarse one did, until it learns otherwise."""

from __future__ import annotations

import dataclasses

import pytest

from tiny_video import captioner, export_repo

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_fine_grid_with_spatial_keys_exports_with_onnx_equal_to_pytorch(tmp_path):
    from attnserve.export.video.export import parity

    model = captioner(seed=3, fine_grid=True, spatial_keys=True)
    assert model.cfg.grid == 8  # 16-pixel frames, one stage: 4 x 4 cells, halved
    folder = export_repo(model, tmp_path) / "tiny-video" / "1"
    worst = parity(model, folder, shapes=((1, 4), (3, 2), (2, 7)), steps=4)
    assert max(worst.values()) < 1e-5, worst


def test_local_keys_export_with_onnx_equal_to_pytorch_and_read_the_cells_before_the_grid_convolutions(tmp_path):
    import torch

    from attnserve.export.video.export import parity

    model = captioner(seed=6, local_keys=True)
    folder = export_repo(model, tmp_path) / "tiny-video" / "1"
    worst = parity(model, folder, shapes=((1, 4), (3, 2), (2, 7)), steps=4)
    assert max(worst.values()) < 1e-5, worst
    # A change in one corner reaches the values of cells farther off (the grid convolution widens their view)
    # than it reaches the keys; cells off both change only by the BiLSTM's frame state, as the far corner does.
    frames = torch.randn(1, 2, 3, 16, 16)
    moved = frames.clone()
    moved[..., :2, :2] += 3.0
    with torch.no_grad():
        (memory, keys, *_), (memory2, keys2, *_) = model.features(frames), model.features(moved)

    def changed(a, b):  # frame 1's cells whose change is not just the far corner's
        d = (a - b)[0, 16:]
        return ((d - d[-1]).abs().amax(-1) > 1e-5).view(4, 4)

    by_value, by_key = changed(memory, memory2), changed(keys, keys2)
    assert by_key[0, 0] and (by_value | ~by_key).all() and by_value.sum() > by_key.sum()


def test_keys_without_positions_tell_cells_apart_only_by_what_they_show():
    import torch

    frames = torch.full((1, 2, 3, 16, 16), 0.3)  # nothing to see: every cell shows the same
    with torch.no_grad():
        _, keys, *_ = captioner(seed=7, local_keys=True, key_positions=False).features(frames)
        _, placed, *_ = captioner(seed=7, local_keys=True).features(frames)
    inner = keys[0, [5, 6, 9, 10]]  # the 2 x 2 cells away from the zero-padded border, frame 0
    assert torch.allclose(inner, inner[:1].expand_as(inner), atol=1e-6)
    assert not torch.allclose(placed[0, 5], placed[0, 6])


def test_spatial_keys_leave_the_frame_state_out_of_the_keys_only():
    import torch

    model = captioner(seed=4, spatial_keys=True)
    frames = torch.randn(2, 4, 3, 16, 16)
    memory, keys, _, _, _ = model.features(frames)
    cells, _ = model.frame_encoder(frames.flatten(0, 1))
    assert torch.allclose(keys, model.speller.attention.keys(cells.unflatten(0, (2, 4)).flatten(1, 2)))
    assert not torch.allclose(memory, cells.unflatten(0, (2, 4)).flatten(1, 2))  # the values keep the BiLSTM


def test_a_fine_grid_warm_started_from_a_coarse_model_computes_what_it_did():
    import torch

    from attnserve.export.video.model import VideoShowAttendTell
    from attnserve.export.video.warm_start import adapted_state

    coarse = captioner(seed=5)
    fine = VideoShowAttendTell(dataclasses.replace(coarse.cfg, fine_grid=True)).eval()
    frames = torch.randn(3, 4, 3, 16, 16)
    fine.load_state_dict(adapted_state(coarse, fine, frames, jitter=0.0))
    ids = torch.randint(4, coarse.cfg.vocab_size, (3, 5))
    with torch.no_grad():
        old_logits, old_weights, old_presence, *_ = coarse(frames, ids)
        new_logits, new_weights, new_presence, *_ = fine(frames, ids)
    assert torch.allclose(new_logits, old_logits, atol=1e-4)
    assert torch.allclose(new_presence, old_presence, atol=1e-4)
    # Each coarse cell's weight is shared by its four quarters.
    g = coarse.cfg.grid
    quarters = new_weights.view(3, 5, 4, g, 2, g, 2).sum((4, 6)).flatten(2)
    assert torch.allclose(quarters, old_weights, atol=1e-5)
    # With the default jitter the quarters differ, so the fine grid can learn to point within a coarse cell.
    fine.load_state_dict(adapted_state(coarse, fine, frames))
    with torch.no_grad():
        _, jittered, *_ = fine(frames, ids)
    assert not torch.allclose(jittered, new_weights)


def test_the_grounding_loss_asks_each_name_word_for_its_object():
    import numpy as np
    import torch

    from attnserve.export.video import clips
    from attnserve.export.video.train import ClipData, TrainOptions, loss_on
    from tiny_video import config

    sprites = {name: np.full((8, 8, 4), 255, np.uint8) for name in clips.NAMES}
    data = ClipData(sprites, "train", config(local_keys=True, key_positions=False), TrainOptions())
    batch, drawn = data.batch(0, 6)
    index = {o.name: k for k, o in enumerate(clips.OBJECT_SET)}
    for row, clip in enumerate(drawn):
        words = clip.caption.split()
        expected = [-1] * batch.named.shape[1]
        for name in {a.name for a in clip.actors}:
            n = len(name.split())
            for i in range(len(words) - n + 1):
                if words[i : i + n] == name.split():
                    expected[i : i + n] = [index[name]] * n
        assert batch.named[row].tolist() == expected, clip.caption
    model = captioner(seed=8, local_keys=True, key_positions=False)
    torch.manual_seed(0)
    plain, parts = loss_on(model.eval(), batch, TrainOptions())
    grounded, _ = loss_on(model, batch, TrainOptions(grounding_weight=0.5))
    assert parts["grounding"] > 0 and torch.isclose(grounded - plain, torch.tensor(0.5 * parts["grounding"]))
