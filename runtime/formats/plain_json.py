"""Bare JSON calls: ``{"name": ..., "arguments": {...}}``, optionally inside a ```json fence.

What Qwen2.5-Coder emits even though its template asks for ``<tool_call>`` tags, and what the fallback
prompt asks template-less models (SmolLM2, Gemma 3 base) for. Several calls may come as a JSON list.
"""

from __future__ import annotations

from ooospec.runtime.formats import common

NAME = "json"
call_prefix = ""
call_suffix = ""
args_key = "arguments"


render_prompt, render_call = common.renderers(call_prefix, call_suffix, args_key)


def parse_calls(text: str) -> list[dict]:
    """Every call-shaped JSON object in ``text`` (fences, prose and list wrappers are skipped)."""
    return common.calls_in(text)


def is_complete(text: str) -> bool:
    """True once the first JSON object/array of the text has closed.

    >>> is_complete('```json\\n{"name": "f", "arguments": {"a": "}"}')
    False
    >>> is_complete('```json\\n{"name": "f", "arguments": {"a": "}"}}')
    True
    """
    return common.json_end(text) is not None
