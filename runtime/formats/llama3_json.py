"""Llama 3.1/3.2 JSON calls: ``{"name": ..., "parameters": {...}}`` (custom tools, no wrapper tags).

The bare JSON format of :mod:`~ooospec.runtime.formats.plain_json` with ``parameters`` for ``arguments``: the
same empty prefix and suffix, and the same parsing and stop predicate. Llama may put ``<|python_tag|>`` in front
and separate several calls with ``;``; both are tolerated, and an ``arguments`` key is accepted as well as
``parameters``::

    >>> parse_calls('<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}')
    [{'name': 'f', 'arguments': {'x': 1}}, {'name': 'g', 'arguments': {}}]
"""

from __future__ import annotations

from ooospec.runtime.formats import common
from ooospec.runtime.formats.plain_json import call_prefix, call_suffix, is_complete, parse_calls

NAME = "llama3_json"
args_key = "parameters"


render_prompt, render_call = common.renderers(call_prefix, call_suffix, args_key)

__all__ = ["NAME", "args_key", "call_prefix", "call_suffix", "is_complete", "parse_calls", "render_call",
           "render_prompt"]
