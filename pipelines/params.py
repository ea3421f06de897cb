"""Typed access to params.yaml: one frozen dataclass per section, declared next to the stage that uses it.

An unknown key is an error, not something to ignore; a missing key takes the dataclass default.

    @dataclass(frozen=True)
    class DedupeParams:
        eval_splits: tuple[str, ...] = (...)
    p = load_section(DedupeParams, "dedupe")          # reads ./params.yaml
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
PARAMS_FILE = Path("params.yaml")


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is tuple and isinstance(value, list):
        return tuple(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def from_dict(cls: type[T], data: dict | None, section: str = "") -> T:
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"params.yaml section {section or cls.__name__!r}: unknown key(s) {unknown}; "
                         f"known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {k: _coerce(hints.get(k), v, f"{section}.{k}") for k, v in data.items()}
    return cls(**kwargs)


def read_params(path: Path = PARAMS_FILE) -> dict:
    path = Path(path)
    if not path.exists():
        return {}
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def load_section(cls: type[T], section: str, path: Path = PARAMS_FILE) -> T:
    """The dataclass for ``section`` of params.yaml (defaults when the file or section is absent)."""
    return from_dict(cls, read_params(path).get(section), section)


def as_dict(params: Any) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(params).items()}
