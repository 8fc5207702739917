"""A tiny random-weight speech model for the tests: listen, attend and spell (Chan et al. 2015) in miniature.

The Listener reads log-mel frames with a unidirectional LSTM (so padding after a clip never reaches its real
frames) and reduces time 4x by concatenating groups of 4 frames (a pyramid layer); the Speller is an LSTM
cell with dot-product attention whose h, c and attention context are its decoder state, replaced every step
(h and c start from the listener's mean, the context from zeros). Exported with the legacy TorchScript
exporter (opset 17), it fills the audio contract of docs/model-contract.md; `greedy_decode` is the offline
reference the served model is compared with.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import torch
from torch import nn

N_MELS, REDUCTION, D = 80, 4, 16
OPSET = 17
STATE = ["past_state.hidden", "past_state.cell", "past_state.context"]


class Listener(nn.Module):
    def __init__(self):
        super().__init__()
        self.project = nn.Linear(N_MELS, D)
        self.rnn = nn.LSTM(D, D, batch_first=True)
        self.pyramid = nn.Linear(REDUCTION * D, D)

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, M) frames and (B, T) mask, T a multiple of REDUCTION -> (B, T/4, D) states and (B, T/4) mask."""
        x = torch.tanh(self.project(features)) * mask[..., None].float()  # (B, T, D)
        x, _ = self.rnn(x)
        x = torch.tanh(self.pyramid(x.reshape(x.shape[0], -1, REDUCTION * D)))  # (B, S, D)
        reduced = mask.float().reshape(mask.shape[0], -1, REDUCTION).amax(-1)  # (B, S): any real frame
        return x * reduced[..., None], reduced.long()


class Speller(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.init_h, self.init_c = nn.Linear(D, D), nn.Linear(D, D)
        self.embed = nn.Embedding(vocab, D)
        self.cell = nn.LSTMCell(2 * D, D)
        self.query = nn.Linear(D, D)
        self.out = nn.Linear(2 * D, vocab)

    def initial_state(self, memory, mask):
        mean = memory.sum(1) / mask.sum(1, keepdim=True).float()  # (B, D)
        return torch.tanh(self.init_h(mean)), self.init_c(mean)

    def step(self, ids, mask, memory, h, c, context):
        """One step: ids (B,) -> logits (B, V), h, c, context (B, D), attention (B, S)."""
        h, c = self.cell(torch.cat([self.embed(ids), context], -1), (h, c))
        scores = (memory @ self.query(h)[..., None])[..., 0]  # (B, S)
        attention = torch.softmax(scores.masked_fill(mask == 0, -1e9), -1)
        context = (attention[:, None] @ memory)[:, 0]  # (B, D)
        return self.out(torch.cat([h, context], -1)), h, c, context, attention


class TinyListenAttendSpell(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.listener, self.speller = Listener(), Speller(vocab)
        # A CTC head over the listener states (blank = id 0), exported only with export(..., ctc=True).
        self.ctc = nn.Linear(D, vocab)

    def ctc_log_probs(self, memory, reduced):
        """(B, S, V) CTC log-probabilities and (B,) real positions."""
        return torch.log_softmax(self.ctc(memory), -1), reduced.sum(1)

    @torch.no_grad()
    def greedy_decode(self, features: torch.Tensor, start: int, eos: int, max_new: int, ctc_weight: float = 0.0,
                      lm=None, lm_weight: float = 0.0):
        """The offline reference for one clip's (T, M) frames: token ids and (n, S) attention.

        With a ctc_weight, each step ranks tokens by (1 - w) log p_decoder + w x their CTC prefix score
        (joint CTC/attention decoding, the scorer the server uses: server/decoding/ctc_prefix.py). With an n-gram `lm`
        and lm_weight, that score gains lm_weight x log p_lm(token | start token and tokens so far)."""
        from attnserve.server.decoding.ctc_prefix import CTCPrefixScorer

        t = features.shape[0]
        padded = torch.zeros(1, -(-t // REDUCTION) * REDUCTION, N_MELS)
        padded[0, :t] = features
        mask = torch.zeros(padded.shape[:2], dtype=torch.int64)
        mask[0, :t] = 1
        memory, reduced = self.listener(padded, mask)
        h, c = self.speller.initial_state(memory, reduced)
        scorer = CTCPrefixScorer(*(x.numpy() for x in self.ctc_log_probs(memory, reduced)), 0, eos)
        context, token, tokens, weights = torch.zeros(1, D), torch.tensor([start]), [], []
        fed = [start]
        for _ in range(max_new):
            logits, h, c, context, attention = self.speller.step(token, reduced, memory, h, c, context)
            score = logits.log_softmax(-1).numpy()
            if ctc_weight:
                score = (1 - ctc_weight) * score + ctc_weight * scorer.score()
            if lm_weight:
                history = np.array([[0] * max(lm.order - 1 - len(fed), 0) + [t + 1 for t in fed][-(lm.order - 1):]])
                score = score + lm_weight * lm.score(history)
            token = torch.from_numpy(score.argmax(-1))
            if ctc_weight:
                scorer.advance(token.numpy())
            fed.append(int(token))
            weights.append(attention[0])
            if int(token) == eos:
                break
            tokens.append(int(token))
        return tokens, torch.stack(weights)[: len(tokens)].numpy()


class _Encoder(nn.Module):
    def __init__(self, model, ctc: bool):
        super().__init__()
        self.model, self.with_ctc = model, ctc

    def forward(self, input_features, attention_mask):
        memory, reduced = self.model.listener(input_features, attention_mask)
        ctc = self.model.ctc_log_probs(memory, reduced) if self.with_ctc else ()
        return (memory, reduced, *self.model.speller.initial_state(memory, reduced), *ctc)


class _DecoderStep(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, encoder_hidden_states, h, c, context):
        logits, h, c, context, attention = self.model.speller.step(
            input_ids[:, 0], encoder_attention_mask, encoder_hidden_states, h, c, context
        )
        return logits, h, c, context, attention[:, None, None, :]  # (B, 1 layer, 1 head, S)


def export(model: TinyListenAttendSpell, folder: pathlib.Path, ctc: bool = False) -> None:
    """Writes encoder.onnx and decoder.onnx with batch, frame and source axes dynamic; with `ctc`, the
    encoder also outputs ctc_log_probs (B, S, V) and ctc_lengths (B,)."""
    folder.mkdir(parents=True, exist_ok=True)
    features, mask = torch.randn(2, 12, N_MELS), torch.ones(2, 12, dtype=torch.int64)
    mask[1, 9:] = 0
    ctc_outputs = {"ctc_log_probs": {0: "batch", 1: "source"}, "ctc_lengths": {0: "batch"}} if ctc else {}
    torch.onnx.export(
        _Encoder(model, ctc).eval(), (features, mask), str(folder / "encoder.onnx"),
        input_names=["input_features", "attention_mask"],
        output_names=["encoder_hidden_states", "encoder_attention_mask", "initial_state.hidden", "initial_state.cell",
                      *ctc_outputs],
        dynamic_axes={"input_features": {0: "batch", 1: "frames"}, "attention_mask": {0: "batch", 1: "frames"},
                      "encoder_hidden_states": {0: "batch", 1: "source"},
                      "encoder_attention_mask": {0: "batch", 1: "source"},
                      "initial_state.hidden": {0: "batch"}, "initial_state.cell": {0: "batch"}, **ctc_outputs},
        opset_version=OPSET, dynamo=False, external_data=False,
    )
    memory, reduced = torch.randn(2, 3, D), torch.tensor([[1, 1, 1], [1, 1, 0]])
    state = [torch.randn(2, D) for _ in STATE]
    batch = {0: "batch"}
    torch.onnx.export(
        _DecoderStep(model).eval(), (torch.tensor([[4], [5]]), reduced, memory, *state), str(folder / "decoder.onnx"),
        input_names=["input_ids", "encoder_attention_mask", "encoder_hidden_states", *STATE],
        output_names=["logits", *[s.replace("past", "present") for s in STATE], "cross_attentions"],
        dynamic_axes={"input_ids": batch, "encoder_attention_mask": {0: "batch", 1: "source"},
                      "encoder_hidden_states": {0: "batch", 1: "source"}, "logits": batch,
                      **{s: batch for s in STATE}, **{s.replace("past", "present"): batch for s in STATE},
                      "cross_attentions": {0: "batch", 3: "source"}},
        opset_version=OPSET, dynamo=False, external_data=False,
    )


def manifest(name: str, start_token: int, max_seconds: float = 3, max_bytes: int = 400_000) -> dict:
    """The audio manifest of the tiny model (docs/model-contract.md's speller example, in miniature)."""
    inits = [{"from": "initial_state.hidden"}, {"from": "initial_state.cell"}, "zeros"]
    return {
        "format_version": 1, "name": name, "version": 1, "task": "speech-recognition",
        "description": "random-weight listen-attend-spell test model",
        "languages": {"source": ["en"], "target": ["en"]},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "metaspace-cjk"},
        "special_tokens": {"pad": 0, "unk": 1, "eos": 2}, "decoder_start": {"en": start_token},
        "input": {
            "kind": "audio", "sample_rate_hz": 16000,
            "features": {"type": "log-mel", "n_mels": N_MELS, "window_ms": 25, "shift_ms": 10, "n_fft": 512,
                         "log_floor": 1e-10},
            "time_reduction": REDUCTION, "max_seconds": max_seconds, "max_bytes": max_bytes,
        },
        "limits": {"max_new_tokens": 12},
        "attention": {"output": "cross_attentions", "layers": 1, "heads": 1},
        "encoder": {"file": "encoder.onnx",
                    "inputs": {"input_features": "input_features", "attention_mask": "attention_mask"}},
        "decoder": {"file": "decoder.onnx", "inputs": {"input_ids": "input_ids"}, "outputs": {"logits": "logits"}},
        "static": [
            {"from": "encoder_attention_mask", "to": "encoder_attention_mask", "batch_axis": 0, "source_axis": 1},
            {"from": "encoder_hidden_states", "to": "encoder_hidden_states", "batch_axis": 0, "source_axis": 1},
        ],
        "state": [
            {"input": s, "output": s.replace("past", "present"), "update": "replace", "batch_axis": 0,
             "dtype": "float32", "shape": ["batch", D], "init": init}
            for s, init in zip(STATE, inits)
        ],
    }


def write_manifest(folder: pathlib.Path, data: dict) -> None:
    (folder / "manifest.json").write_text(json.dumps(data, indent=2))
