"""Beam search's early stopping (manifest `decoding.early_stopping`, transformers' `early_stopping=True`):
a request stops as soon as it has beam_size finished sequences, instead of once no running beam can beat
them. Scripted distributions over three tokens in which the two rules choose different outputs; the
manifest field reaching the request; tests/test_import_m2m100.py compares the served beams with
`generate(num_beams=5, early_stopping=True)` on m2m100_418M's unedited generation_config."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from attnserve.server.decoding.prepared import PreparedRequest
from attnserve.server.decoding.search import BeamSearch
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import GenerationRequest
from attnserve.server.inputs.preprocessing import TextSource
from attnserve.server.model.repository import find_models
from conftest import TINY_MODEL_NAME

EOS, A, B = 0, 1, 2
# Prefix -> next-token probabilities (EOS, A, B). Step 0: A is likely, EOS second (finished at once).
# After B, EOS is likely: the second finished sequence, so two are done after step 1. After A, A again:
# a running beam whose mean log-probability beats both finished ones, and that ends at step 2.
SCRIPT = {
    (): (0.2, 0.7, 0.1),
    (A,): (0.02, 0.97, 0.01),
    (B,): (0.9, 0.05, 0.05),
    (A, A): (0.99, 0.005, 0.005),
}
OTHERWISE = (0.9, 0.05, 0.05)


def prepared(early_stopping: bool, beams: int = 2) -> PreparedRequest:
    return PreparedRequest(
        request=GenerationRequest("scripted", "x", "en"), source=TextSource((5, EOS)), target_language="en",
        start_id=EOS, max_new_tokens=6, beam_size=beams, attention_layer=None, early_stopping=early_stopping,
    )


def search(requests) -> dict[int, list[int]]:
    """Runs BeamSearch over SCRIPT, tracking each row's prefix; returns {request: output tokens}."""
    strategy = BeamSearch(requests, EOS)
    selection = strategy.start()
    prefixes = [()] * len(selection.rows)
    found = {}
    while len(selection.rows):
        logits = np.log([SCRIPT.get(p, OTHERWISE) for p in prefixes])  # (B, 3)
        attention = np.zeros((len(prefixes), 1, 1, 2), dtype=np.float32)
        selection, events = strategy.advance(logits, attention)
        prefixes = [prefixes[r] + (int(t),) for r, t in zip(selection.rows, selection.tokens)]
        found.update({h.index: h.token_ids.tolist() for h in events.finished})
    return found


def test_early_stopping_returns_the_best_of_the_first_beam_size_finished_sequences():
    # Two finished after step 1: [B] (mean log-prob -1.2) and [] (-1.6); the running [A, A] (-0.19 so far)
    # would beat them, which only the heuristic waits for.
    assert search([prepared(early_stopping=True)]) == {0: [B]}
    assert search([prepared(early_stopping=False)]) == {0: [A, A]}


def test_requests_with_and_without_early_stopping_share_a_batch():
    assert search([prepared(False), prepared(True), prepared(False)]) == {0: [A, A], 1: [B], 2: [A, A]}


def test_the_manifest_sets_early_stopping_for_every_request(tiny_model_dir, tmp_path):
    folder = tmp_path / TINY_MODEL_NAME / "1"
    shutil.copytree(tiny_model_dir, folder)
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["decoding"] = {"beam_size": 3, "early_stopping": True}
    path.write_text(json.dumps(manifest))
    engine = load_engine(find_models(tmp_path)[TINY_MODEL_NAME])
    try:
        prepared_request = engine.prepare(GenerationRequest(TINY_MODEL_NAME, "Open the File menu", "en"))
        assert prepared_request.early_stopping and prepared_request.beam_size == 3
    finally:
        engine.close()
    manifest["decoding"]["early_stopping"] = "never"
    path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"field 'decoding.early_stopping' must be bool, got 'never'"):
        find_models(tmp_path)[TINY_MODEL_NAME].manifest

