"""Loads a model repository: `<repository>/<model-name>/<version>/` folders (docs/model-contract.md).

For each model the highest integer version is served. Loading checks that every file the manifest names
exists and that the ONNX graphs' input/output names, dtypes and ranks are what the manifest promises, so a
broken export fails at startup with a message naming the file, not at the first request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from attnserve.server.model.manifest import Manifest, load_manifest
from attnserve.server.model.runtime_options import RuntimeOptions

if TYPE_CHECKING:
    from attnserve.server.model.runtime import GraphSignature, Runtime

logger = logging.getLogger(__name__)
T = TypeVar("T")

MANIFEST_FILE = "manifest.json"
# The contract fixes these dtypes; state dtypes come from the manifest, encoder inputs from its `input`.
IDS_DTYPE = "int64"
FLOAT_DTYPES = ("float32", "float16")


@dataclasses.dataclass(frozen=True)
class ModelVersion:
    """One version folder whose manifest parsed and whose files exist."""

    name: str
    version: int
    # The version folder.
    path: pathlib.Path
    manifest: Manifest

    @property
    def encoder_path(self) -> pathlib.Path:
        return self.path / self.manifest.encoder.file

    @property
    def decoder_path(self) -> pathlib.Path:
        return self.path / self.manifest.decoder.file

    def graph_paths(self, variant: str | None) -> tuple[pathlib.Path, pathlib.Path]:
        """Encoder and decoder files of `variant` (None, or one this model lacks: the default graphs)."""
        chosen = self.manifest.variants.get(variant) if variant else None
        if chosen is None:
            return self.encoder_path, self.decoder_path
        return self.path / chosen.encoder_file, self.path / chosen.decoder_file

    @property
    def tokenizer_path(self) -> pathlib.Path:
        return self.path / self.manifest.tokenizer.file


def find_models(repository: str | pathlib.Path, broken: dict[str, str] | None = None,
                only: Sequence[str] = ()) -> dict[str, ModelVersion]:
    """Finds every model folder in a repository and loads its highest version's manifest.

    Args:
        broken: None = a broken model fails the whole repository; a dict = it is skipped and recorded
            here (model folder name -> the reason), so that the healthy models can still be served.
        only: these model folders alone (the others are not read at all); empty = every one.

    Returns:
        Model name -> its newest version, in name order.

    Raises:
        ValueError: the repository is missing or empty, a model of `only` is not in it, or (without `broken`)
            a model's newest version is broken.
    """
    repository = pathlib.Path(repository)
    if not repository.is_dir():
        raise ValueError(f"{repository}: model repository folder does not exist")
    folders = sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))
    missing = sorted(set(only) - {f.name for f in folders})
    if missing:
        raise ValueError(f"{repository}: no model {', '.join(map(repr, missing))} in the repository; it has "
                         f"{', '.join(f.name for f in folders) or 'none'}")
    models = {}
    for folder in (f for f in folders if not only or f.name in only):
        try:
            models[folder.name] = newest_intact_version(folder)
        except ValueError as exc:
            if broken is None:
                raise
            broken[folder.name] = str(exc)
    if not models and not broken:
        raise ValueError(f"{repository}: no model folders in the model repository")
    return models


def newest_version(model_folder: pathlib.Path) -> pathlib.Path:
    """The subfolder with the highest integer name.

    Raises:
        ValueError: there is no integer-named subfolder.
    """
    found = versions(model_folder)
    if not found:
        raise ValueError(f"{model_folder}: no version folder (expected an integer name such as '1')")
    return found[0]


def versions(model_folder: pathlib.Path) -> list[pathlib.Path]:
    """The integer-named subfolders, newest first."""
    found = [p for p in model_folder.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(found, key=lambda p: -int(p.name))


def newest_intact_version(model_folder: pathlib.Path) -> ModelVersion:
    """The newest version whose manifest loads (`first_intact`).

    Raises:
        ValueError: no version folder, or none loads (the newest version's error).
    """
    return first_intact(newest_version(model_folder), load_model_version)


def first_intact(version: pathlib.Path, load: Callable[[pathlib.Path], T]) -> T:
    """`load(version)`, or if that raises ValueError, `load` of the newest older version of the same model
    that succeeds, with a warning: a broken upload of version N+1 must not take version N off the air.

    Raises:
        ValueError: no version loads (the error of `version`).
    """
    try:
        return load(version)
    except ValueError as exc:
        for older in [v for v in versions(version.parent) if int(v.name) < int(version.name)]:
            with contextlib.suppress(ValueError):
                loaded = load(older)
                logger.warning("model %r: version %s is broken (%s); serving version %s instead",
                               version.parent.name, version.name, exc, older.name)
                return loaded
        raise


def load_model_version(folder: pathlib.Path) -> ModelVersion:
    """Parses `<folder>/manifest.json` and checks it matches its folder and that its files exist.

    Raises:
        ValueError: naming the file and the problem.
    """
    manifest = load_manifest(folder / MANIFEST_FILE)
    where = folder / MANIFEST_FILE
    if manifest.name != folder.parent.name:
        raise ValueError(f"{where}: name {manifest.name!r} differs from its model folder {folder.parent.name!r}")
    if manifest.version != int(folder.name):
        raise ValueError(f"{where}: version {manifest.version} differs from its version folder {folder.name!r}")
    variant_files = [
        (f"variants.{name}.{graph}", file)
        for name, v in manifest.variants.items()
        for graph, file in (("encoder", v.encoder_file), ("decoder", v.decoder_file))
    ]
    for field, file in (
        ("encoder.file", manifest.encoder.file),
        ("decoder.file", manifest.decoder.file),
        ("tokenizer.file", manifest.tokenizer.file),
        *variant_files,
        *([("language_model.file", manifest.language_model.file)] if manifest.language_model else []),
        *([("word_language_model.file", manifest.word_language_model.file)] if manifest.word_language_model else []),
        *([("tokenizer.source.file", manifest.tokenizer.source.file),
           ("tokenizer.source.vocab", manifest.tokenizer.source.vocab)] if manifest.tokenizer.source else []),
    ):
        if not (folder / file).is_file():
            raise ValueError(f"{folder / file}: file named by {where} field '{field}' does not exist")
    return ModelVersion(manifest.name, manifest.version, folder, manifest)


def open_runtime(model: ModelVersion, options: RuntimeOptions = RuntimeOptions()) -> Runtime:
    """Opens the model's ONNX Runtime sessions and checks the graphs against the manifest.

    Raises:
        ValueError: a graph cannot be loaded or disagrees with the manifest.
    """
    from attnserve.server.model.runtime import Runtime  # here, so that listing a repository needs no onnxruntime

    variant = options.variant if options.variant in model.manifest.variants else None
    if options.variant and variant is None:
        logger.info("model %r has no %r variant: serving its default graphs", model.name, options.variant)
    spec = model.manifest.input
    fixed = spec.kind == "audio" and spec.features.pad_seconds is not None  # every clip padded to one window
    runtime = Runtime(*model.graph_paths(variant), options, variant or "", fixed_encoder_shapes=fixed)
    check_signatures(model.manifest, runtime.encoder_signature, runtime.decoder_signature)
    return runtime


def check_signatures(manifest: Manifest, encoder: GraphSignature, decoder: GraphSignature) -> None:
    """Checks names, dtypes and ranks of both graphs' inputs and outputs against the manifest.

    Raises:
        ValueError: "<graph file>: <problem>" for the first mismatch found.
    """
    _check_encoder(manifest, encoder)
    _check_decoder_inputs(manifest, encoder, decoder)
    _check_decoder_outputs(manifest, decoder)


def _expect(graph: GraphSignature, side: str, name: str, dtypes: tuple[str, ...], rank: int, role: str) -> None:
    tensors = graph.inputs if side == "input" else graph.outputs
    if name not in tensors:
        raise ValueError(f"{graph.path}: has no {side} {name!r} ({role}); its {side}s are {sorted(tensors)}")
    t = tensors[name]
    if t.dtype not in dtypes:
        needs = " or ".join(dtypes)
        raise ValueError(f"{graph.path}: {side} {name!r} ({role}) is {t.dtype}, the manifest needs {needs}")
    if t.rank != rank:
        raise ValueError(f"{graph.path}: {side} {name!r} ({role}) has rank {t.rank} {list(t.shape)}, expected {rank}")


def _check_encoder(m: Manifest, encoder: GraphSignature) -> None:
    extra = sorted(set(encoder.inputs) - set(m.encoder.inputs.values()))
    if extra:
        raise ValueError(f"{encoder.path}: input(s) {extra} are not named in the manifest's encoder.inputs")
    # What the input kind's preprocessor feeds: dtypes, ranks and any size it fixes (mel bins, image size).
    for role, contract in m.input.encoder_inputs().items():
        name = m.encoder.inputs[role]
        _expect(encoder, "input", name, (contract.dtype,), len(contract.shape), f"encoder.inputs.{role}")
        _check_fixed_dims(encoder, name, contract.shape, skip=set())
    if m.encoder.length_hint is not None:
        _expect(encoder, "output", m.encoder.length_hint.output, ("int64",), 1, "encoder.length_hint.output")
    if m.encoder.ctc is not None:
        _expect(encoder, "output", m.encoder.ctc.log_probs, ("float32",), 3, "encoder.ctc.log_probs")
        _expect(encoder, "output", m.encoder.ctc.lengths, ("int64",), 1, "encoder.ctc.lengths")
    for s in m.static:
        if s.source not in encoder.inputs and s.source not in encoder.outputs:
            raise ValueError(f"{encoder.path}: static 'from' {s.source!r} is neither an input nor an output")
    for s in m.state:
        if s.init_from is not None and s.init_from not in encoder.outputs:
            raise ValueError(f"{encoder.path}: state init 'from' {s.init_from!r} is not an output")


def _check_decoder_inputs(m: Manifest, encoder: GraphSignature, decoder: GraphSignature) -> None:
    d = m.decoder
    fed = {d.input_ids, d.position_ids, d.self_attention_mask} - {None}
    fed |= {s.target for s in m.static} | {s.input for s in m.state}
    _expect(decoder, "input", d.input_ids, (IDS_DTYPE,), 2, "decoder.inputs.input_ids")
    if d.position_ids is not None:
        _expect(decoder, "input", d.position_ids, (IDS_DTYPE,), 2, "decoder.inputs.position_ids")
    if d.self_attention_mask is not None:
        _expect(decoder, "input", d.self_attention_mask, (IDS_DTYPE,), 2, "decoder.inputs.self_attention_mask")
    for i, s in enumerate(m.static):
        source = encoder.inputs.get(s.source) or encoder.outputs[s.source]
        _expect(decoder, "input", s.target, (source.dtype,), source.rank, f"static[{i}].to")
        if max(s.batch_axis, s.source_axis) >= source.rank:
            raise ValueError(f"{decoder.path}: static[{i}] axes do not fit {s.target!r} of rank {source.rank}")
    for i, s in enumerate(m.state):
        _expect(decoder, "input", s.input, (s.dtype,), len(s.shape), f"state[{i}].input")
        _check_fixed_dims(decoder, s.input, s.shape, skip={s.batch_axis, s.time_axis})
    unfed = sorted(set(decoder.inputs) - fed)
    if unfed:
        raise ValueError(f"{decoder.path}: input(s) {unfed} are fed by neither decoder.inputs, static nor state")


def _check_decoder_outputs(m: Manifest, decoder: GraphSignature) -> None:
    _expect(decoder, "output", m.decoder.logits, FLOAT_DTYPES, 2, "decoder.outputs.logits")
    _expect(decoder, "output", m.attention.output, FLOAT_DTYPES, 4, "attention.output")
    fixed = (None, m.attention.layers, m.attention.heads, None)
    _check_fixed_dims(decoder, m.attention.output, fixed, skip={0, 3}, side="output")
    for i, s in enumerate(m.state):
        _expect(decoder, "output", s.output, (s.dtype,), len(s.shape), f"state[{i}].output")
        _check_fixed_dims(decoder, s.output, s.shape, skip={s.batch_axis, s.time_axis}, side="output")


def _check_fixed_dims(graph: GraphSignature, name: str, shape, skip: set, side: str = "input") -> None:
    """Where both the graph and the manifest fix an axis's size, the sizes must agree."""
    actual = (graph.inputs if side == "input" else graph.outputs)[name].shape
    for axis, (want, got) in enumerate(zip(shape, actual)):
        if axis in skip or not isinstance(want, int) or not isinstance(got, int):
            continue
        if want != got:
            raise ValueError(
                f"{graph.path}: {side} {name!r} axis {axis} is {got}, the manifest says {want} (shape {list(shape)})"
            )
