"""One config tree: serve flags mirror the engine options, so a default or a bound is written once."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.longform import LongFormOptions
from attnserve.server.model.option_fields import bounded, check, mirror
from attnserve.server.model.runtime_options import RuntimeOptions
from attnserve.server.engine.scheduler import SchedulingOptions
from attnserve.server.edge import serve_options
from attnserve.server.edge.serve_options import ServeOptions


def test_the_default_server_runs_the_engine_options_defaults():
    options = ServeOptions()
    assert options.batching_options() == BatchingOptions()
    assert options.runtime_options() == RuntimeOptions()
    assert dataclasses.replace(options, batching="window").batching_options().continuous is None


def test_a_flag_is_refused_with_its_engine_fields_bound_and_named_as_typed():
    with pytest.raises(ValueError, match="^--max-rows must be at least 1, got 0; --max-beam-size 16 needs --max-rows"):
        ServeOptions(max_rows=0)
    with pytest.raises(ValueError, match="SchedulingOptions.max_rows must be at least 1, got 0"):
        SchedulingOptions(max_rows=0)
    with pytest.raises(ValueError, match="--port 70000 is out of range: use 0..65535"):
        ServeOptions(port=70000)
    with pytest.raises(ValueError, match="--device 'tpu' is not one of cpu, cuda"):
        ServeOptions(device="tpu")


def test_every_problem_is_named_at_once_and_none_passes_unset_fields():
    @dataclasses.dataclass(frozen=True)
    class Options:
        rows: int = bounded(1, least=1)
        share: float | None = bounded(None, above=0, most=1)
        copied: int = mirror(BatchingOptions, "max_queue_size")

        def __post_init__(self):
            check(self)

    assert Options().copied == BatchingOptions().max_queue_size
    with pytest.raises(ValueError, match=r"rows must be at least 1, got 0; Options.share must be at most 1, got 2"):
        Options(rows=0, share=2)
    with pytest.raises(ValueError, match="Options.share must be more than 0, got 0"):
        Options(share=0)


def test_a_client_may_have_at_most_the_models_long_recordings():
    assert LongFormOptions().max_recordings_per_client == ServeOptions().max_long_form_recordings_per_client == 2
    with pytest.raises(ValueError, match="LongFormOptions.max_recordings_per_client must be at least 1, got 0"):
        LongFormOptions(max_recordings_per_client=0)
    with pytest.raises(ValueError, match="LongFormOptions.max_recordings_per_client 5 is more than max_recordings 4"):
        LongFormOptions(max_recordings_per_client=5)
    LongFormOptions(max_recordings=1, max_recordings_per_client=1)
    with pytest.raises(ValueError, match="^--max-long-form-recordings-per-client must be at least 1, got 0$"):
        ServeOptions(max_long_form_recordings_per_client=0)
    with pytest.raises(ValueError, match="^--max-long-form-recordings-per-client 2 is more than "
                                         "--max-long-form-recordings 1: lower it too$"):
        ServeOptions(max_long_form_recordings=1)
    parser = argparse.ArgumentParser()
    serve_options.add_arguments(parser)
    flags = parser.parse_args(["--max-long-form-recordings", "6", "--max-long-form-recordings-per-client", "3"])
    parsed = serve_options.from_args(flags)
    assert (parsed.max_long_form_recordings, parsed.max_long_form_recordings_per_client) == (6, 3)
