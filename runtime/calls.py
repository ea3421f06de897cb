"""Canonical forms of tool calls: the one canonicalization the pipeline's dedupe and the runtime's tool cache share.

Two strictnesses, one recursion (:func:`canonical_value`):

* the **exact key** of a call (:func:`call_key`), what the speculative tool cache (:mod:`ooospec.runtime.agent.tools`)
  matches on: key order and JSON whitespace do not matter (the arguments are compared as parsed values, written
  with sorted keys), and neither do number forms (``5``, ``5.0`` and ``5e0`` are one number); strings are kept
  byte for byte, because ``"Paris"`` and ``"paris"`` may be different calls to a case-sensitive tool::

      >>> call_key({"name": "f", "arguments": {"b": 5.0, "a": "X  y"}})
      '{"arguments":{"a":"X  y","b":5},"name":"f"}'

* the **normalized form** of the dedupe stage (:func:`norm_value`, :func:`canonical_calls`): the same, plus every
  string (and object key) through :func:`norm_text` (Unicode NFKC, casefold, whitespace collapsed), so
  near-duplicate training records collapse::

      >>> canonical_calls([{"name": "F", "arguments": {"B": 5.0, "a": " X  y "}}])
      '[{"arguments":{"a":"x y","b":5},"name":"f"}]'

Booleans are never numbers (``True`` and ``1`` stay apart) and ``None`` stays ``null``. :func:`canonical_json` is
the one serialization hashed and compared (compact, sorted keys, UTF-8 kept).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any


def norm_text(s: str) -> str:
    """Unicode NFKC, casefold, collapse whitespace: ``norm_text(" Straße\\u00a0X ") -> "strasse x"``."""
    return " ".join(unicodedata.normalize("NFKC", s).casefold().split())


def _same(s: str) -> str:
    return s


def canonical_value(v: Any, text: Callable[[str], str] = _same) -> Any:
    """``v`` with integral floats as ints, tuples as lists, and every string and object key through ``text``.

    ``canonical_value({"n": 2.0, "t": (1, "A")}) -> {"n": 2, "t": [1, "A"]}``; with ``text=norm_text`` the
    ``"A"`` becomes ``"a"``.
    """
    if isinstance(v, str):
        return text(v)
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):      # keys that ``text`` makes equal ("City", "city"): the greatest original key wins,
        #                             whatever the order the object came in
        return {text(str(k)): canonical_value(x, text) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, (list, tuple)):
        return [canonical_value(x, text) for x in v]
    return v


def norm_value(v: Any) -> Any:
    """The dedupe's normalized value: strings as :func:`norm_text`, integral floats as ints, recursively."""
    return canonical_value(v, norm_text)


def canonical_json(obj: Any) -> str:
    """Compact JSON with sorted keys: the one serialization hashed and compared."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def compact_json(value: Any, *, allow_nan: bool = False, default: Callable[[Any], Any] | None = None) -> str:
    """The one compact serialization, of sidecar answers and of JSON-lines rows: ``{"a":[1,"é"]}`` (no spaces,
    keys in their given order).

    Raises ValueError for NaN / Infinity (not JSON), unless ``allow_nan`` writes them as ``NaN`` / ``Infinity``
    (what Python's json reads back). ``default``: :func:`json.dumps`'s, for values JSON has no type for.
    """
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=allow_nan, default=default)


def canonical_calls(calls: list[dict]) -> str:
    """The dedupe's normalized form of a list of calls (names and values through :func:`norm_text`)."""
    return canonical_json([{"name": norm_text(c["name"]), "arguments": norm_value(c["arguments"])} for c in calls])


def call_key(call: Mapping[str, Any]) -> str:
    """The exact canonical key of one call ``{"name": str, "arguments": dict}`` (see the module docstring).

    Raises TypeError naming the field when ``call`` is not of that shape.
    """
    name, args = call.get("name"), call.get("arguments")
    if not isinstance(name, str) or not name:
        raise TypeError(f"call.name must be a non-empty string, got {type(name).__name__}: {str(name)[:80]!r}")
    if not isinstance(args, dict):
        raise TypeError(f"call {name!r}: arguments must be an object, got {type(args).__name__}")
    return canonical_json({"name": name, "arguments": canonical_value(args)})
