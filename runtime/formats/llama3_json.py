"""Llama 3.1/3.2 JSON calls: ``{"name": ..., "parameters": {...}}`` (custom tools, no wrapper tags).

Llama may put ``<|python_tag|>`` in front and separate several calls with ``;``; both are tolerated, and an
``arguments`` key is accepted as well as ``parameters``.
"""

from __future__ import annotations

from ooospec.runtime.formats import common

NAME = "llama3_json"
call_prefix = ""
call_suffix = ""
args_key = "parameters"


render_prompt, render_call = common.renderers(call_prefix, call_suffix, args_key)


def parse_calls(text: str) -> list[dict]:
    """Every call-shaped JSON object (``parameters`` or ``arguments``), ignoring tags and ``;`` separators.

    >>> parse_calls('<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}')
    [{'name': 'f', 'arguments': {'x': 1}}, {'name': 'g', 'arguments': {}}]
    """
    return common.calls_in(text)


def is_complete(text: str) -> bool:
    """True once the first JSON object has closed."""
    return common.json_end(text) is not None
