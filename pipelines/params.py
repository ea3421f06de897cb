"""Typed access to params.yaml: one frozen dataclass per section, declared next to the stage that uses it.

An unknown key is an error, not something to ignore; a missing key takes the dataclass default.

    @dataclass(frozen=True)
    class DedupeParams:
        eval_splits: tuple[str, ...] = (...)
    p = load_section(DedupeParams, "dedupe")          # reads ./params.yaml
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
PARAMS_FILE = Path("params.yaml")


def coerce(tp: Any, value: Any, where: str) -> Any:
    """Check a YAML value against a dataclass field type, strictly: ``"8"`` is not an int, ``1`` is not a bool.

    The only conversions are the lossless ones YAML needs: an int widens to float, a list becomes a tuple, a
    mapping becomes a (frozen) dataclass field's type by :func:`from_dict`. ``X | None`` accepts None;
    ``Literal[...]`` accepts its values. Raises ValueError naming ``where``.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return coerce(option, value, where)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if len(errors) == 1 else f"{where}: {value!r} fits none of {options}")
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{where} must be one of {list(args)}, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where} must be a list, got {value!r}")
        item = args[0] if args else Any
        return tuple(coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be a mapping, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):        # a nested section: the same strict rules, named by its path
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be a mapping, got {value!r}")
        return from_dict(tp, value, where)
    return value


def from_dict(cls: type[T], data: dict | None, section: str = "") -> T:
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"params.yaml section {section or cls.__name__!r}: unknown key(s) {unknown}; "
                         f"known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {k: coerce(hints[k], v, f"{section or cls.__name__}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:      # a required field left out (a nested section without its defaults)
        raise ValueError(f"params.yaml {section or cls.__name__!r}: {e}") from None


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


def add_path_arguments(p: argparse.ArgumentParser, positional: dict[str, str], **options: str) -> None:
    """A stage's path arguments: ``positional`` (name -> help, in order), then ``--params`` (the params file) and
    one ``--NAME`` option per keyword with its default path (``metrics="metrics/dedupe.json"``)."""
    for name, help_text in positional.items():
        p.add_argument(name, type=Path, help=help_text)
    p.add_argument("--params", type=Path, default=PARAMS_FILE)
    for name, default in options.items():
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=Path, default=Path(default))


def module_main(module: str, doc: str | None, add_arguments: Callable[[argparse.ArgumentParser], None],
                run_cli: Callable[[argparse.Namespace], int], argv: list[str] | None = None) -> int:
    """The ``main`` of a stage or command module run as ``python -m MODULE``: its parser (described by the first
    line of ``doc``), its arguments, then ``run_cli`` on them."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0] if doc else None)
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))
