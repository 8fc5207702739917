"""Session fixtures: a tiny random-weight translation model, exported once, so tests need no bundled weights."""

from __future__ import annotations

import pathlib

import pytest

TINY_MODEL_NAME = "tiny-translate"

# A few sentences in both languages: enough for a tokenizer with pieces of every kind (CJK, ▁-words, punctuation).
TINY_CORPUS = [
    "知識就是力量。",
    "Knowledge is power.",
    "開啟檔案選單，然後選擇儲存。",
    "Open the File menu, then choose Save.",
    "用 Python 寫程式很有趣",
    "Writing programs in Python is fun",
    "今天天氣很好，我們去公園散步吧！",
    "The weather is nice today, let's take a walk in the park!",
    "這個按鈕會關閉視窗",
    "This button closes the window",
]


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from attnserve.export.translation import bpe

    return bpe.train_tokenizer(TINY_CORPUS * 3, vocab_size=160, min_frequency=1)


@pytest.fixture(scope="session")
def tiny_torch_model(tiny_tokenizer):
    """A 2+2-layer, d=32 Transformer with random weights (seeded), in eval mode."""
    import torch

    from attnserve.export.translation.model import Transformer, TransformerConfig

    torch.manual_seed(0)
    cfg = TransformerConfig(
        vocab_size=tiny_tokenizer.get_vocab_size(),
        d_model=32,
        heads=4,
        d_ff=64,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        max_positions=128,
    )
    return Transformer(cfg).eval()


@pytest.fixture(scope="session")
def tiny_model_repo(tmp_path_factory, tiny_torch_model, tiny_tokenizer) -> pathlib.Path:
    """A model repository holding the tiny model as `tiny-translate` version 1."""
    from attnserve.export.translation.onnx_export import export_model

    repo = tmp_path_factory.mktemp("model_repo")
    export_model(
        tiny_torch_model,
        tiny_tokenizer,
        repo / TINY_MODEL_NAME / "1",
        TINY_MODEL_NAME,
        1,
        max_source_tokens=48,
        max_new_tokens=40,
        description="random-weight test model",
        # Random tied weights mostly echo the input token; with the language tags suppressed the model
        # repeats one token forever, so the decoding tests keep them (test_suppression covers suppressing).
        suppress_ids=[],
    )
    return repo


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_repo) -> pathlib.Path:
    return tiny_model_repo / TINY_MODEL_NAME / "1"


# ---- in-process servers, shared by the service, client and CLI tests ---------------------------------


@pytest.fixture(scope="module")
def fake_server():
    """(BackgroundServer, FakeEngine): one fake model, "fake-translate", served in process per test module."""
    from fakes import FakeEngine

    from attnserve.server.edge import app

    engine = FakeEngine()
    with app.BackgroundServer({engine.info.name: engine}) as background:
        yield background, engine


@pytest.fixture
def fake_engine(fake_server):
    """The fake_server's engine, with the settings a test changed put back afterwards."""
    _, engine = fake_server
    yield engine
    engine.reset()


@pytest.fixture(scope="session")
def tiny_server(tiny_model_repo):
    """(BackgroundServer, engines by name): the tiny model served in process, as `attnserve serve` would."""
    from attnserve.server.edge import app

    engines = app.load_engines(app.ServeOptions(models=str(tiny_model_repo)))
    with app.BackgroundServer(engines) as background:
        yield background, engines


TINY_RECURRENT_NAME = "tiny-recurrent"


@pytest.fixture(scope="session")
def tiny_recurrent_model(tiny_tokenizer):
    """A small BiLSTM + attentional LSTM translator with random weights (seeded), in eval mode."""
    import torch

    from attnserve.export.translation.recurrent import RecurrentConfig, RecurrentTranslator

    torch.manual_seed(0)
    cfg = RecurrentConfig(
        vocab_size=tiny_tokenizer.get_vocab_size(),
        embed_dim=24,
        encoder_hidden=16,
        decoder_hidden=32,
        attention_dim=12,
        dropout=0.0,
        max_positions=128,
    )
    return RecurrentTranslator(cfg).eval()


@pytest.fixture(scope="session")
def tiny_recurrent_dir(tmp_path_factory, tiny_recurrent_model, tiny_tokenizer) -> pathlib.Path:
    """The tiny recurrent model exported as `tiny-recurrent` version 1 in a repository of its own."""
    from attnserve.export.translation.onnx_export import export_model

    repo = tmp_path_factory.mktemp("recurrent_repo")
    return export_model(
        tiny_recurrent_model,
        tiny_tokenizer,
        repo / TINY_RECURRENT_NAME / "1",
        TINY_RECURRENT_NAME,
        1,
        max_source_tokens=48,
        max_new_tokens=40,
        description="random-weight recurrent test model",
        suppress_ids=[],  # as for the tiny Transformer: random weights need the tags to stop repeating
    )


TINY_SPEECH_NAME = "tiny-speech"


@pytest.fixture(scope="session")
def tiny_speech_model(tiny_tokenizer):
    """The tiny listen-attend-spell model of tests/tiny_speech.py, random weights (seeded), in eval mode."""
    import torch
    from tiny_speech import TinyListenAttendSpell

    torch.manual_seed(0)
    return TinyListenAttendSpell(tiny_tokenizer.get_vocab_size()).eval()


@pytest.fixture(scope="session")
def tiny_speech_repo(tmp_path_factory, tiny_speech_model, tiny_tokenizer) -> pathlib.Path:
    """A model repository holding the tiny speech model as `tiny-speech` version 1 (3 s, 400 kB limits)."""
    import tiny_speech

    from attnserve.export.translation import bpe

    repo = tmp_path_factory.mktemp("speech_repo")
    folder = repo / TINY_SPEECH_NAME / "1"
    tiny_speech.export(tiny_speech_model, folder)
    tiny_tokenizer.save(str(folder / "tokenizer.json"))
    start = bpe.language_token_ids(tiny_tokenizer)["en"]
    tiny_speech.write_manifest(folder, tiny_speech.manifest(TINY_SPEECH_NAME, start))
    return repo


@pytest.fixture(scope="module")
def torch_one_thread():
    """Tiny tensors: one intra-op thread is fastest, and spinning threads slow to a crawl on a busy machine
    (a module asks for it with `pytestmark = pytest.mark.usefixtures("torch_one_thread")`)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def bundled_speech():
    """The bundled speech recognizer's newest version (models/speech-en, or $ATTNSERVE_BUNDLED_MODELS), in
    process, with batches of up to 8; skips where it or its example clips are absent."""
    import os

    from attnserve.server.engine.batcher import BatchingOptions
    from attnserve.server.engine.registry import load_engine
    from attnserve.server.model.repository import find_models

    repository = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", pathlib.Path(__file__).parents[1] / "models"))
    if not (repository / "speech-en" / "examples" / "examples.json").is_file():
        pytest.skip(f"no bundled speech model examples at {repository / 'speech-en' / 'examples'}")
    engine = load_engine(find_models(repository, only=["speech-en"])["speech-en"],
                         batching=BatchingOptions(max_batch_size=8))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def speech_examples() -> list[dict]:
    """The bundled speech recognizer's example clips (models/speech-en/examples/examples.json: file, text,
    duration, words); skips where they are absent."""
    import json
    import os

    examples = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", pathlib.Path(__file__).parents[1] / "models"))
    examples = examples / "speech-en" / "examples" / "examples.json"
    if not examples.is_file():
        pytest.skip(f"no bundled speech model examples at {examples.parent}")
    return json.loads(examples.read_text())

