"""Extending the shared vocabulary with characters it turned into <unk>: every other text tokenizes exactly as
before, each new character is one new token that decodes back to itself, and the extended checkpoint rebuilds
a model whose scores for the old vocabulary are unchanged and whose new tokens start out as <unk>."""

from __future__ import annotations

import torch

from attnserve.export.common.training import checkpoint_fields
from attnserve.export.translation.architectures import build_model
from attnserve.export.translation.extend_vocabulary import extend_checkpoint, extended_tokenizer, unknown_characters

NEW_TEXT = "他說謊了，狼來了。"
OLD_TEXTS = ["這個按鈕會關閉視窗", "This button closes the window", "The weather is nice today"]


def test_unknown_characters_are_counted_and_become_single_new_tokens(tiny_tokenizer):
    counts = unknown_characters(tiny_tokenizer, [NEW_TEXT, "狼"])
    assert counts["狼"] == 2 and counts["謊"] == 1
    unk = tiny_tokenizer.token_to_id("<unk>")
    assert all(tiny_tokenizer.encode(ch).ids[-1] == unk for ch in counts)
    size = tiny_tokenizer.get_vocab_size()
    extended = extended_tokenizer(tiny_tokenizer, ["狼", "謊", "狼"])
    assert extended.get_vocab_size() == size + 2
    assert extended.token_to_id("狼") == size and extended.token_to_id("謊") == size + 1
    for text in OLD_TEXTS:
        assert extended.encode(text).ids == tiny_tokenizer.encode(text).ids
    ids = extended.encode("狼謊").ids
    assert size in ids and size + 1 in ids and extended.token_to_id("<unk>") not in ids
    assert extended.decode(ids) == "狼謊"


def test_the_extended_checkpoint_keeps_old_scores_and_starts_new_tokens_as_unk(tiny_torch_model, tiny_tokenizer):
    checkpoint = {"model": tiny_torch_model.state_dict(), **checkpoint_fields(tiny_torch_model),
                  "tokenizer": tiny_tokenizer.to_str(), "state": {"step": 7}}
    extended = extend_checkpoint(checkpoint, ["狼", "謊"])
    size = tiny_tokenizer.get_vocab_size()
    assert extended["config"]["vocab_size"] == size + 2 and extended["state"]["vocabulary_extended"]["added"] == 2
    model = build_model(extended["arch"], extended["config"]).eval()
    model.load_state_dict(extended["model"])
    src = torch.tensor([tiny_tokenizer.encode(OLD_TEXTS[0]).ids])
    tgt = torch.tensor([[4, 9, 12, 20]])
    masks = torch.ones_like(src), torch.ones_like(tgt)
    with torch.no_grad():
        before = tiny_torch_model(src, masks[0], tgt, masks[1])
        after = model(src, masks[0], tgt, masks[1])
    torch.testing.assert_close(after[..., :size], before)
    unk = tiny_tokenizer.token_to_id("<unk>")
    torch.testing.assert_close(after[..., size:], before[..., unk : unk + 1].expand(-1, -1, 2))


def test_training_continues_from_an_extended_checkpoint_and_stops_when_asked(tiny_torch_model, tiny_tokenizer, tmp_path):
    from attnserve.export.translation import train
    from attnserve.export.translation.architectures import load_checkpoint

    torch.set_num_threads(1)
    start = tmp_path / "extended.pt"
    torch.save(extend_checkpoint({"model": tiny_torch_model.state_dict(), **checkpoint_fields(tiny_torch_model),
                                  "tokenizer": tiny_tokenizer.to_str()}, ["狼"]), start)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "dev"):
        (corpus / f"{split}.tsv").write_text("".join(f"The wolf came {i}\t狼來了 {i}\n" for i in range(40)))
        (corpus / f"{split}.source").write_text("tatoeba\n" * 40)
    run = tmp_path / "run"
    run.mkdir()
    (run / "STOP").touch()  # `touch RUN/STOP`: one step, a checkpoint, and the end, however long it may run
    train.train(corpus, run, 30.0, "transformer", {}, train.TrainOptions(batch_tokens=200), init_from=start)
    model, tokenizer = load_checkpoint(run / "last.pt")
    assert model.cfg.vocab_size == tiny_tokenizer.get_vocab_size() + 1 and tokenizer.token_to_id("狼") is not None
    assert torch.load(run / "last.pt", weights_only=False)["state"]["step"] == 1 and not (run / "STOP").exists()
