"""The decode loop: ONNX == PyTorch, batched == alone, rows finishing at different steps, beams, and a
manifest-only recurrent model (replaced state) to show nothing in the loop is Transformer-specific."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnserve.export.translation.model import subsequent_mask
from attnserve.server.decoding.batch import Batch
from attnserve.server.decoding.decoding import decode, make_strategy
from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.decoding.search import BeamSearch, GreedySearch
from attnserve.api.generation import FinishReason, GenerationRequest
from attnserve.server.inputs.preprocessing import TextPreprocessor, TextSource, pad_batch
from attnserve.server.model.manifest import parse_manifest
from attnserve.server.model.repository import find_models, open_runtime
from attnserve.server.model.tokenization import Tokenizer
from fakes import MIXED_MAX_NEW, MIXED_TEXTS

ATOL = 1e-5
TEXTS, MAX_NEW = MIXED_TEXTS, MIXED_MAX_NEW


@pytest.fixture(scope="module")
def model(tiny_model_repo):
    version = find_models(tiny_model_repo)["tiny-translate"]
    return version.manifest, open_runtime(version), Tokenizer.from_manifest(version.path, version.manifest)


def prepare(model, index: int, beam_size: int = 1, attention_layer: int | None = 1) -> PreparedRequest:
    manifest, _, tokenizer = model
    language = manifest.target_languages[index % 2]
    return PreparedRequest(
        request=GenerationRequest("tiny-translate", TEXTS[index], language),
        source=TextSource(tuple(tokenizer.encode(TEXTS[index]))),
        target_language=language,
        start_id=manifest.decoder_start[language],
        max_new_tokens=MAX_NEW[index],
        beam_size=beam_size,
        attention_layer=attention_layer,
    )


def build(manifest, runtime, sources) -> Batch:
    """A batch of text sources (TextSource or plain id sequences)."""
    sources = [s if isinstance(s, TextSource) else TextSource(tuple(s)) for s in sources]
    return Batch.build(manifest, runtime, TextPreprocessor(manifest, None).collate(sources))


def pad_sources(sources, pad):
    return pad_batch([np.asarray(s.ids if isinstance(s, TextSource) else s, dtype=np.int64) for s in sources], pad)


def run(model, requests, eos, strategy_class=None):
    """Decodes requests as one batch; returns {index: hypothesis} and {index: step it finished at}."""
    manifest, runtime, _ = model
    batch = build(manifest, runtime, [r.source for r in requests])
    strategy = (strategy_class or type(make_strategy(requests, eos)))(requests, eos)
    done, steps = {}, {}
    for step, events in enumerate(decode(batch, strategy)):
        for hyp in events.finished:
            assert hyp.index not in done
            done[hyp.index], steps[hyp.index] = hyp, step
    assert len(done) == len(requests) and len(batch) == 0
    return done, steps


def torch_greedy(torch_model, request: PreparedRequest, eos: int):
    ids, mask = pad_sources([request.source], 0)
    tokens, attention = torch_model.greedy_decode(
        torch.from_numpy(ids), torch.from_numpy(mask), torch.tensor([request.start_id]), eos, request.max_new_tokens
    )
    return tokens[0], attention[0].numpy()


@pytest.fixture(scope="module")
def eos(model, tiny_torch_model):
    """An end token the random model does produce, so that some rows end by EOS and others by length.

    The random weights almost never emit the real EOS, so the test picks an output token instead (never a
    row's first one) and gives the same id to the PyTorch reference.
    """
    outputs = [torch_greedy(tiny_torch_model, prepare(model, i), eos=-1)[0] for i in range(len(TEXTS))]
    for candidate in sorted({t for out in outputs for t in out}):
        ends = [out.index(candidate) if candidate in out[:limit] else None for out, limit in zip(outputs, MAX_NEW)]
        by_eos = [e for e in ends if e is not None]
        if len(by_eos) >= 2 and len(by_eos) <= len(ends) - 2 and 0 not in by_eos:
            return candidate
    pytest.fail("no output token ends some rows but not others; change TEXTS")


def test_pad_batch():
    ids, mask = pad_sources([[5, 6, 2], [7, 2]], pad=0)
    np.testing.assert_array_equal(ids, [[5, 6, 2], [7, 2, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [1, 1, 0]])
    frames, mask = pad_batch([np.ones((5, 2), np.float32), np.ones((2, 2), np.float32)], 0.0, multiple=4)
    assert frames.shape == (2, 8, 2) and frames.dtype == np.float32 and frames[1, 2:].sum() == 0
    np.testing.assert_array_equal(mask.sum(axis=1), [5, 2])


def test_greedy_over_onnx_equals_pytorch_reference(model, tiny_torch_model, eos):
    requests = [prepare(model, i) for i in range(len(TEXTS))]
    done, steps = run(model, requests, eos)
    reasons = {h.finish_reason for h in done.values()}
    assert reasons == {FinishReason.EOS, FinishReason.LENGTH}
    assert len(set(steps.values())) >= 4, "rows should finish at different steps"
    for i, request in enumerate(requests):
        tokens, attention = torch_greedy(tiny_torch_model, request, eos)
        hyp = done[i]
        assert hyp.token_ids.tolist() == tokens, f"request {i}"
        assert hyp.finish_reason is (FinishReason.LENGTH if len(tokens) == MAX_NEW[i] else FinishReason.EOS)
        if tokens:
            np.testing.assert_allclose(hyp.attention, attention, atol=ATOL)
        assert hyp.attention.shape == (len(tokens), 2, 4, request.source.length)


def test_a_row_that_ends_at_once_has_no_tokens(model, tiny_torch_model):
    requests = [prepare(model, i) for i in range(len(TEXTS))]
    first = {i: torch_greedy(tiny_torch_model, r, eos=-1)[0][0] for i, r in enumerate(requests)}
    eos = first[0]  # request 0's first token: it ends at step 0
    done, _ = run(model, requests, eos)
    assert done[0].finish_reason is FinishReason.EOS and done[0].token_ids.tolist() == []
    assert done[0].attention.shape == (0, 2, 4, requests[0].source.length)
    assert any(len(h.token_ids) for h in done.values())
    for i, request in enumerate(requests):
        assert done[i].token_ids.tolist() == torch_greedy(tiny_torch_model, request, eos)[0]


def test_a_request_alone_equals_the_same_request_in_a_batch(model, eos):
    requests = [prepare(model, i) for i in range(len(TEXTS))]
    batched, _ = run(model, requests, eos)
    for i, request in enumerate(requests):
        alone = run(model, [request], eos)[0][0]
        assert alone.token_ids.tolist() == batched[i].token_ids.tolist()
        assert alone.finish_reason is batched[i].finish_reason
        np.testing.assert_allclose(alone.logprobs, batched[i].logprobs, atol=ATOL)
        np.testing.assert_allclose(alone.attention, batched[i].attention, atol=ATOL)
        # Attention of every output token is a distribution over the request's own source tokens.
        np.testing.assert_allclose(alone.attention.sum(-1), 1.0, atol=ATOL)


def test_requests_without_attention_get_none_and_same_tokens(model, eos):
    with_attention = [prepare(model, i) for i in range(3)]
    without = [prepare(model, i, attention_layer=None) for i in range(3)]
    a, _ = run(model, with_attention, eos)
    b, _ = run(model, [with_attention[0], without[1], without[2]], eos)
    assert b[0].attention is not None and b[1].attention is None and b[2].attention is None
    assert all(a[i].token_ids.tolist() == b[i].token_ids.tolist() for i in range(3))


def test_select_keeps_each_rows_computation(model):
    manifest, runtime, _ = model
    requests = [prepare(model, i) for i in (0, 4, 5)]
    sources = [r.source for r in requests]
    tokens = np.array([r.start_id for r in requests])
    batch = build(manifest, runtime, sources)
    batch.step(tokens)
    batch.step(np.array([9, 10, 11]))
    batch.select([0, 2])  # drops the longest source: its padding columns go too
    got = batch.step(np.array([12, 13]))
    assert got.attention.shape[-1] == max(sources[0].length, sources[2].length)

    fresh = build(manifest, runtime, [sources[0], sources[2]])
    fresh.step(tokens[[0, 2]])
    fresh.step(np.array([9, 11]))
    want = fresh.step(np.array([12, 13]))
    np.testing.assert_allclose(got.logits, want.logits, atol=ATOL)
    np.testing.assert_allclose(got.attention, want.attention, atol=ATOL)

    batch.select([1, 1, 0])  # beams: rows repeated and reordered
    again = batch.step(np.array([14, 14, 14]))
    np.testing.assert_allclose(again.logits[0], again.logits[1], atol=ATOL)
    assert len(batch) == 3


def test_cancelled_request_leaves_without_disturbing_the_others(model, eos):
    manifest, runtime, _ = model
    requests = [prepare(model, i) for i in range(4)]
    strategy = GreedySearch(requests, eos)
    done = {}
    for step, events in enumerate(decode(build(manifest, runtime, [r.source for r in requests]), strategy)):
        if step == 0:
            strategy.cancel(2)
        done.update({h.index: h for h in events.finished})
    assert sorted(done) == [0, 1, 3]
    alone, _ = run(model, requests[:2] + requests[3:], eos)
    assert [done[i].token_ids.tolist() for i in (0, 1, 3)] == [alone[i].token_ids.tolist() for i in range(3)]


def test_streamed_step_attention_is_the_hypothesis_attention(model, eos):
    manifest, runtime, _ = model
    requests = [prepare(model, i, attention_layer=None if i == 1 else 1) for i in range(4)]
    streamed = {i: [] for i in range(4)}  # per request, each streamed token's (L, H, S) attention
    done = {}
    batch = build(manifest, runtime, [r.source for r in requests])
    for events in decode(batch, GreedySearch(requests, eos)):
        for e, i in enumerate(events.requests.tolist()):
            streamed[i].append(events.attention[e, ..., : requests[i].source.length])
        done.update({h.index: h for h in events.finished})
    assert done[1].attention is None
    for i in (0, 2, 3):
        np.testing.assert_array_equal(np.stack(streamed[i]), done[i].attention)


def test_steps_carry_no_attention_when_no_request_wants_it(model, eos):
    manifest, runtime, _ = model
    requests = [prepare(model, i, attention_layer=None) for i in range(2)]
    batch = build(manifest, runtime, [r.source for r in requests])
    assert all(events.attention is None for events in decode(batch, GreedySearch(requests, eos)))


def test_beam_search_of_width_one_is_greedy(model, eos):
    requests = [prepare(model, i) for i in range(len(TEXTS))]
    greedy, _ = run(model, requests, eos)
    beam, _ = run(model, requests, eos, strategy_class=BeamSearch)
    for i in range(len(TEXTS)):
        assert beam[i].token_ids.tolist() == greedy[i].token_ids.tolist()
        np.testing.assert_allclose(beam[i].attention, greedy[i].attention, atol=ATOL)


class EosBias:
    """Wraps a runtime and raises the EOS logit by `slope` per position, so beams do end by EOS.

    The random model's EOS is too unlikely for any finished beam to win; the same bias is applied to the
    PyTorch reference below.
    """

    def __init__(self, runtime, eos: int, slope: float = 0.3):
        self.runtime, self.eos, self.slope = runtime, eos, slope

    def encode(self, feeds):
        return self.runtime.encode(feeds)

    def decode_step(self, feeds, residency=None):
        out = self.runtime.decode_step(feeds, residency)
        out["logits"] = out["logits"].copy()
        out["logits"][:, self.eos] += self.slope * feeds["position_ids"][:, 0]
        return out


def teacher_forced(torch_model, request, tokens, bias: EosBias):
    """PyTorch log-probabilities and attention (n, L, H, S) of a given output, uncached, with the EOS bias."""
    ids, mask = (torch.from_numpy(a) for a in pad_sources([request.source], 0))
    target = torch.tensor([[request.start_id, *tokens]])
    t = target.shape[1]
    with torch.no_grad():
        _, cross = torch_model.encode(ids, mask)
        logits, _, weights = torch_model.decode(
            target, torch.arange(t)[None], subsequent_mask(t)[None, None], torch_model.empty_cache(1), cross, mask
        )
    logits = logits[0]
    logits[:, bias.eos] += bias.slope * torch.arange(t)
    logprobs = torch.log_softmax(logits, -1)[torch.arange(t - 1), target[0, 1:]]
    return logprobs.numpy(), weights[0, :, :, :-1].permute(2, 0, 1, 3).numpy()


def test_beam_search_bookkeeping_matches_pytorch_and_batching(model, tiny_torch_model):
    manifest, runtime, tokenizer = model
    bias = EosBias(runtime, manifest.special_tokens.eos)
    biased = (manifest, bias, tokenizer)
    requests = [prepare(model, i, beam_size=3) for i in range(len(TEXTS))]
    batched, _ = run(biased, requests, bias.eos)
    assert {h.finish_reason for h in batched.values()} == {FinishReason.EOS, FinishReason.LENGTH}
    greedy, _ = run(biased, [prepare(model, i) for i in range(len(TEXTS))], bias.eos)
    assert any(batched[i].token_ids.tolist() != greedy[i].token_ids.tolist() for i in batched), "beams = greedy"
    for i, request in enumerate(requests):
        hyp = batched[i]
        alone = run(biased, [request], bias.eos)[0][0]
        assert alone.token_ids.tolist() == hyp.token_ids.tolist()
        np.testing.assert_allclose(alone.attention, hyp.attention, atol=ATOL)
        assert len(hyp.token_ids) > 0
        # The back-pointers and the reordered caches give each token what the model says about it.
        logprobs, attention = teacher_forced(tiny_torch_model, request, hyp.token_ids.tolist(), bias)
        np.testing.assert_allclose(hyp.logprobs, logprobs, atol=1e-4)
        np.testing.assert_allclose(hyp.attention, attention, atol=ATOL)


def test_mixed_beam_sizes_are_refused_in_one_batch(model):
    with pytest.raises(ValueError, match=r"one batch needs one beam size, got \[1, 2\]"):
        make_strategy([prepare(model, 0), prepare(model, 1, beam_size=2)], eos=2)


# -- A recurrent toy model described only by its manifest: replaced state, initialised from the encoder,
# -- with its batch on axis 1; no position ids and no self-attention mask.

D, V = 6, 11


class RecurrentRuntime:
    """encoder: memory (B, S, D), summary (D, B); decoder: h' = tanh(A h + E[token]), attention over memory."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.embed = rng.standard_normal((V, D)).astype(np.float32)
        self.a = rng.standard_normal((D, D)).astype(np.float32) * 0.5

    def encode(self, feeds):
        mask = feeds["src_mask"][..., None].astype(np.float32)  # (B, S, 1)
        memory = self.embed[feeds["src"]] * mask  # (B, S, D)
        return {"memory": memory, "summary": (memory.sum(1) / mask.sum(1)).T.copy()}

    def decode_step(self, feeds, residency=None):
        h = np.tanh(self.a @ feeds["h"] + self.embed[feeds["token"][:, 0]].T)  # (D, B)
        scores = np.einsum("bsd,db->bs", feeds["memory"], h)
        scores = np.where(feeds["mem_mask"] == 1, scores, -np.inf)
        attention = np.exp(scores - scores.max(1, keepdims=True))
        attention /= attention.sum(1, keepdims=True)  # (B, S)
        context = np.einsum("bs,bsd->bd", attention, feeds["memory"])  # (B, D)
        logits = (h.T + context) @ self.embed.T  # (B, V)
        return {"logits": logits, "h_next": h, "attn": attention[:, None, None, :]}


RECURRENT_MANIFEST = {
    "format_version": 1, "name": "toy", "version": 1, "task": "translation",
    "languages": {"source": ["x"], "target": ["y"]},
    "tokenizer": {"file": "tokenizer.json", "word_boundary": "metaspace-cjk"},
    "special_tokens": {"pad": 0, "unk": 1, "eos": 2}, "decoder_start": {"y": 3},
    "limits": {"max_source_tokens": 16, "max_new_tokens": 9},
    "attention": {"output": "attn", "layers": 1, "heads": 1},
    "encoder": {"file": "e.onnx", "inputs": {"input_ids": "src", "attention_mask": "src_mask"}},
    "decoder": {"file": "d.onnx", "inputs": {"input_ids": "token"}, "outputs": {"logits": "logits"}},
    "static": [
        {"from": "src_mask", "to": "mem_mask", "batch_axis": 0, "source_axis": 1},
        {"from": "memory", "to": "memory", "batch_axis": 0, "source_axis": 1},
    ],
    "state": [
        {"input": "h", "output": "h_next", "update": "replace", "batch_axis": 1, "dtype": "float32",
         "shape": [D, "batch"], "init": {"from": "summary"}},
    ],
}


@pytest.mark.parametrize("beam_size", [1, 2])
def test_replaced_state_model_batched_equals_alone(beam_size):
    manifest, runtime = parse_manifest(RECURRENT_MANIFEST), RecurrentRuntime()
    rng = np.random.default_rng(1)
    requests = [
        PreparedRequest(
            GenerationRequest("toy", "t"), TextSource(tuple(rng.integers(3, V, n)) + (2,)), "y", 3, m, beam_size, 0
        )
        for n, m in [(7, 9), (2, 3), (12, 9), (4, 1), (9, 6)]
    ]
    model = (manifest, runtime, None)
    batched, _ = run(model, requests, eos=5)
    for i, request in enumerate(requests):
        alone = run(model, [request], eos=5)[0][0]
        assert alone.token_ids.tolist() == batched[i].token_ids.tolist()
        np.testing.assert_allclose(alone.attention, batched[i].attention, atol=ATOL)
        assert len(alone.token_ids) <= request.max_new_tokens
    assert len({len(h.token_ids) for h in batched.values()}) >= 3
