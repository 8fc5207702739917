"""Server-wide request limits (--max-attention-values, --max-beam-size, --max-rows): refused before decoding
with a message naming the flag, and stated by GetModel."""

from __future__ import annotations

import grpc
import pytest

from attnserve.clients.client import Client
from attnserve.clients.errors import InvalidArgument
from attnserve.server.edge import app
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.api.generation import AttentionOptions, DecodingOptions, GenerationRequest
from attnserve.server.engine.registry import load_engine
from attnserve.server.model.repository import find_models
from attnserve.server.model.runtime import RuntimeOptions

MODEL = "tiny-translate"
WAIT = 60  # seconds; only a bound against hanging
ATTENTION = AttentionOptions(enabled=True)


@pytest.fixture(scope="module")
def limited(tiny_model_repo):
    model = find_models(tiny_model_repo)[MODEL]
    engine = load_engine(model, RuntimeOptions(), BatchingOptions(max_attention_values=40))
    yield engine
    engine.close()


def test_attention_that_could_outgrow_the_limit_is_refused_before_decoding(limited):
    # "Save the file" is 4 source columns with EOS; 20 new tokens x 4 columns = 80 values > 40.
    asked = GenerationRequest(MODEL, "Save the file", decoding=DecodingOptions(max_new_tokens=20), attention=ATTENTION)
    with pytest.raises(ValueError, match=r"over this server's --max-attention-values 40"):
        limited.prepare(asked)


def test_within_the_limit_or_without_attention_is_served(limited):
    columns = len(limited.prepare(GenerationRequest(MODEL, "Save the file")).source.ids)
    fits = GenerationRequest(MODEL, "Save the file", decoding=DecodingOptions(max_new_tokens=40 // columns),
                             attention=ATTENTION)
    result = limited.generate(fits, WAIT)
    assert result.attention is not None and len(result.attention.weights) <= 40 // columns
    unlimited = GenerationRequest(MODEL, "Save the file", decoding=DecodingOptions(max_new_tokens=20))
    assert limited.generate(unlimited, WAIT).attention is None


def test_the_limit_counts_every_returned_sequence(limited):
    asked = GenerationRequest(MODEL, "Save", attention=ATTENTION,
                              decoding=DecodingOptions(max_new_tokens=5, beam_size=4, num_return_sequences=4))
    with pytest.raises(ValueError, match=r"x 4 sequences"):
        limited.prepare(asked)


def test_served_limit_is_invalid_argument_and_get_model_states_it(tiny_model_repo):
    options = app.ServeOptions(models=str(tiny_model_repo), max_attention_values=40)
    engines = app.load_engines(options)
    try:
        with app.BackgroundServer(engines) as background, Client(background.address) as client:
            info = client.get_model(MODEL)
            assert info.max_attention_values == 40 and info.max_response_bytes == 32 * 1024 * 1024
            with pytest.raises(InvalidArgument, match="--max-attention-values 40") as refused:
                client.translate("Save the file", to="zh-TW", attention=True, max_new_tokens=20, model=MODEL)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        for engine in engines.values():
            engine.close()


def test_a_negative_limit_names_its_flag():
    with pytest.raises(ValueError, match="--max-attention-values must be at least 0"):
        app.ServeOptions(max_attention_values=-1)


def test_beam_size_over_the_flag_is_refused_and_stated(tiny_model_repo):
    options = app.ServeOptions(models=str(tiny_model_repo), max_beam_size=3)
    engines = app.load_engines(options)
    try:
        with app.BackgroundServer(engines) as background, Client(background.address) as client:
            assert client.get_model(MODEL).max_beam_size == 3
            assert client.translate("Save", to="zh-TW", beam_size=3, model=MODEL).text is not None
            with pytest.raises(InvalidArgument, match="beam_size 4 is out of range: use 1 \\(greedy\\) to 3"):
                client.translate("Save", to="zh-TW", beam_size=4, model=MODEL)
    finally:
        for engine in engines.values():
            engine.close()


def test_scheduling_flags_reach_the_scheduler_and_are_checked(tiny_model_repo):
    engines = app.load_engines(app.ServeOptions(models=str(tiny_model_repo), max_rows=8, fair_share_row_steps=99,
                                                max_beam_size=8, admission_hold_steps=2))
    try:
        engine = engines[MODEL]
        engine.generate(GenerationRequest(MODEL, "Save"), WAIT)  # the loop makes its scheduler when it runs
        scheduling = engine._continuous.scheduler.options
        assert (scheduling.max_rows, scheduling.fair_share_row_steps, scheduling.admission_hold_steps) == (8, 99, 2)
    finally:
        for engine in engines.values():
            engine.close()
    with pytest.raises(ValueError, match="--max-beam-size 16 needs --max-rows of at least as many, got 8"):
        app.ServeOptions(max_rows=8)
    with pytest.raises(ValueError, match="--admission-hold-steps must be at least 0, got -1"):
        app.ServeOptions(admission_hold_steps=-1)
