"""Option fields that carry their own bounds, and the one function that checks them.

Every option dataclass (RuntimeOptions, BatchingOptions, SchedulingOptions, ServeOptions) declares a
bounded field once, with `bounded(default, least=..., choices=...)`, and validates itself with `check`. The
flags of `attnserve serve` mirror the engine's options: a ServeOptions field made with `mirror` takes the
default and the bounds of the engine field it sets, so neither is written twice, and a bad flag is refused
with the same bound the engine would apply, named by its flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any


def bounded(default: Any, *, least: float | None = None, above: float | None = None, most: float | None = None,
            choices: Sequence[Any] | None = None) -> Any:
    """A dataclass field with its bounds: value >= least, value > above, value <= most, value in choices
    (None, where a field allows it, passes every bound)."""
    bounds = {"least": least, "above": above, "most": most, "choices": None if choices is None else tuple(choices)}
    return dataclasses.field(default=default, metadata={k: v for k, v in bounds.items() if v is not None})


def mirror(owner: type, name: str) -> Any:
    """A field with the default and bounds of `owner`'s field `name` (an option the server passes on)."""
    field = owner.__dataclass_fields__[name]
    return dataclasses.field(default=field.default, metadata=field.metadata)


def problems(options: Any, label: Callable[[str], str] | None = None) -> Iterator[str]:
    """Every field of `options` outside its bounds, each named by `label(field)` (default: Class.field)."""
    label = label or (lambda name: f"{type(options).__name__}.{name}")
    for field in dataclasses.fields(options):
        value, bounds = getattr(options, field.name), field.metadata
        if value is None or not bounds:
            continue
        if "choices" in bounds and value not in bounds["choices"]:
            yield f"{label(field.name)} {value!r} is not one of {', '.join(map(str, bounds['choices']))}"
        least, most = bounds.get("least"), bounds.get("most")
        if least is not None and most is not None and not least <= value <= most:
            yield f"{label(field.name)} {value} is out of range: use {least}..{most}"
        elif least is not None and value < least:
            yield f"{label(field.name)} must be at least {least}, got {value}"
        elif most is not None and value > most:
            yield f"{label(field.name)} must be at most {most}, got {value}"
        if "above" in bounds and value <= bounds["above"]:
            yield f"{label(field.name)} must be more than {bounds['above']}, got {value}"


def check(options: Any, extra: Sequence[str] = ()) -> None:
    """Raises ValueError naming every field out of bounds (and the `extra` problems found by the caller)."""
    found = [*problems(options), *extra]
    if found:
        raise ValueError("; ".join(found))
