"""The captioner's data, model and export: scenes are deterministic by seed and their captions follow from
their geometry; the compositional split holds exactly the held-out pairs; every caption is in the word
vocabulary; pointing accuracy scores what it says; the exported graphs equal PyTorch (ONNX == PyTorch);
training lowers the loss and checkpoints round-trip."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pytest
import torch

from attnserve.export.common.training import load_checkpoint
from attnserve.export.image import build, export, scenes, scoring, train, vocabulary
from attnserve.export.image.model import ShowAttendTell, ShowAttendTellConfig
from attnserve.export.image.objects import OBJECTS
from attnserve.export.image.scenes import Placed, Scene
from tiny_image import captioner, export_repo

NAMES = [o.name for o in OBJECTS]


def fake_sprites() -> dict[str, np.ndarray]:
    """A coloured, differently shaped RGBA sprite per object (the tests need no emoji font)."""
    rng = np.random.default_rng(0)
    sprites = {}
    for k, name in enumerate(NAMES):
        h, w = 40 + k % 7 * 5, 40 + k % 5 * 6
        sprite = np.zeros((h, w, 4), np.uint8)
        sprite[4:-4, 4:-4, :3] = rng.integers(0, 256, 3)
        sprite[4:-4, 4:-4, 3] = 255
        sprites[name] = sprite
    return sprites


@pytest.fixture(scope="module")
def sampler() -> scenes.SceneSampler:
    aspect = {n: s.shape[0] / s.shape[1] for n, s in fake_sprites().items()}
    return scenes.SceneSampler(aspect, scenes.held_out_pairs(7))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("scenes")
    build.build(out, 7, 16, {"train": 96, "dev": 16, "compositional": 16}, fake_sprites(), large_share=0.3)
    return out



pytestmark = pytest.mark.usefixtures("torch_one_thread")

# ---- scenes --------------------------------------------------------------------------------------------


def test_scenes_are_deterministic_by_seed_and_index(sampler):
    first, again = scenes.generate(sampler, 3, "train", 30), scenes.generate(sampler, 3, "train", 30)
    assert first == again
    assert first != scenes.generate(sampler, 4, "train", 30)
    alone = sampler.sample(np.random.default_rng([3, scenes.SPLIT_IDS["train"], 17]), "train_000017")
    assert alone == first[17]
    sprites = fake_sprites()
    assert np.array_equal(scenes.render(first[5], sprites, 32), scenes.render(again[5], sprites, 32))


def test_captions_follow_from_the_geometry(sampler):
    graphs = scenes.generate(sampler, 5, "test", 400)
    assert {s.kind for s in graphs} == set(scenes.KINDS)
    for s in graphs:
        boxes = [o.box for o in s.objects]
        assert all(0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1 for x0, y0, x1, y1 in boxes)
        assert not scenes._overlap(list(s.objects))
        if s.kind == "one":
            side = max(boxes[0][2] - boxes[0][0], boxes[0][3] - boxes[0][1])
            assert s.caption.split()[1] == ("small" if side <= scenes.SIZES["small"][1] else "big")
        if s.kind == "pair":  # the first-named object is the left or upper one, clearly so
            (ax, ay), (bx, by) = s.objects[0].centre, s.objects[1].centre
            if s.relation == "to the left of":
                assert bx - ax >= scenes.AXIS_MARGIN * abs(by - ay)
            else:
                assert s.relation == "above" and by - ay >= scenes.AXIS_MARGIN * abs(bx - ax)
        if s.kind == "group":
            assert s.objects[0].name == s.objects[1].name != s.objects[2].name
            assert all(scenes._relation(o, s.objects[2]) == s.relation for o in s.objects[:2])
    assert scenes.caption("group", ["fish", "umbrella"], "below") == "two fish below an umbrella"
    assert scenes.caption("pair", ["red apple", "bus"], "above") == "a red apple above a bus"


def test_the_compositional_split_holds_exactly_the_held_out_pairs(sampler):
    held_out = scenes.held_out_pairs(7)
    assert 36 <= len(held_out) <= 40 and all(sum(n in p for p in held_out) <= 2 for n in NAMES)
    seen = scenes.generate(sampler, 7, "train", 600)
    together = {frozenset(o.name for o in s.objects) for s in seen if s.kind in ("pair", "group")}
    assert not together & held_out
    compositional = scenes.SceneSampler(sampler.aspect, held_out, compositional=True)
    for s in scenes.generate(compositional, 7, "compositional", 100):
        assert s.kind in ("pair", "group") and frozenset(o.name for o in s.objects) in held_out


def test_the_built_corpus_reads_back_and_resizes_large_scenes_as_the_server_does(corpus):
    images, graphs = build.load_split(corpus, "train")
    assert images.shape == (96, 16, 16, 3) and images.dtype == np.uint8 and len(graphs) == 96
    again, _ = build.load_split(corpus, "train")
    assert np.array_equal(images, again)
    sprites = fake_sprites()
    drawn_small = [np.array_equal(images[i], scenes.render(g, sprites, 16)) for i, g in enumerate(graphs)]
    assert 0 < drawn_small.count(False) < 96  # a share was drawn large and resized


# ---- vocabulary and scoring ----------------------------------------------------------------------------


def test_every_caption_is_in_the_word_vocabulary(sampler):
    tokenizer = vocabulary.word_tokenizer()
    captions = [s.caption for s in scenes.generate(sampler, 9, "dev", 300)] + [o.plural for o in OBJECTS]
    ids = vocabulary.encode(tokenizer, captions)
    assert [tokenizer.decode(x) for x in ids] == captions
    assert len(ids[0]) == len(captions[0].split())  # one piece per word
    with pytest.raises(ValueError, match="outside the captioner's vocabulary"):
        vocabulary.encode(tokenizer, ["a purple giraffe"])


def test_pointing_hits_when_the_most_attended_cell_lies_in_the_named_box():
    scene = Scene("s", "pair", "a dog to the left of a red apple",
                  (Placed("dog", (0.0, 0.0, 0.5, 0.5)), Placed("red apple", (0.5, 0.5, 1.0, 1.0))),
                  "to the left of", {})
    words = scene.caption.split()
    assert scoring.mentions(words) == [("dog", [1]), ("red apple", [7, 8])]
    attention = np.full((len(words), 16), 0.01)
    attention[1, 0] = 1  # dog: row 0 col 0, inside the dog's box
    attention[7, 15] = 1  # red: row 3 col 3, inside the apple's box
    attention[8, 3] = 1  # apple: row 0 col 3, outside it
    assert scoring.pointing_trials(words, attention, scene, 4) == [True, True, False]
    assert scoring.pointing_trials(["a", "bus"], attention[:2], scene, 4) == [False]  # no bus in the scene
    assert scoring.hit_share("dog", scene, 4) == 0.25
    assert scoring.exact_match(["a b", "c"], ["a b", "d"]) == 0.5


# ---- model, export, training ---------------------------------------------------------------------------


@pytest.mark.parametrize("changes", [{}, {"stages": (6, 8), "fine_grid": True}], ids=["grid", "fine-grid"])
def test_onnx_equals_pytorch(tmp_path, changes):
    model = captioner(seed=1, **changes)
    assert model.cfg.grid == 4  # 16 pixels: one stage of pooling, or two and the fine grid
    worst = export.parity(model, export_repo(model, tmp_path) / "tiny-caption" / "1")
    assert set(worst) == set(export.ENCODER_OUTPUTS + export.DECODER_OUTPUTS)
    assert max(worst.values()) < 1e-5
    assert not model.training  # exporting leaves the model as it found it


def test_attention_rows_are_distributions_over_the_grid():
    model = captioner(seed=2)
    outputs, attentions = model.greedy_decode(torch.randn(3, 3, 16, 16))
    for ids, weights in zip(outputs, attentions):
        assert weights.shape == (len(ids), 16)
        np.testing.assert_allclose(weights.sum(-1).numpy(), 1, atol=1e-5)


def test_training_lowers_the_loss_and_checkpoints_round_trip(corpus, tmp_path):
    torch.manual_seed(0)
    model = captioner(seed=3).train()
    tokenizer = vocabulary.word_tokenizer()
    split = train.load(corpus, "train", tokenizer)
    opts = train.TrainOptions(lr=2e-2)
    batch = train.collate(split, list(range(16)), model.cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=opts.lr)
    first, _ = train.loss_on(model.eval(), *batch, opts)
    for _ in range(20):
        loss, parts = train.loss_on(model.train(), *batch, opts)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    last, _ = train.loss_on(model.eval(), *batch, opts)
    assert last.item() < 0.6 * first.item() and parts["attention"] > 0
    train.save_checkpoint(tmp_path / "last.pt", model, optimizer, {"step": 20}, tokenizer)
    loaded, loaded_tokenizer, state = train.load_model(tmp_path / "last.pt")
    # The shared checkpoint reader rebuilds it too, from the family name it recorded.
    generic, _ = load_checkpoint(tmp_path / "last.pt", {"show-attend-tell": (ShowAttendTell, ShowAttendTellConfig)})
    assert state == {"step": 20} and loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert dataclasses.asdict(loaded.cfg) == dataclasses.asdict(model.cfg)
    pixels = batch[0][:4]
    with torch.no_grad():
        expected = model.eval().encode(pixels)[0]
        assert torch.equal(loaded.encode(pixels)[0], expected) and torch.equal(generic.encode(pixels)[0], expected)
