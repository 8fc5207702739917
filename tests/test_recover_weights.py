"""A version folder's graphs give back the exact weights they were exported from, ready to train further."""

import pytest
import torch
from tokenizers import Tokenizer

from attnserve.export.translation import recover_weights, train
from attnserve.export.translation.architectures import load_checkpoint


def test_recovered_weights_equal_the_exported_model(tiny_torch_model, tiny_model_dir):
    checkpoint = recover_weights.recover(tiny_model_dir)
    original = tiny_torch_model.state_dict()
    assert checkpoint["model"].keys() == original.keys()
    for name, value in original.items():
        assert torch.equal(checkpoint["model"][name], value), name
    assert checkpoint["config"] == {**checkpoint["config"], "d_model": tiny_torch_model.cfg.d_model,
                                    "encoder_layers": tiny_torch_model.cfg.encoder_layers}


def test_a_graph_whose_matrix_has_no_bias_is_refused(tiny_model_dir, tmp_path, monkeypatch):
    import onnx

    graph = onnx.load(str(tiny_model_dir / "encoder.onnx"))
    add = next(n for n in graph.graph.node if n.op_type == "Add" and any(i.endswith("q_proj.bias") for i in n.input))
    add.op_type = "Sub"  # the matrix no longer meets its bias in an Add
    onnx.save(graph, str(tmp_path / "encoder.onnx"))
    with pytest.raises(ValueError, match="cannot tell whose matrix"):
        recover_weights.graph_weights(tmp_path / "encoder.onnx")


def test_training_continues_from_recovered_weights(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    start = tmp_path / "recovered.pt"
    torch.save(recover_weights.recover(tiny_model_dir), start)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pairs = "".join(f"Open file {i}\t開啟檔案 {i}\n" for i in range(40))
    for split in ("train", "dev"):
        (corpus / f"{split}.tsv").write_text(pairs)
        (corpus / f"{split}.source").write_text("gettext/x\n" * 40)
    run = tmp_path / "run"
    opts = train.TrainOptions(batch_tokens=200, checkpoint_minutes=0.0)
    train.train(corpus, run, 0.02, "transformer", {}, opts, init_from=start)
    model, tokenizer = load_checkpoint(run / "last.pt")
    recovered, _ = load_checkpoint(start)
    assert tokenizer.get_vocab() == Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")).get_vocab()
    assert model.cfg == recovered.cfg
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, recovered.state_dict()[k])]
    assert changed, "a training step should have moved the weights"
    assert torch.load(run / "last.pt", weights_only=False)["state"]["initialised_from"]["checkpoint"] == str(start)
