"""The `attnserve` command: run a server, translate or transcribe through one, compare its models, list them.

    attnserve serve --port 50051 --models models/
    attnserve translate "我愛你" --to en --attention
    attnserve transcribe clip.wav --attention
    attnserve caption scene.png --attention words.png
    attnserve compare "我愛你" --models translate-zh-en,translate-zh-en-rnn
    attnserve models
    attnserve health --address a:50051,b:50051
    attnserve web --port 8080                     # the browser demo, calling the server at --address

Only `serve` needs the serving core (ONNX Runtime); it is imported when that subcommand runs. The client
distribution (clients/standalone/) installs the same commands but `serve` and `web` as `attnserve-client`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import enum
import importlib
import json
import os
import shutil
import sys
from collections.abc import Sequence

from attnserve.clients import comparison, heatmap, languages, timeline, transcription
from attnserve.clients.client import (
    DEFAULT_ADDRESS,
    DEFAULT_MODEL,
    AttnServeError,
    Client,
    TlsOptions,
    audio_request,
    image_request,
    translation_request,
    video_request,
)
from attnserve.api.generation import (
    AttentionOptions,
    AttentionReduction,
    DecodingOptions,
    GenerationRequest,
    GenerationResult,
    InputKind,
    ModelInfo,
    SamplingOptions,
)


_CLIENT_DESCRIPTION = (
    "The `attnserve-client` command: translate, transcribe or caption through a server, compare its models, list them."
)


def main(argv: Sequence[str] | None = None, server_commands: bool = True) -> int:
    """Runs the command line; returns the exit status (also used by the console script).

    Args:
        argv: the arguments; None = sys.argv[1:].
        server_commands: False = the client distribution's command, without `serve` and `web`.
    """
    args = _parser(server_commands).parse_args(argv)
    try:
        status = args.run(args) or 0  # a command that printed a partial failure returns 1
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
    return status


def client_main(argv: Sequence[str] | None = None) -> int:
    """The `attnserve-client` command of the client distribution: every command but `serve` and `web`."""
    return main(argv, server_commands=False)


def _discard_stdout() -> None:
    """Points stdout at /dev/null, so that flushing it at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # stdout replaced by something without a descriptor
        pass


def _parser(server_commands: bool = True) -> argparse.ArgumentParser:
    if server_commands:
        parser = argparse.ArgumentParser(prog="attnserve", description=__doc__.splitlines()[0])
    else:
        parser = argparse.ArgumentParser(prog="attnserve-client", description=_CLIENT_DESCRIPTION)
    parser.add_argument("--version", action="version", version=_version(server_commands))
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    if server_commands:
        _add_serve(commands)
    _add_translate(commands)
    _add_compare(commands)
    _add_transcribe(commands)
    _add_caption(commands)
    _add_status(commands)
    if server_commands:
        _add_web(commands)
        _add_import(commands)
    return parser


def _add_import(commands) -> None:
    imports = commands.add_parser("import", help="turn a transformers checkpoint folder into a served model")
    # Its flags import nothing heavy; the importer itself (torch, transformers) loads only when it runs.
    from attnserve.export.importers import command as import_command

    import_command.add_arguments(imports)
    imports.set_defaults(run=import_command.run)


# Every option the CLI leaves unset (None) takes the request contract's default (protos/attnserve/api/generation.py); the
# help texts read them from there.
_DECODING, _ATTENTION = DecodingOptions(), AttentionOptions()
_TO_HELP = ("target language (default: asked from the server: the model's only target language, else the one "
            "the text is not written in)")
_BEAM_HELP = ("1 = greedy search, more = beam search, up to the server's limit (see `attnserve models`); "
              "default: the model's")


def _add_serve(commands) -> None:
    serve = commands.add_parser("serve", help="serve a model repository over gRPC")
    # The flags and their defaults live beside the server's options (server/edge/serve_options.py).
    from attnserve.server.edge import serve_options

    serve_options.add_arguments(serve)
    serve.set_defaults(run=_serve)


def _add_granularity(parser: argparse.ArgumentParser) -> None:
    """--words (the CLI's default: a terminal heatmap reads best by words) or --pieces (the contract's)."""
    grouping = parser.add_mutually_exclusive_group()
    grouping.add_argument("--words", dest="granularity", action="store_const", const="words",
                          help="attention between whole words, pieces merged (default)")
    grouping.add_argument("--pieces", dest="granularity", action="store_const", const="pieces",
                          help="attention between the tokenizer's subword pieces")
    parser.set_defaults(granularity="words")


def _add_translate(commands) -> None:
    translate = commands.add_parser("translate", help="translate text and optionally show the attention")
    translate.add_argument("text", help="the text to translate")
    translate.add_argument("--to", help=_TO_HELP)
    translate.add_argument("--from", dest="source", default="",
                           help="source language, for models that read it (NLLB, M2M100: eng_Latn, zho_Hant, ...; "
                           "default: the model's first source language)")
    translate.add_argument(
        "--attention", nargs="?", const="", type=_png_path, metavar="OUT.png",
        help="also draw the attention heatmap: in the terminal, or as a PNG (matplotlib) given a path",
    )
    _add_granularity(translate)
    translate.add_argument(
        "--layer", type=int, help="decoder layer; negative counts from the last (default: the model's choice)"
    )
    translate.add_argument(
        "--heads", type=_head_list, default=(), metavar="H[,H...]",
        help="heads of that layer to combine, e.g. 0,2 (negative counts from the last; default: all)",
    )
    translate.add_argument(
        "--head-reduction", choices=[r.value for r in AttentionReduction],
        help=f"combine the heads by their mean (rows sum to 1) or maximum (what any one head looked at); "
             f"default: {_ATTENTION.reduction.value}",
    )
    translate.add_argument("--max-tokens", type=int, help="most new tokens (default: the model's limit)")
    translate.add_argument("--beam-size", type=int, help=f"{_BEAM_HELP}, with --nbest N at least N")
    translate.add_argument(
        "--nbest", type=int, metavar="N",
        help=f"also print the N best translations with their scores (default: {_DECODING.num_return_sequences})",
    )
    translate.add_argument(
        "--reverse-weight", type=float, metavar="W",
        help=f"rerank the beam's candidates by how well each translates back into the source (0.1 suits "
             f"translate-zh-en; about twice the compute; not with --stream); default {_DECODING.reverse_weight}: off",
    )
    sampling = translate.add_argument_group("sampling (with --sample)")
    sampling.add_argument("--sample", action="store_true", help="draw each token at random instead of searching")
    sampling.add_argument("--temperature", type=float, help="below 1 sharpens, above 1 flattens (default 1)")
    sampling.add_argument("--top-k", type=int, help="sample among the K most likely tokens (default: all)")
    sampling.add_argument("--top-p", type=float, help="sample among the most likely tokens up to P (default 1)")
    sampling.add_argument("--seed", type=int, help="the same seed gives the same output (default: random)")
    translate.add_argument("--model", default=DEFAULT_MODEL, help="a served text model (default: %(default)s)")
    translate.add_argument("--json", action="store_true", help="print the whole response as JSON")
    translate.add_argument("--stream", action="store_true", help="print the output as it is decoded")
    _add_address(translate)
    translate.set_defaults(run=_translate)


def _add_compare(commands) -> None:
    compare = commands.add_parser(
        "compare", help="translate with several models and show their attention heatmaps side by side"
    )
    compare.add_argument("text", help="the text every model translates")
    compare.add_argument("--to", help=_TO_HELP)
    compare.add_argument(
        "--models", help="comma-separated model names, two or more (default: every served translation model)"
    )
    _add_granularity(compare)
    compare.add_argument("--json", action="store_true", help="print every model's whole response, keyed by model")
    _add_address(compare)
    compare.set_defaults(run=_compare)


def _add_transcribe(commands) -> None:
    transcribe = commands.add_parser("transcribe", help="transcribe an audio file, with each word's time span")
    transcribe.add_argument("file", help="an audio file: WAV (16/32-bit PCM or float), FLAC, Ogg, MP3 or M4A (as the "
                            "server reads: `attnserve models`), any common rate, up to an hour; - reads stdin")
    transcribe.add_argument("--srt", metavar="OUT.srt", help="write subtitles (SubRip) of the transcript")
    transcribe.add_argument("--vtt", metavar="OUT.vtt", help="write subtitles (WebVTT) of the transcript")
    transcribe.add_argument("--to", default="", help="the transcript's language (default: the model's first, or "
                            "detected by models that detect it, such as imported Whisper checkpoints)")
    transcribe.add_argument("--from", dest="source", default="",
                            help="the spoken language, for models that translate speech (Whisper: --from de --to en)")
    transcribe.add_argument("--read-once", action="store_true",
                            help="decode the recording once, at its own speed, where the model reads it at several "
                                 "(`attnserve models` lists its speeds): about a third of the compute")
    transcribe.add_argument("--hotwords", nargs="+", default=(), metavar="WORD",
                            help="names and terms the recording holds, which the search then favours (at most 100 "
                                 "words, written as the model writes: speech-en in lower case)")
    transcribe.add_argument("--hotword-boost", type=float, default=0.0, metavar="B",
                            help="the bonus per letter of a hotword (default 0: the server's, 0.25; higher writes "
                                 "hotwords that were not said)")
    transcribe.add_argument("--progress", action="store_true",
                            help="show the progress bar of a long recording even when stderr is not a terminal")
    transcribe.add_argument(
        "--attention", nargs="?", const="", type=_png_path, metavar="OUT.png",
        help="show each word's time span and its attention over time: in the terminal, or as a PNG given a path",
    )
    _add_media_options(transcribe, "audio")
    transcribe.set_defaults(run=_transcribe)


def _add_caption(commands) -> None:
    caption = commands.add_parser("caption", help="caption an image or a video clip, with each word's attention")
    caption.add_argument("file", help="a PNG or JPEG image, or an MP4, WebM or GIF clip; - reads stdin")
    caption.add_argument("--attention", type=_png_path, metavar="OUT.png",
                         help="write each word's attention heatmap: one panel per word (an image), or per word "
                              "its timeline over the frames and its most-attended frames (a clip)")
    _add_media_options(caption, "image or video")
    caption.set_defaults(run=_caption)


def _add_media_options(parser: argparse.ArgumentParser, kind: str) -> None:
    """What every command for a media model shares: the search, the model, JSON output, the server."""
    parser.add_argument("--beam-size", type=int, help=_BEAM_HELP)
    parser.add_argument("--model", help=f"a served {kind} model (default: the first one the server lists)")
    parser.add_argument("--json", action="store_true", help="print the whole response as JSON")
    _add_address(parser)


def _add_status(commands) -> None:
    models = commands.add_parser("models", help="list the served models")
    _add_address(models)
    models.set_defaults(run=_models)

    health = commands.add_parser("health", help="ask each server address whether it is serving (exit 1 if not)")
    health.add_argument("--service", default="", help="a model's name, or attnserve.v1.AttnServe (default: all)")
    _add_address(health)
    health.set_defaults(run=_health)


def _add_web(commands) -> None:
    web = commands.add_parser("web", help="serve the browser demo, an HTTP gateway to the server at --address")
    web.add_argument("--host", default="127.0.0.1", help="interface of the page (default: %(default)s)")
    web.add_argument("--port", type=int, default=8080, help="HTTP port of the page (default: %(default)s)")
    from attnserve.clients.web import http_options  # no aiohttp: the flags show without the `web` extra

    http_options.add_arguments(web)
    _add_address(web)
    web.set_defaults(run=_web)


def _version(server_commands: bool) -> str:
    """"attnserve 0.1.0": the installed distribution's version (the client's for `attnserve-client`)."""
    from importlib import metadata

    name = "attnserve" if server_commands else "attnserve-client"
    try:
        return f"{name} {metadata.version(name)}"
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return f"{name} (not installed)"


def _add_address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address", default=DEFAULT_ADDRESS,
        help="server host:port, or several joined by commas, called in turn (default: %(default)s)",
    )
    parser.add_argument("--tls", action="store_true", help="connect with TLS, trusting the system's CAs")
    parser.add_argument("--tls-ca", metavar="PEM", help="connect with TLS, trusting this CA bundle")
    parser.add_argument(
        "--token-file", metavar="FILE", help="send 'authorization: Bearer <token>' with the file's first line"
    )


def _connection(args: argparse.Namespace) -> dict:
    """The clients' TLS and token options the address flags describe."""
    tls = TlsOptions(root_certificates=args.tls_ca) if args.tls_ca else args.tls
    try:
        token = open(args.token_file).readline().strip() if args.token_file else None
    except OSError as exc:
        raise SystemExit(f"error: cannot read {args.token_file}: {exc.strerror}") from None
    return {"tls": tls, "token": token}


def _connect(args: argparse.Namespace, timeout: float | None = None) -> Client:
    """The client the address flags describe."""
    try:
        return Client(args.address, timeout, **_connection(args))
    except ValueError as exc:  # an unreadable CA file, an empty token
        raise SystemExit(f"error: {exc}") from None


def _png_path(value: str) -> str:
    if value and not value.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a .png path; to draw in the terminal, put --attention after the positional argument"
        )
    return value


def _serve(args: argparse.Namespace) -> None:
    from attnserve.server.edge import app, serve_options  # app needs ONNX Runtime, which client-only installs lack

    try:
        app.run(serve_options.from_args(args))
    except (OSError, ValueError) as exc:  # a bad option, a missing or malformed repository, a port in use
        raise SystemExit(f"error: {exc}") from None


def _head_list(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of head numbers") from None


def _translate(args: argparse.Namespace) -> None:
    sampling = _sampling(args)
    with _connect(args) as client:
        to = args.to if args.to is not None else languages.default_target(client.get_model(args.model), args.text)
        request = translation_request(
            args.text,
            to=to,
            attention=args.attention is not None,
            granularity=args.granularity,
            layer=args.layer,
            max_new_tokens=args.max_tokens,
            beam_size=args.beam_size,  # None: the model's default (the server raises it to --nbest)
            model=args.model,
            num_return_sequences=args.nbest,
            sampling=sampling,
            heads=args.heads,
            reduction=args.head_reduction,
            reverse_weight=args.reverse_weight,
        )
        request = dataclasses.replace(request, source_language=args.source)
        result = _print_stream(client, request) if args.stream else client.generate(request)
    if args.attention:
        _drawing("plot").save_attention(result.attention, args.attention)
    if args.json:
        print(json.dumps(dataclasses.asdict(result), default=_enum_value, ensure_ascii=False, indent=2))
        return
    if not args.stream:
        print(result.text)
    for rank, sequence in enumerate(result.nbest, 1):
        print(f"{rank:>2}. {sequence.score:8.4f}  {sequence.text}")
    if args.attention:
        print(f"attention: {args.attention}")
    elif result.attention is not None:
        print()
        print(heatmap.render(result.attention))


def _sampling(args: argparse.Namespace) -> SamplingOptions | None:
    """The sampling options of `translate --sample ...`; None without --sample.

    Raises:
        SystemExit: a sampling option given without --sample.
    """
    given = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed}
    given = {name: value for name, value in given.items() if value is not None}
    if not args.sample:
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise SystemExit(f"error: {flags} only apply with --sample")
        return None
    return SamplingOptions(**given)


def _transcribe(args: argparse.Namespace) -> None:
    data = _read_input(args.file)
    with _connect(args) as client:
        model = args.model or _first_audio_model(client)
        request = audio_request(data, model=model, attention=args.attention is not None, granularity="words",
                                beam_size=args.beam_size, to=args.to, hotwords=args.hotwords,
                                hotword_boost=args.hotword_boost)
        request = dataclasses.replace(request, source_language=args.source,
                                      decoding=dataclasses.replace(request.decoding, read_once=args.read_once))
        # The stream shows a long recording's progress, segment by segment.
        show = args.progress or sys.stderr.isatty()
        result = transcription.transcribe(client, request, sys.stderr if show else None)
    for path, kind in ((args.srt, "srt"), (args.vtt, "vtt")):
        if path:
            transcription.write_subtitles(result, path, kind)
    if args.attention:
        _drawing("plot").save_timeline(result.words, result.attention, args.attention)
    if args.json:
        print(json.dumps(dataclasses.asdict(result), default=_enum_value, ensure_ascii=False, indent=2))
        return
    print(result.text)
    if args.attention:
        print(f"attention: {args.attention}")
    elif args.attention is not None:
        print()
        print(timeline.render(result.words, result.attention))


def _caption(args: argparse.Namespace) -> None:
    data = _read_input(args.file)
    if not data.startswith((b"\x89PNG", b"\xff\xd8\xff")):  # not an image: a clip (the server names the formats)
        return _caption_clip(args, data)
    with _connect(args) as client:
        model = args.model or _first_model_of(client, InputKind.IMAGE)
        request = image_request(data, model=model, attention=args.attention is not None, granularity="words",
                                beam_size=args.beam_size)
        result = client.generate(request)
    if args.attention is not None:
        _drawing("overlay").render(data, result.attention).save(args.attention)
    if args.json:
        print(json.dumps(dataclasses.asdict(result), default=_enum_value, ensure_ascii=False, indent=2))
        return
    print(result.text)
    if args.attention is not None:
        print(f"attention of each word: {args.attention}")


def _caption_clip(args: argparse.Namespace, data: bytes) -> None:
    with _connect(args) as client:
        model = args.model or _first_model_of(client, InputKind.VIDEO)
        request = video_request(data, model=model, attention=args.attention is not None, granularity="words",
                                beam_size=args.beam_size)
        result = client.generate(request)
    if args.json:
        print(json.dumps(dataclasses.asdict(result), default=_enum_value, ensure_ascii=False, indent=2))
        return
    print(result.text)
    if args.attention is not None:
        strip = _drawing("filmstrip")
        times = [float(t) for t in result.frames[0].frame_seconds] if result.frames else []
        try:
            frames = strip.clip_frames(request.video, times)
        except (NotImplementedError, ValueError) as exc:  # no PyAV here, or a file this client cannot decode
            raise SystemExit(f"error: cannot draw the clip's frames: {exc}") from None
        strip.render(frames, result.attention).save(args.attention)
        print(strip.text_timelines(result.attention))
        print(f"attention of each word: {args.attention}")


def _drawing(module: str):
    """clients/plot or clients/overlay, which import matplotlib or Pillow and numpy: only PNG output needs them.

    Raises:
        SystemExit: they are not installed (the `plot` extra of either distribution brings them).
    """
    try:
        return importlib.import_module(f"attnserve.clients.{module}")
    except ImportError as exc:
        raise SystemExit(
            f"error: drawing a PNG needs the plot extra (pip install 'attnserve-client[plot]', or 'attnserve[plot]' "
            f"beside the server): {exc}"
        ) from None


def _read_input(path: str) -> bytes:
    try:
        return sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
    except OSError as exc:
        raise SystemExit(f"error: cannot read {path}: {exc.strerror}") from None


def _first_model_of(client: Client, kind: InputKind) -> str:
    names = [info.name for info in client.list_models() if info.input_kind is kind]
    if not names:
        raise SystemExit(f"error: the server has no {kind.value} model (see `attnserve models`)")
    return names[0]


def _first_audio_model(client: Client) -> str:
    return _first_model_of(client, InputKind.AUDIO)


def _print_stream(client: Client, request) -> GenerationResult:
    """Prints the output text as the server decodes it; returns the final result."""
    for event in client.stream(request):
        if isinstance(event, GenerationResult):
            print()
            return event
        print(event.text, end="", flush=True)
    raise RuntimeError("the stream ended without a final response")


def _compare(args: argparse.Namespace) -> int:
    with _connect(args) as client:
        # The server says which models translate and into what, unless the options say both.
        needed = args.models is None or args.to is None
        infos = {info.name: info for info in client.list_models()} if needed else {}
        names = _compared_models(args.models, infos, args.address)
        requests = [
            translation_request(
                args.text,
                to=_target(args.to, infos.get(name), args.text),
                attention=True,
                granularity=args.granularity,
                model=name,
            )
            for name in names
        ]
        outcomes = _generate_each(client, requests)
    if args.json:
        results = {o.model: _error_json(o.error) if o.error else dataclasses.asdict(o.result) for o in outcomes}
        print(json.dumps(results, default=_enum_value, ensure_ascii=False, indent=2))
    else:
        width = shutil.get_terminal_size().columns  # COLUMNS when set, else the terminal's, else 80
        print("\n".join(comparison.render(outcomes, width, color=sys.stdout.isatty())))
    return 1 if any(o.error is not None for o in outcomes) else 0


def _target(option: str | None, info: ModelInfo | None, text: str) -> str:
    """--to, else the model's choice for the text; "" (the server's default) for a model not served."""
    if option is not None:
        return option
    return languages.default_target(info, text) if info is not None else ""


def _compared_models(option: str | None, infos: dict[str, ModelInfo], address: str) -> list[str]:
    """The models `--models` names, else every served translation model; two or more, each once."""
    if option is not None:
        names = [name.strip() for name in option.split(",") if name.strip()]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise SystemExit(f"error: --models names {', '.join(repeated)} more than once; name each model once")
        if len(names) < 2:
            raise SystemExit(f"error: compare needs two or more models; --models names {', '.join(names) or 'none'}")
        return names
    names = [info.name for info in infos.values() if info.task == "translation"]
    if len(names) < 2:
        served = f"only {names[0]}" if names else "none"
        raise SystemExit(f"error: compare needs two or more translation models; {address} serves {served}")
    return names


def _generate_each(client: Client, requests: list[GenerationRequest]) -> list[comparison.Outcome]:
    """Runs the requests concurrently (each model has its own worker on the server); a failure stays its own."""
    workers = concurrent.futures.ThreadPoolExecutor(len(requests))
    try:
        futures = [workers.submit(client.generate, request) for request in requests]
        outcomes = []
        for request, future in zip(requests, futures):
            try:
                outcomes.append(comparison.Outcome(request.model, result=future.result()))
            except AttnServeError as exc:
                outcomes.append(comparison.Outcome(request.model, error=exc))
        return outcomes
    finally:
        workers.shutdown(wait=False, cancel_futures=True)  # on Ctrl+C, closing the client ends the calls


def _error_json(error: AttnServeError) -> dict:
    return {"error": {"code": error.code.name, "message": error.details}}


def _models(args: argparse.Namespace) -> None:
    with _connect(args) as client:
        infos = client.list_models()
    for info in infos:
        print(f"{info.name} (version {info.version}, {info.task}): {info.description}")
        print(f"  input: {_input_line(info)}")
        print(f"  languages: {', '.join(info.source_languages)} -> {', '.join(info.target_languages)}")
        unit = "source tokens" if info.input_kind is InputKind.TEXT else "attention columns"
        limits = [f"{info.max_text_chars} characters"] if info.max_text_chars else []
        limits += [f"{info.max_source_tokens} {unit}", f"{info.max_new_tokens} new tokens"]
        limits += [f"beam size {info.max_beam_size}"] if info.max_beam_size else []  # 0: an older server
        search = "greedy" if info.default_beam_size <= 1 else f"beam search, {info.default_beam_size} beams"
        limits += [f"requests of {info.max_request_bytes:,} bytes"] if info.max_request_bytes else []
        limits += [f"responses of {info.max_response_bytes:,} bytes"] if info.max_response_bytes else []
        limits += [f"{info.max_attention_values:,} attention values"] if info.max_attention_values else []
        print(f"  limits: {', '.join(limits)}")
        print(f"  attention: {info.attention_layers} layers x {info.attention_heads} heads")
        print(f"  default search: {search}")
        if info.variant:
            print(f"  graphs: the {info.variant} variant")


def _health(args: argparse.Namespace) -> int:
    """One line per address: its status; exit status 0 only when every address is SERVING."""
    with _connect(args, timeout=10.0) as client:
        statuses = client.health(args.service)
    for address, status in statuses.items():
        print(f"{address}: {status}")
    return 0 if all(status == "SERVING" for status in statuses.values()) else 1


def _web(args: argparse.Namespace) -> None:
    try:
        from attnserve.clients.web import gateway
    except ImportError as exc:  # aiohttp comes with the `web` extra
        raise SystemExit(f"error: the web demo needs the web extra (pip install 'attnserve[web]'): {exc}") from None
    from attnserve.clients.web import http_options

    try:
        http = http_options.from_args(args)
        http.ssl_context()  # a wrong certificate stops here, before anything listens
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    scheme = "https" if http.tls_cert else "http"
    print(f"attnserve web: {scheme}://{args.host}:{args.port}/ (gRPC server: {args.address})", flush=True)
    _connect(args).close()  # checks the flags here; the gateway makes its own asyncio client from them
    try:
        gateway.run(args.address, args.host, args.port, http, **_connection(args))
    except OSError as exc:  # the port is in use, or the host is not an interface of this machine
        raise SystemExit(f"error: {exc}") from None


def _input_line(info: ModelInfo) -> str:
    """What the model reads, with the limits a request must respect."""
    if info.audio is not None:
        a = info.audio
        files = ", ".join(f.upper() for f in a.formats) or "WAV"
        # A server that cuts long recordings at pauses says how long they may be.
        long_form = (f" (longer, cut at pauses: up to {a.long_form_max_seconds:g} s and {a.long_form_max_bytes} "
                     "bytes)") if a.long_form_max_seconds else ""
        speeds = len(a.speeds) > 1  # beam search reads each recording at these speeds (--read-once: at 1.0)
        readings = f"; read at speeds {', '.join(f'{s:g}' for s in a.speeds)}" if speeds else ""
        readings += "; candidates rescored with a word LM" if a.word_lm else ""
        return (
            f"audio ({files} or samples, resampled to {a.sample_rate_hz} Hz), at most {a.max_seconds:g} s and "
            f"{a.max_bytes} bytes{long_form}; {a.seconds_per_column:g} s per attention column{readings}"
        )
    if info.image is not None:
        i = info.image
        return (f"image ({i.width}x{i.height}, {i.grid_rows}x{i.grid_cols} grid), at most {i.max_bytes} bytes"
                f" and {i.max_pixels} pixels")
    if info.video is not None:
        v = info.video
        return (f"video ({v.frames} frames of {v.width}x{v.height}, {v.grid_rows}x{v.grid_cols} grid each), at most "
                f"{v.max_seconds:g} s, {v.max_bytes} bytes, {v.max_frames} frames and {v.max_pixels} pixels a frame")
    return info.input_kind.value


def _enum_value(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


if __name__ == "__main__":
    sys.exit(main())
