"""The replaced-state path of the decode loop against a plain numpy reference.

A tiny attentional LSTM (h, c, the attention context and the previous step's attention weights are its
decoder state, replaced every step; h and c start from the encoder, the others from zeros; the previous
attention runs along the source axis, as a location-aware speller's does) is written twice: as ONNX graphs built node by node with
onnx.helper, served from its manifest alone, and as a numpy function that decodes one request step by step.
The served loop must match the reference at every step: the state it feeds in (the encoder's `init`, then
each step's output), the logits and attention that come out, the tokens, alone and in a batch whose rows
leave at different steps, and under beam search, whose beams reorder the state. Two deliberately broken
loops (one that never feeds the state back, one that ignores `init`) must fail the same comparison.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from attnserve.server.decoding.batch import Batch
from attnserve.server.decoding.decoding import decode
from attnserve.server.decoding.log_softmax import log_softmax
from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.decoding.search import GreedySearch
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import AttentionOptions, DecodingOptions, GenerationRequest
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions
from fakes import BATCHING_MODES, MIXED_MAX_NEW, MIXED_TEXTS, batching, submit_together

NAME = "tiny-lstm-state"
E, H = 5, 6  # embedding width; LSTM width = memory width (dot-product attention)
ATOL = 1e-5
WAIT = 60
VECTOR_STATE = ["past_state.hidden", "past_state.cell", "past_state.context"]  # (B, H)
PREVIOUS_ATTENTION = "past_state.attention"  # (B, S): trimmed with the source when long rows leave
STATE = [*VECTOR_STATE, PREVIOUS_ATTENTION]
LOCATION_GAIN = 2.0  # how much the previous step's attention adds to this step's scores
ENCODER_INPUTS = ["input_ids", "attention_mask"]
IR_VERSION = 8  # what opset 17 needs; ONNX Runtime reads IR versions older than the onnx package writes


@dataclasses.dataclass(frozen=True)
class Weights:
    source_embed: np.ndarray  # (V, H)
    init_h: np.ndarray  # (H, H)
    init_h_bias: np.ndarray  # (H,)
    init_c: np.ndarray  # (H, H)
    target_embed: np.ndarray  # (V, E)
    w_x: np.ndarray  # (E + H, 4H): input and fed-back context -> gates i, f, g, o
    w_h: np.ndarray  # (H, 4H)
    bias: np.ndarray  # (4H,)
    w_out: np.ndarray  # (2H, V): [h; context] -> logits
    out_bias: np.ndarray  # (V,)

    @classmethod
    def random(cls, vocab: int, seed: int = 0) -> Weights:
        rng = np.random.default_rng(seed)

        def w(*shape, scale=1.0):
            return (rng.standard_normal(shape) * scale).astype(np.float32)

        return cls(w(vocab, H), w(H, H), w(H), w(H, H), w(vocab, E), w(E + H, 4 * H, scale=0.6),
                   w(H, 4 * H, scale=0.6), w(4 * H, scale=0.3), w(2 * H, vocab, scale=1.5), w(vocab, scale=0.1))


# ---- the numpy reference ----------------------------------------------------------------------------------


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def reference_encode(w: Weights, ids: list[int]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """memory (S, H) and the initial state of one request."""
    memory = w.source_embed[ids].astype(np.float64)  # (S, H)
    mean = memory.mean(axis=0)
    state = {"past_state.hidden": np.tanh(mean @ w.init_h + w.init_h_bias), "past_state.cell": mean @ w.init_c,
             "past_state.context": np.zeros(H), PREVIOUS_ATTENTION: np.zeros(len(ids))}
    return memory, state


def reference_step(w: Weights, memory: np.ndarray, token: int, state: dict) -> tuple[np.ndarray, np.ndarray, dict]:
    """One LSTM step: logits (V,), attention (S,), the next state."""
    h, c, context, previous = (state[k] for k in STATE)
    gates = np.concatenate([w.target_embed[token], context]) @ w.w_x + h @ w.w_h + w.bias  # (4H,)
    i, f, g, o = np.split(gates, 4)
    c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    h = sigmoid(o) * np.tanh(c)
    scores = memory @ h + LOCATION_GAIN * previous  # (S,)
    attention = np.exp(scores - scores.max())
    attention /= attention.sum()
    context = attention @ memory  # (H,)
    logits = np.concatenate([h, context]) @ w.w_out + w.out_bias
    return logits, attention, dict(zip(STATE, (h, c, context, attention)))


@dataclasses.dataclass
class Trace:
    tokens: list[int]
    logprobs: list[float]
    attention: list[np.ndarray]  # per step (S,)
    states: list[dict]  # per step: the state fed into it


def reference_greedy(w: Weights, ids: list[int], start: int, eos: int, max_new: int) -> Trace:
    memory, state = reference_encode(w, ids)
    trace, token = Trace([], [], [], []), start
    for _ in range(max_new):
        trace.states.append(state)
        logits, attention, state = reference_step(w, memory, token, state)
        token = int(logits.argmax())
        trace.attention.append(attention)
        if token == eos:
            break
        trace.tokens.append(token)
        trace.logprobs.append(float(log_softmax(logits[None])[0, token]))
    return trace


def reference_logprobs(w: Weights, ids: list[int], start: int, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced log-probabilities (n,) and attention (n, S) of a given output."""
    memory, state = reference_encode(w, ids)
    logprobs, attention = [], []
    for previous, token in zip([start, *tokens], tokens):
        logits, weights, state = reference_step(w, memory, previous, state)
        logprobs.append(log_softmax(logits[None])[0, token])
        attention.append(weights)
    return np.array(logprobs), np.array(attention).reshape(len(tokens), -1)


# ---- the same model as ONNX graphs + manifest -----------------------------------------------------------


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def encoder_graph(w: Weights) -> onnx.ModelProto:
    n = helper.make_node
    nodes = [
        n("Gather", ["source_embed", "input_ids"], ["embedded"]),  # (B, S, H)
        n("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        n("Unsqueeze", ["mask_f", "axis_last"], ["mask_3d"]),  # (B, S, 1)
        n("Mul", ["embedded", "mask_3d"], ["encoder_hidden_states"]),
        n("ReduceSum", ["encoder_hidden_states", "axis_1"], ["total"], keepdims=0),  # (B, H)
        n("ReduceSum", ["mask_3d", "axis_1"], ["count"], keepdims=0),  # (B, 1)
        n("Div", ["total", "count"], ["mean"]),
        n("MatMul", ["mean", "init_h"], ["h_pre"]),
        n("Add", ["h_pre", "init_h_bias"], ["h_biased"]),
        n("Tanh", ["h_biased"], ["initial_state.hidden"]),
        n("MatMul", ["mean", "init_c"], ["initial_state.cell"]),
    ]
    inits = [_const(k, getattr(w, k)) for k in ("source_embed", "init_h", "init_h_bias", "init_c")]
    inits += [_const("axis_last", [-1]), _const("axis_1", [1])]
    ids = [helper.make_tensor_value_info(k, TensorProto.INT64, ["batch", "source"]) for k in ENCODER_INPUTS]
    outs = [
        helper.make_tensor_value_info("encoder_hidden_states", TensorProto.FLOAT, ["batch", "source", H]),
        helper.make_tensor_value_info("initial_state.hidden", TensorProto.FLOAT, ["batch", H]),
        helper.make_tensor_value_info("initial_state.cell", TensorProto.FLOAT, ["batch", H]),
    ]
    return _model(helper.make_graph(nodes, "encoder", ids, outs, inits))


def decoder_graph(w: Weights) -> onnx.ModelProto:
    n = helper.make_node
    nodes = [
        n("Gather", ["target_embed", "input_ids"], ["embedded_3d"]),  # (B, 1, E)
        n("Squeeze", ["embedded_3d", "axis_1"], ["embedded"]),  # (B, E)
        n("Concat", ["embedded", "past_state.context"], ["x"], axis=1),  # (B, E + H)
        n("MatMul", ["x", "w_x"], ["gx"]),
        n("MatMul", ["past_state.hidden", "w_h"], ["gh"]),
        n("Add", ["gx", "gh"], ["g_sum"]),
        n("Add", ["g_sum", "bias"], ["gates"]),  # (B, 4H)
        n("Split", ["gates", "split_4"], ["i_pre", "f_pre", "g_pre", "o_pre"], axis=1),
        n("Sigmoid", ["i_pre"], ["i"]),
        n("Sigmoid", ["f_pre"], ["f"]),
        n("Tanh", ["g_pre"], ["g"]),
        n("Sigmoid", ["o_pre"], ["o"]),
        n("Mul", ["f", "past_state.cell"], ["fc"]),
        n("Mul", ["i", "g"], ["ig"]),
        n("Add", ["fc", "ig"], ["present_state.cell"]),
        n("Tanh", ["present_state.cell"], ["c_tanh"]),
        n("Mul", ["o", "c_tanh"], ["present_state.hidden"]),  # (B, H)
        n("Unsqueeze", ["present_state.hidden", "axis_last"], ["query"]),  # (B, H, 1)
        n("MatMul", ["encoder_hidden_states", "query"], ["scores_3d"]),  # (B, S, 1)
        n("Squeeze", ["scores_3d", "axis_last"], ["content_scores"]),  # (B, S)
        n("Mul", [PREVIOUS_ATTENTION, "location_gain"], ["location_scores"]),
        n("Add", ["content_scores", "location_scores"], ["scores"]),
        n("Equal", ["encoder_attention_mask", "zero_i64"], ["padding"]),
        n("Where", ["padding", "minus_big", "scores"], ["masked"]),
        n("Softmax", ["masked"], ["attention"], axis=1),  # (B, S)
        n("Identity", ["attention"], [PREVIOUS_ATTENTION.replace("past", "present")]),
        n("Unsqueeze", ["attention", "axis_1"], ["attention_3d"]),  # (B, 1, S)
        n("MatMul", ["attention_3d", "encoder_hidden_states"], ["context_3d"]),  # (B, 1, H)
        n("Squeeze", ["context_3d", "axis_1"], ["present_state.context"]),
        n("Concat", ["present_state.hidden", "present_state.context"], ["readout"], axis=1),  # (B, 2H)
        n("MatMul", ["readout", "w_out"], ["logits_pre"]),
        n("Add", ["logits_pre", "out_bias"], ["logits"]),
        n("Unsqueeze", ["attention", "axes_1_2"], ["cross_attentions"]),  # (B, 1, 1, S)
    ]
    inits = [_const(k, getattr(w, k)) for k in ("target_embed", "w_x", "w_h", "bias", "w_out", "out_bias")]
    inits += [_const("axis_1", [1]), _const("axis_last", [-1]), _const("axes_1_2", [1, 2]),
              _const("split_4", [H] * 4), _const("zero_i64", np.int64(0)), _const("minus_big", np.float32(-1e9)),
              _const("location_gain", np.float32(LOCATION_GAIN))]
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch", 1]),
        helper.make_tensor_value_info("encoder_attention_mask", i64, ["batch", "source"]),
        helper.make_tensor_value_info("encoder_hidden_states", f, ["batch", "source", H]),
        *[helper.make_tensor_value_info(k, f, ["batch", H]) for k in VECTOR_STATE],
        helper.make_tensor_value_info(PREVIOUS_ATTENTION, f, ["batch", "source"]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", f, ["batch", w.w_out.shape[1]]),
        *[helper.make_tensor_value_info(k.replace("past", "present"), f, ["batch", H]) for k in VECTOR_STATE],
        helper.make_tensor_value_info(PREVIOUS_ATTENTION.replace("past", "present"), f, ["batch", "source"]),
        helper.make_tensor_value_info("cross_attentions", f, ["batch", 1, 1, "source"]),
    ]
    return _model(helper.make_graph(nodes, "decoder", inputs, outputs, inits))


def manifest(tokenizer, init_hidden="initial_state.hidden") -> dict:
    from attnserve.export.translation import bpe

    tags = bpe.language_token_ids(tokenizer)
    inits = {"past_state.hidden": {"from": init_hidden} if init_hidden else "zeros",
             "past_state.cell": {"from": "initial_state.cell"}, "past_state.context": "zeros",
             PREVIOUS_ATTENTION: "zeros"}
    return {
        "format_version": 1, "name": NAME, "version": 1, "task": "translation",
        "languages": {"source": ["en", "zh-TW"], "target": ["en", "zh-TW"]},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "metaspace-cjk"},
        "special_tokens": {"pad": bpe.PAD_ID, "unk": 1, "eos": bpe.EOS_ID}, "decoder_start": tags,
        "limits": {"max_source_tokens": 64, "max_new_tokens": 40},
        "attention": {"output": "cross_attentions", "layers": 1, "heads": 1},
        "encoder": {"file": "encoder.onnx", "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}},
        "decoder": {"file": "decoder.onnx", "inputs": {"input_ids": "input_ids"}, "outputs": {"logits": "logits"}},
        "static": [
            {"from": "attention_mask", "to": "encoder_attention_mask", "batch_axis": 0, "source_axis": 1},
            {"from": "encoder_hidden_states", "to": "encoder_hidden_states", "batch_axis": 0, "source_axis": 1},
        ],
        "state": [
            {"input": k, "output": k.replace("past", "present"), "update": "replace", "batch_axis": 0,
             "dtype": "float32", "shape": ["batch", "source" if k == PREVIOUS_ATTENTION else H], "init": inits[k]}
            for k in STATE
        ],
    }


def write_model(folder, weights: Weights, tokenizer, **manifest_options):
    folder.mkdir(parents=True)
    onnx.save(encoder_graph(weights), str(folder / "encoder.onnx"))
    onnx.save(decoder_graph(weights), str(folder / "decoder.onnx"))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "manifest.json").write_text(json.dumps(manifest(tokenizer, **manifest_options)))


@pytest.fixture(scope="module")
def weights(tiny_tokenizer) -> Weights:
    return Weights.random(tiny_tokenizer.get_vocab_size())


@pytest.fixture(scope="module")
def repo(tmp_path_factory, weights, tiny_tokenizer):
    repo = tmp_path_factory.mktemp("state_repo")
    write_model(repo / NAME / "1", weights, tiny_tokenizer)
    return repo


@pytest.fixture(scope="module")
def engine(repo):
    engine = load_engine(find_models(repo)[NAME], RuntimeOptions(), BatchingOptions())
    yield engine
    engine.close()


def request(i: int, beam_size: int = 1) -> GenerationRequest:
    return GenerationRequest(
        NAME, MIXED_TEXTS[i], ["en", "zh-TW"][i % 2], DecodingOptions(MIXED_MAX_NEW[i], beam_size),
        AttentionOptions(enabled=True),
    )


# ---- step by step: the state fed in, the logits and attention out -------------------------------------------


class RecordingRuntime:
    """Records every decoder call's state inputs and outputs; `tamper` may rewrite the feeds first."""

    def __init__(self, runtime, tamper=None):
        self.runtime, self.tamper = runtime, tamper
        self.calls: list[tuple[dict, dict]] = []

    def encode(self, feeds):
        return self.runtime.encode(feeds)

    def decode_step(self, feeds, residency=None):
        feeds = self.tamper(dict(feeds), len(self.calls)) if self.tamper else feeds
        out = self.runtime.decode_step(feeds, residency)
        self.calls.append(({k: feeds[k].copy() for k in STATE}, out))
        return out


def served_steps(engine, prepared: list[PreparedRequest], tamper=None) -> list[list[tuple[dict, dict]]]:
    """Greedy-decodes `prepared` as one batch; per request, per step: (state fed in, outputs) of its row."""
    runtime = RecordingRuntime(engine.runtime, tamper)
    batch = Batch.build(engine.manifest, runtime, engine.preprocessor.collate([p.source for p in prepared]))
    strategy = GreedySearch(prepared, engine.manifest.special_tokens.eos)
    alive = list(range(len(prepared)))  # greedy keeps the remaining rows in request order
    slots = batch.slot_of_rows.copy()  # where each row sits in the next decoder call's tensors
    steps = [[] for _ in prepared]
    for events, (fed, out) in zip(decode(batch, strategy), _calls(runtime)):
        for slot, i in zip(slots, alive):
            steps[i].append(({k: v[slot] for k, v in fed.items()}, {k: v[slot] for k, v in out.items()}))
        done = {h.index for h in events.finished}
        alive = [i for i in alive if i not in done]
        slots = batch.slot_of_rows.copy()
    return steps


def _calls(runtime: RecordingRuntime):
    """The recorded calls, read lazily: each is recorded by the step that yields its events."""
    index = 0
    while True:
        yield runtime.calls[index]
        index += 1


def check_against_reference(engine, weights, indices, tamper=None) -> None:
    prepared = [engine.prepare(request(i)) for i in indices]
    eos = engine.manifest.special_tokens.eos
    for p, steps in zip(prepared, served_steps(engine, prepared, tamper)):
        ref = reference_greedy(weights, list(p.source.ids), p.start_id, eos, p.max_new_tokens)
        assert len(steps) == len(ref.states)
        for t, ((fed, out), state) in enumerate(zip(steps, ref.states)):
            for k in VECTOR_STATE:
                np.testing.assert_allclose(fed[k], state[k], atol=ATOL, err_msg=f"state {k} fed into step {t}")
            previous = fed[PREVIOUS_ATTENTION]  # as wide as the batch's longest remaining row
            np.testing.assert_allclose(previous[: p.source.length], state[PREVIOUS_ATTENTION], atol=ATOL)
            assert not previous[p.source.length :].any(), "previous attention on padding"
            attention = out["cross_attentions"][0, 0]  # (S_batch,): the batch's source width this step
            np.testing.assert_allclose(attention[: p.source.length], ref.attention[t], atol=ATOL)
            assert not attention[p.source.length :].any(), "attention on another row's padding"
            assert int(out["logits"].argmax()) == (ref.tokens + [eos])[t]


@pytest.mark.parametrize("indices", [[0], [4], [0, 1, 2, 3, 4, 5, 6, 7]], ids=["alone", "alone-long", "batched"])
def test_each_step_feeds_back_the_state_the_reference_computes(engine, weights, indices):
    check_against_reference(engine, weights, indices)


def test_a_loop_that_never_feeds_the_state_back_fails_the_comparison(engine, weights):
    first = {}

    def keep_initial_state(feeds, call):
        if call == 0:
            first.update({k: feeds[k].copy() for k in STATE})  # the batch writes new state in place
        return feeds | first

    with pytest.raises(AssertionError, match="fed into step 1"):
        check_against_reference(engine, weights, [0], tamper=keep_initial_state)


def test_a_loop_that_ignores_init_fails_the_comparison(repo, weights, tiny_tokenizer, tmp_path):
    write_model(tmp_path / NAME / "1", weights, tiny_tokenizer, init_hidden=None)  # h starts from zeros
    broken = load_engine(find_models(tmp_path)[NAME], RuntimeOptions(), BatchingOptions())
    try:
        with pytest.raises(AssertionError, match="state past_state.hidden fed into step 0"):
            check_against_reference(broken, weights, [0])
    finally:
        broken.close()


# ---- whole requests through the engine: alone, batched, beams -------------------------------------------------


@pytest.mark.parametrize("mode", BATCHING_MODES)
def test_served_requests_alone_and_batched_equal_the_reference(repo, engine, weights, mode):
    n = len(MIXED_TEXTS)
    together = load_engine(find_models(repo)[NAME], RuntimeOptions(), batching(mode, n))
    try:
        batched = [f.result(WAIT) for f in submit_together(together, [request(i) for i in range(n)])]
    finally:
        together.close()
    assert {r.timings.batch_size for r in batched} == {n}
    assert len({len(r.tokens) for r in batched}) >= 3, "rows should leave the batch at different steps"
    for i, result in enumerate(batched):
        alone = engine.generate(request(i), WAIT)
        p = engine.prepare(request(i))
        ref = reference_greedy(weights, list(p.source.ids), p.start_id, 2, p.max_new_tokens)
        for served in (alone, result):
            assert [t.id for t in served.tokens] == ref.tokens
            np.testing.assert_allclose([t.logprob for t in served.tokens], ref.logprobs, atol=ATOL)
            np.testing.assert_allclose(served.attention.weights, ref.attention[: len(ref.tokens)], atol=ATOL)


def test_beams_reorder_the_state_as_the_reference_scores_their_tokens(engine, weights):
    # Each beam hypothesis's tokens, re-scored by the reference from scratch, get the log-probabilities and
    # attention the served beams computed with their gathered (reordered) state.
    futures = [engine.submit(request(i, beam_size=3)) for i in range(4)]
    for i, future in enumerate(futures):
        result, p = future.result(WAIT), engine.prepare(request(i, beam_size=3))
        tokens = [t.id for t in result.tokens]
        logprobs, attention = reference_logprobs(weights, list(p.source.ids), p.start_id, tokens)
        np.testing.assert_allclose([t.logprob for t in result.tokens], logprobs, atol=1e-4)
        np.testing.assert_allclose(result.attention.weights, attention, atol=ATOL)
