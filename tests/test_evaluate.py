"""The translation evaluation scores served beam search per domain, beside greedy."""

import functools

import pytest
import torch

from attnserve.export.common.training import checkpoint_fields
from attnserve.export.translation import evaluate
from conftest import TINY_MODEL_NAME

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PAIRS = [("Open the file", "開啟檔案", "gettext/app"), ("I like tea.", "我喜歡茶。", "tatoeba"),
         ("window", "視窗", "cedict"), ("Close the window", "關閉視窗", "gettext/app"), ("Hello!", "你好!", "hsk")]


def test_served_beam_search_is_scored_by_domain(tiny_torch_model, tiny_tokenizer, tiny_model_repo, tmp_path,
                                                monkeypatch):
    # The tiny model has 128 positions and serves 40 new tokens: translate fewer than the default 128.
    for name in ("translate", "translate_served"):
        monkeypatch.setattr(evaluate, name, functools.partial(getattr(evaluate, name), max_new=30))
    checkpoint = tmp_path / "tiny.pt"
    torch.save({"model": tiny_torch_model.state_dict(), **checkpoint_fields(tiny_torch_model),
                "tokenizer": tiny_tokenizer.to_str(), "state": {}}, checkpoint)
    split = tmp_path / "dev.tsv"
    split.write_text("".join(f"{en}\t{zh}\n" for en, zh, _ in PAIRS))
    split.with_suffix(".source").write_text("".join(f"{family}\n" for *_, family in PAIRS))
    report = evaluate.evaluate(checkpoint, split, 0, 2, served=(tiny_model_repo, TINY_MODEL_NAME), beam_size=2)
    for direction in report["directions"].values():
        beam = direction["served_beam"]
        assert beam["beam_size"] == 2
        assert {d: r["pairs"] for d, r in beam["by_domain"].items()} == {"everyday": 2, "dictionary": 1, "software": 2}
        assert beam["by_domain"].keys() == direction["by_domain"].keys()
        assert all({"bleu", "chrf"} <= r.keys() for r in beam["by_domain"].values())
