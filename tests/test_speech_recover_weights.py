"""A speech version folder's graphs give back the exact weights and config they were exported from."""

import dataclasses

import onnx
import pytest
import torch

from attnserve.export.speech import recover_weights, vocabulary
from attnserve.export.speech.export import export_model
from attnserve.export.speech.model import ListenAttendSpell, ListenAttendSpellConfig
from attnserve.export.speech.train import load_weights


pytestmark = pytest.mark.usefixtures("torch_one_thread")


# The plain pyramid (CTC after 2 of 3 pyramid layers) and the stacked listener speech-en ships (CTC on the
# bottom layers), with a feature floor and sizes unlike the defaults, so none can come from a default.
CONFIGS = {
    "pyramid": dict(pyramid_layers=3, ctc_layer=2, feature_floor=-9.25),
    "stacked": dict(stack_frames=4, bottom_layers=2, pyramid_layers=1, ctc_layer=0, location_filters=3,
                    location_kernel=5),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def exported(request, tmp_path_factory):
    torch.manual_seed(3)
    cfg = ListenAttendSpellConfig(listener_hidden=12, speller_hidden=16, embed_dim=8, attention_dim=10,
                                  dropout=0.0, **CONFIGS[request.param])
    model = ListenAttendSpell(cfg).eval()
    model.set_feature_scale(torch.linspace(0.5, 2.0, cfg.n_mels))
    folder = export_model(model, vocabulary.character_tokenizer(), tmp_path_factory.mktemp("speech") / "x" / "1", "x")
    return model, folder


def test_recovered_weights_and_config_equal_the_exported_model(exported):
    model, folder = exported
    checkpoint = recover_weights.recover(folder, {"step": 120, "audio_seconds": 3600.0})
    recovered = ListenAttendSpellConfig(**checkpoint["config"])
    assert recovered.dropout == ListenAttendSpellConfig().dropout  # training only: not in the graphs
    assert dataclasses.replace(recovered, dropout=model.cfg.dropout) == model.cfg
    original = model.state_dict()
    assert checkpoint["model"].keys() == original.keys()
    for name, value in original.items():
        assert torch.equal(checkpoint["model"][name], value), name
    assert checkpoint["arch"] == "listen-attend-spell"
    assert checkpoint["state"]["step"] == 120 and checkpoint["state"]["recovered_from"] == str(folder)


def test_the_trainer_starts_from_a_recovered_file(exported, tmp_path):
    model, folder = exported
    torch.save(recover_weights.recover(folder), tmp_path / "recovered.pt")
    ckpt = load_weights(tmp_path / "recovered.pt")  # what `speech.train --init-weights` reads
    again = ListenAttendSpell(ListenAttendSpellConfig(**ckpt["config"]))
    again.load_state_dict(ckpt["model"])
    x = torch.randn(2, 64, model.cfg.n_mels) - 5
    mask = torch.ones(2, 64, dtype=torch.long)
    with torch.no_grad():
        assert torch.equal(again.eval().encode(x, mask)[0], model.encode(x, mask)[0])


def test_a_matrix_of_no_known_layer_is_refused(exported):
    _, folder = exported
    graph = onnx.load(str(folder / "decoder.onnx")).graph
    matmul = next(n for n in graph.node if n.op_type == "MatMul" and n.output[0].startswith("/location_proj/"))
    matmul.output[0] = "/somewhere_else/MatMul_output_0"
    with pytest.raises(ValueError, match="cannot tell whose matrix"):
        recover_weights.graph_weights(graph)
