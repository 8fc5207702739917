"""Glossaries: the target terms a translation must use for the source terms its text contains.

A request's `DecodingOptions.glossary` (source term -> target term), with `use_default_glossary` merged
over the model's default glossary (`glossary.tsv` in the model's repository folder, beside its version
folders: one `source<TAB>target` per line, `#` comments), the request's entries winning. The default is
opt-in, so that a request without glossary options decodes as it always did (and model cards measure the
model alone). Every occurrence of a source term in the
text becomes one constraint: the target term's token ids, which constrained beam search
(server/decoding/constrained_search.py) must place in the output. After decoding, `placements` finds each target
term among the output tokens, so the response (and the attention rows of those tokens) shows where it went.

Matching is on characters, ignoring case: terms are found where they occur, longest first, never
overlapping; where a default term and a request term overlap, the request's wins; two request terms that
overlap are a conflict the caller must resolve. Everything that cannot be enforced is a ValueError naming the term.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence

from attnserve.api.generation import GenerationRequest, GlossaryPlacement
from attnserve.api.language_detection import script_of
from attnserve.server.model.tokenization import Tokenizer

FILE = "glossary.tsv"
MAX_TERMS = 16  # constraints per request: each adds candidates to every beam at every step


@dataclasses.dataclass(frozen=True)
class Constraint:
    """One occurrence of a glossary term in the source and the tokens its target term must appear as."""

    source: str
    target: str
    source_start: int  # characters of the text: [source_start, source_end)
    source_end: int
    token_ids: tuple[int, ...]


def read_file(path: pathlib.Path) -> dict[str, str]:
    """A glossary file's entries; {} when there is none.

    Raises:
        ValueError: a line that is not `source<TAB>target` with both non-empty (the message names it).
    """
    if not path.is_file():
        return {}
    entries = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        source, _, target = line.partition("\t")
        if not source.strip() or not target.strip():
            raise ValueError(f"{path}:{number}: expected 'source<TAB>target', got {line!r}")
        entries[source.strip()] = target.strip()
    return entries


class Glossary:
    """A model's default glossary and the tokenizer its target terms are written with.

    Args:
        default: the model's default entries (read_file of its glossary.tsv).
        tokenizer: the model's tokenizer.
        unk: the unknown-piece id (a target term that needs it cannot be written), or None.
        text_model: whether the model reads text (only text has terms to find).
    """

    def __init__(self, default: Mapping[str, str], tokenizer: Tokenizer, unk: int | None, text_model: bool):
        self.default = dict(default)
        self._tokenizer = tokenizer
        self._unk = unk
        self._text_model = text_model

    def constraints(self, request: GenerationRequest, max_new_tokens: int, beam_size: int) -> tuple[Constraint, ...]:
        """The constraints of a request, in source order.

        Raises:
            ValueError: a request glossary for a model that does not read text, an empty or unwritable term,
                overlapping request terms, more than MAX_TERMS terms, target terms longer than
                max_new_tokens together, or terms with greedy search or sampling (beam_size < 2).
        """
        options = request.decoding
        if options.glossary and not self._text_model:
            raise ValueError("a glossary constrains translations of text: this model does not read text")
        requested = dict(options.glossary)
        # The default glossary does not refuse a greedy or sampled request: it is skipped there.
        default = self.default if options.use_default_glossary and beam_size >= 2 else {}
        found = _occurrences(request.text, requested, default)
        if not found:
            return ()
        if len(found) > MAX_TERMS:
            raise ValueError(f"the text holds {len(found)} glossary terms; at most {MAX_TERMS} are enforced at once")
        if beam_size < 2:
            terms = ", ".join(f"'{source}'" for source, *_ in found)
            raise ValueError(f"glossary term(s) {terms} need beam search: use beam_size 2 or more (got {beam_size})")
        out = tuple(Constraint(source, target, start, end, self._token_ids(target))
                    for source, target, start, end in found)
        needed = sum(len(c.token_ids) for c in out)
        if needed > max_new_tokens:
            raise ValueError(f"glossary targets need {needed} tokens ({', '.join(repr(c.target) for c in out)}); "
                             f"max_new_tokens is {max_new_tokens}")
        return out

    def _token_ids(self, target: str) -> tuple[int, ...]:
        if not target.strip():
            raise ValueError("glossary target term is empty")
        ids = tuple(self._tokenizer.encode(target)[:-1])  # without EOS
        if script_of(target) not in (None, "Latin") and " " not in target.strip():
            ids = self._inside_text(target) or ids
        if not ids or (self._unk is not None and self._unk in ids):
            raise ValueError(f"glossary target term {target!r} cannot be written with this model's vocabulary")
        return ids


    def _inside_text(self, target: str) -> tuple[int, ...] | None:
        """A term of a script written without spaces (Han, kana) as its pieces inside a sentence: without
        the word-start marker a tokenizer gives text that starts with it (which would decode as a space)."""
        lead = self._tokenizer.encode(_LEAD)[:-1]
        both = self._tokenizer.encode(_LEAD + target)[:-1]
        if both[: len(lead)] != lead or len(both) == len(lead):
            return None
        return tuple(both[len(lead) :])


_LEAD = "的"  # a common character after which a term is tokenized as inside a sentence


def _occurrences(text: str, requested: dict[str, str], default: dict[str, str]) -> list[tuple[str, str, int, int]]:
    """(source, target, start, end) of every term occurrence, non-overlapping, in text order."""
    for source in requested:
        if not source.strip():
            raise ValueError("glossary source term is empty")
    # Case does not matter ("Deep learning" holds "deep learning"), where lower-casing keeps every offset.
    folded = text.lower() if len(text.lower()) == len(text) else text
    found = []  # (start, -length, from_request, source, target)
    for from_request, entries in ((True, requested), (False, default)):
        for source, target in entries.items():
            if not from_request and source in requested:
                continue  # the request's entry replaces the default one
            key = source.lower() if folded is not text else source
            start = folded.find(key)
            while start != -1:
                found.append((start, -len(source), from_request, text[start : start + len(source)], target))
                start = folded.find(key, start + len(source))
    kept: list[tuple[int, int, bool, str, str]] = []
    for start, minus_length, from_request, source, target in sorted(found, key=lambda f: (f[0], f[1], not f[2])):
        end = start - minus_length
        overlapping = [k for k in kept if k[0] < end and start < k[1]]
        if not overlapping:
            kept.append((start, end, from_request, source, target))
            continue
        other = overlapping[0]
        if from_request and other[2] and other[3] != source:
            raise ValueError(f"glossary terms '{other[3]}' and '{source}' overlap in the text: keep one of them")
        if from_request and not other[2]:  # a request term displaces the default term it overlaps
            kept.remove(other)
            kept.append((start, end, from_request, source, target))
    return [(source, target, start, end) for start, end, _, source, target in sorted(kept)]


def placements(constraints: Sequence[Constraint], token_ids: Sequence[int]) -> list[GlossaryPlacement]:
    """Where each constraint's target tokens are in the output: in order, each occurrence used once."""
    ids, used, out = list(token_ids), set(), []
    for c in constraints:
        n, span = len(c.token_ids), (-1, -1)
        for i in range(len(ids) - n + 1):
            if tuple(ids[i : i + n]) == c.token_ids and i not in used:
                span = (i, i + n)
                used.add(i)
                break
        out.append(GlossaryPlacement(c.source, c.target, c.source_start, c.source_end, *span))
    return out
