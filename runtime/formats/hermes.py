"""Hermes / Qwen2.5 calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

Parsing also accepts the untagged JSON that Qwen2.5-Coder actually emits under this template.
"""

from __future__ import annotations

import re

from ooospec.runtime.formats import common

NAME = "hermes"
call_prefix = "<tool_call>\n"
call_suffix = "\n</tool_call>"
args_key = "arguments"

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


render_prompt, render_call = common.renderers(call_prefix, call_suffix, args_key)


def parse_calls(text: str) -> list[dict]:
    """Calls inside ``<tool_call>`` blocks (a last unclosed block counts); untagged JSON when no tag exists.

    >>> parse_calls('<tool_call>\\n{"name": "f", "arguments": {}}\\n</tool_call>')
    [{'name': 'f', 'arguments': {}}]
    """
    if _OPEN not in text:
        return common.calls_in(text)
    return [call for block in _TAGGED.findall(text) for call in common.calls_in(block)]


def is_complete(text: str) -> bool:
    """``</tool_call>`` after ``<tool_call>``; for untagged output, the first JSON object has closed."""
    start = text.find(_OPEN)
    if start >= 0:
        return _CLOSE in text[start:]
    stripped = text.lstrip()
    if not stripped or _OPEN.startswith(stripped[: len(_OPEN)]):
        return False  # nothing yet, or a tag being typed
    return common.json_end(text) is not None
