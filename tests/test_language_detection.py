"""The target language a request without one gets: chosen by the server from the text's script, as the
CLI chooses it (the same module), and stated in the response."""

from __future__ import annotations

import grpc
import pytest

from attnserve.api.language_detection import other_language, script_of, target_for
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from conftest import TINY_MODEL_NAME

ZH_EN = (["zh-TW", "en"], ["en", "zh-TW"])  # translate-zh-en's source and target languages


@pytest.mark.parametrize(
    "text, languages, expected",
    [
        ("知識就是力量", ZH_EN, "en"),
        ("Knowledge is power.", ZH_EN, "zh-TW"),
        ("用 Python 寫的 attnserve", ZH_EN, "en"),  # mixed: its non-Latin script
        ("12345 !?", ZH_EN, ""),  # no letters
        ("Привет", ZH_EN, ""),  # a script none of its languages is written in
        ("bonjour", (["en", "fr"], ["en", "fr"]), ""),  # two Latin-script sources
        ("anything", (["zh-TW"], ["en"]), "en"),  # one target language
        ("こんにちは世界", (["ja", "zh"], ["zh", "ja"]), "zh"),  # kana marks Japanese
    ],
)
def test_the_other_language(text, languages, expected):
    assert other_language(*languages, text) == expected
    assert target_for(*languages, text) == (expected or languages[1][0])


def test_scripts():
    assert (script_of("abc"), script_of("漢字"), script_of("…"), script_of("한국어")) == ("Latin", "Han", None, "Hangul")


@pytest.mark.parametrize("text, expected", [("知識就是力量。", "en"), ("Knowledge is power.", "zh-TW")])
def test_a_raw_grpc_request_without_a_target_language(tiny_server, text, expected):
    server, _ = tiny_server
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        response = stub.Generate(pb.GenerateRequest(model=TINY_MODEL_NAME, text=pb.TextInput(text=text)), timeout=60)
        named = stub.Generate(pb.GenerateRequest(model=TINY_MODEL_NAME, text=pb.TextInput(text=text),
                                                 target_language=expected), timeout=60)
    assert response.target_language == expected and response.text == named.text
