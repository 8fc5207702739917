"""The `attnserve` command: run a server, translate through one, list its models.

    attnserve serve --port 50051 --models models/
    attnserve translate "我愛你" --to en --attention
    attnserve models

Only `serve` needs the serving core (ONNX Runtime); it is imported when that subcommand runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import os
import sys
from collections.abc import Sequence

from attnserve.clients import heatmap
from attnserve.clients.client import DEFAULT_ADDRESS, DEFAULT_MODEL, AttnServeError, Client, translation_request
from attnserve.server import convert
from attnserve.server.generation import GenerationResult


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status (also used by the console script)."""
    args = _parser().parse_args(argv)
    try:
        args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not as an "Exception ignored" at exit
    except AttnServeError as exc:
        print(f"error: {exc.code.name}: {exc.details}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader left early (`attnserve translate ... --json | head`): stop quietly, as other tools do.
        _discard_stdout()
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _discard_stdout() -> None:
    """Points stdout at /dev/null, so that flushing it at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # stdout replaced by something without a descriptor
        pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnserve", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="serve a model repository over gRPC")
    serve.add_argument("--models", default="models", help="model repository folder (default: models)")
    serve.add_argument("--host", default="[::]", help="interface to listen on (default: all)")
    serve.add_argument("--port", type=int, default=convert.DEFAULT_PORT, help="gRPC port (default: %(default)s)")
    serve.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    serve.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per model (default: 1)")
    serve.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics over HTTP on this port")
    serve.add_argument("--max-batch-size", type=int, default=16, help="(default: %(default)s)")
    serve.add_argument("--batch-window-ms", type=float, default=5.0, help="(default: %(default)s)")
    serve.set_defaults(run=_serve)

    translate = commands.add_parser("translate", help="translate text and optionally show the attention")
    translate.add_argument("text")
    translate.add_argument(
        "--to", help="target language, en or zh-TW (default: en for text with Chinese characters, else zh-TW)"
    )
    translate.add_argument("--attention", action="store_true", help="also draw the attention heatmap")
    grouping = translate.add_mutually_exclusive_group()
    grouping.add_argument("--words", dest="granularity", action="store_const", const="words", help="(default)")
    grouping.add_argument("--pieces", dest="granularity", action="store_const", const="pieces")
    translate.add_argument(
        "--layer", type=int, help="decoder layer; negative counts from the last (default: the model's choice)"
    )
    translate.add_argument("--max-tokens", type=int, default=0, help="0 = the model's limit")
    translate.add_argument("--beam-size", type=int, default=1, help="1 = greedy search (default), up to 16")
    translate.add_argument("--model", default=DEFAULT_MODEL, help="(default: %(default)s)")
    translate.add_argument("--json", action="store_true", help="print the whole response as JSON")
    translate.add_argument("--stream", action="store_true", help="print the output as it is decoded")
    _add_address(translate)
    translate.set_defaults(run=_translate, granularity="words")

    models = commands.add_parser("models", help="list the served models")
    _add_address(models)
    models.set_defaults(run=_models)
    return parser


def _add_address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", default=DEFAULT_ADDRESS, help="server host:port (default: %(default)s)")


def _serve(args: argparse.Namespace) -> None:
    import logging

    from attnserve.server import app  # needs ONNX Runtime, which client-only installs lack

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = app.ServeOptions(
            models=args.models,
            host=args.host,
            port=args.port,
            device=args.device,
            threads=args.threads,
            max_batch_size=args.max_batch_size,
            batch_window_ms=args.batch_window_ms,
            metrics_port=args.metrics_port,
        )
        app.run(options)
    except (OSError, ValueError) as exc:  # a bad option, a missing or malformed repository, a port in use
        raise SystemExit(f"error: {exc}") from None


def default_target(text: str) -> str:
    """The other language of the zh-TW <-> en pair: text with any CJK ideograph goes to English."""
    return "en" if any("\u3400" <= ch <= "\u9fff" or "\uf900" <= ch <= "\ufaff" for ch in text) else "zh-TW"


def _translate(args: argparse.Namespace) -> None:
    request = translation_request(
        args.text,
        to=args.to or default_target(args.text),
        attention=args.attention,
        granularity=args.granularity,
        layer=args.layer,
        max_new_tokens=args.max_tokens,
        beam_size=args.beam_size,
        model=args.model,
    )
    with Client(args.address) as client:
        result = _print_stream(client, request) if args.stream else client.generate(request)
    if args.json:
        print(json.dumps(dataclasses.asdict(result), default=_enum_value, ensure_ascii=False, indent=2))
        return
    if not args.stream:
        print(result.text)
    if result.attention is not None:
        print()
        print(heatmap.render(result.attention))


def _print_stream(client: Client, request) -> GenerationResult:
    """Prints the output text as the server decodes it; returns the final result."""
    for event in client.stream(request):
        if isinstance(event, GenerationResult):
            print()
            return event
        print(event.text, end="", flush=True)
    raise RuntimeError("the stream ended without a final response")


def _models(args: argparse.Namespace) -> None:
    with Client(args.address) as client:
        infos = client.list_models()
    for info in infos:
        print(f"{info.name} (version {info.version}, {info.task}): {info.description}")
        print(f"  languages: {', '.join(info.source_languages)} -> {', '.join(info.target_languages)}")
        print(f"  limits: {info.max_source_tokens} source tokens, {info.max_new_tokens} new tokens")
        print(f"  attention: {info.attention_layers} layers x {info.attention_heads} heads")


def _enum_value(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


if __name__ == "__main__":
    sys.exit(main())
