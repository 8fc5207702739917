"""A local transformers checkpoint folder, read without surprises: what `huggingface-cli download` leaves.

Every importer reads its folder through `Checkpoint`: the JSON files it needs (a missing one is refused by
name), the weights (safetensors read without unpickling; a `.bin` only with `torch.load(weights_only=True)`),
and the config keys. A config key that the family's importer neither maps onto the contract nor knowingly
ignores is refused by name (`check_keys`), so a checkpoint with a feature the importer has not been taught
is never served as a silently different model.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Iterable, Mapping

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Keys every transformers config carries that say nothing about the computation.
BOOKKEEPING_KEYS = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "id2label", "label2id", "_num_labels", "num_labels", "return_dict", "output_attentions",
    "output_hidden_states", "use_cache", "gradient_checkpointing", "tie_word_embeddings",
    "is_encoder_decoder", "problem_type", "chunk_size_feed_forward", "tokenizer_class", "prefix",
    "task_specific_params", "finetuning_task", "cross_attention_hidden_size", "add_cross_attention",
    "torchscript", "pruned_heads", "is_decoder", "tf_legacy_loss", "use_bfloat16", "output_past",
    # training-only settings: dropout is off and initialisation is over when serving
    "dropout", "attention_dropout", "activation_dropout", "classifier_dropout", "classif_dropout",
    "encoder_layerdrop", "decoder_layerdrop", "init_std", "layerdrop",
})
# Generation settings stored in old configs; the importer reads them from generation_config.json.
GENERATION_KEYS = frozenset({
    "max_length", "min_length", "num_beams", "num_beam_groups", "do_sample", "early_stopping",
    "length_penalty", "no_repeat_ngram_size", "repetition_penalty", "temperature", "top_k", "top_p",
    "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id", "decoder_start_token_id",
    "bos_token_id", "eos_token_id", "pad_token_id", "num_return_sequences", "diversity_penalty",
    "renormalize_logits", "suppress_tokens", "begin_suppress_tokens", "max_new_tokens",
})


class Checkpoint:
    """One checkpoint folder.

    Args:
        folder: the folder holding config.json and the weights.

    Raises:
        ValueError: the folder, config.json or the weights are missing.
    """

    def __init__(self, folder: str | pathlib.Path):
        self.folder = pathlib.Path(folder)
        if not self.folder.is_dir():
            raise ValueError(f"{self.folder}: not a checkpoint folder (no such directory)")
        self.config = self.json("config.json")
        weights = [self.folder / name for name in WEIGHT_FILES if (self.folder / name).is_file()]
        if not weights:
            raise ValueError(f"{self.folder}: no weights: expected one of {', '.join(WEIGHT_FILES)}")
        self.weights_path = weights[0]  # safetensors first: it never runs code

    def path(self, name: str) -> pathlib.Path:
        """`folder/name`, which must exist.

        Raises:
            ValueError: naming the missing file.
        """
        path = self.folder / name
        if not path.is_file():
            raise ValueError(f"{self.folder}: missing file {name}")
        return path

    def json(self, name: str, default: dict | None = None) -> dict:
        """A JSON object file of the folder; `default` when given and the file is absent."""
        if default is not None and not (self.folder / name).is_file():
            return default
        path = self.path(name)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return data

    @property
    def architecture(self) -> str:
        names = self.config.get("architectures") or []
        if len(names) != 1:
            raise ValueError(f"{self.folder}/config.json: 'architectures' must name one class, got {names!r}")
        return names[0]

    def state_dict(self) -> dict:
        """The weights as torch tensors, never unpickling arbitrary objects."""
        import torch

        if self.weights_path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(self.weights_path))
        try:
            return torch.load(self.weights_path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch refuses pickled code under weights_only
            raise ValueError(f"{self.weights_path}: not loadable with weights_only=True: {exc}") from exc

    def check_keys(self, handled: Iterable[str], ignored: Mapping[str, object] = {}) -> None:
        """Refuses config keys the importer does not know.

        Args:
            handled: keys the importer maps onto the contract (or checks).
            ignored: keys known to have no effect at inference, each with the only value(s) that is so
                (a tuple of values, or None for any value).

        Raises:
            ValueError: naming the first unknown key, or an ignored key with a value that would matter.
        """
        known = set(handled) | BOOKKEEPING_KEYS | GENERATION_KEYS
        for key, value in self.config.items():
            if key in ignored:
                allowed = ignored[key]
                if allowed is not None and value not in allowed:
                    raise ValueError(f"{self.folder}/config.json: {key}={value!r} is not supported "
                                     f"(the importer handles {allowed!r})")
            elif key not in known:
                raise ValueError(f"{self.folder}/config.json: key {key!r} is not handled by the importer")

    def generation(self, handled: Iterable[str], defaults: Mapping[str, object]) -> dict:
        """The generation settings (generation_config.json, else the old config's own keys).

        Args:
            handled: keys the family's manifest expresses.
            defaults: keys the server reproduces only at these (transformers' default) values.

        Raises:
            ValueError: naming a key that is neither, or one of `defaults` at another value.
        """
        handled = frozenset(handled)
        generation = self.json("generation_config.json", default={
            k: v for k, v in self.config.items() if k in handled or k in defaults})
        for key, value in generation.items():
            if key in defaults:
                if value != defaults[key]:
                    raise ValueError(f"{self.folder}/generation_config.json: {key}={value!r} is not supported "
                                     f"(the server decodes with {defaults[key]!r})")
            elif key not in handled:
                raise ValueError(f"{self.folder}/generation_config.json: key {key!r} is not handled by the importer")
        decoding_fields(generation)  # refuses an early_stopping the search lacks before any graph is written
        return generation

    def load_into(self, model, derived: Iterable[str], stale: tuple[str, ...] = ()):
        """Loads the weights into `model` (a transformers model built from config.json); returns it in eval
        mode and the state dict.

        Args:
            derived: parameter names transformers does not save (static tables, tied weights).
            stale: name endings of tensors older transformers saved and today's computes instead (GPT-2's
                causal-mask buffers `attn.bias`, `attn.masked_bias`); left out of the load.

        Raises:
            ValueError: the weights do not fit config.json (unexpected or missing tensors).
        """
        state = {k: v for k, v in self.state_dict().items() if not k.endswith(stale)}  # endswith(()) is False
        result = model.load_state_dict(state, strict=False)
        missing = sorted(set(result.missing_keys) - set(derived))
        if result.unexpected_keys or missing:
            raise ValueError(f"{self.weights_path}: weights do not fit config.json: unexpected "
                             f"{sorted(result.unexpected_keys)[:5]}, missing {missing[:5]}")
        return model.eval(), state

    def provenance(self) -> dict:
        """SHA-256 of every file of the folder (config, weights, tokenizer files), for the model card."""
        files = sorted(p for p in self.folder.iterdir() if p.is_file())
        return {p.name: _sha256(p) for p in files}


def decoding_fields(generation: Mapping[str, object]) -> dict:
    """The manifest's `decoding` section from generation settings: `num_beams` -> beam_size and
    `early_stopping` (True: stop once num_beams sequences are finished) -> early_stopping; {} for greedy.

    Raises:
        ValueError: early_stopping "never" (or another non-boolean), which the server's search lacks.
    """
    beams, early = generation.get("num_beams", 1), generation.get("early_stopping", False)
    if not isinstance(early, bool):
        raise ValueError(f"generation_config.json: early_stopping={early!r} is not supported "
                         f"(the server stops beams with true or false)")
    if beams <= 1:
        return {}
    return {"decoding": {"beam_size": beams, **({"early_stopping": True} if early else {})}}


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
