"""Tool-call formats: one module per format, in a plain dict.

Each format module has ``NAME``, ``call_prefix`` / ``call_suffix`` (the fixed text around one call),
``args_key`` (``"arguments"`` or ``"parameters"``) and the functions

* ``render_prompt(tokenizer, messages, tools) -> str``: the prompt through the target's own chat template
  with ``tools=`` and a generation prompt (fallbacks for templates without tool support:
  ``common.render_prompt``);
* ``render_call(call) -> str``: the exact text of one call, prefix and suffix included;
* ``parse_calls(text) -> list[{"name", "arguments"}]``: robust to fences, prose and key variants;
* ``is_complete(text) -> bool``: the end of the (first) call has been reached, the engine's stop predicate.

The model family is picked from the chat template text (``detect_format``), never from a model name.

May import: nothing else in ``runtime`` (formats are the bottom layer).
"""

from __future__ import annotations

from types import ModuleType

from ooospec.runtime.formats import common, hermes, llama3_json, plain_json

FORMATS: dict[str, ModuleType] = {"json": plain_json, "hermes": hermes, "llama3_json": llama3_json}


def get_format(name: str) -> ModuleType:
    if name not in FORMATS:
        raise KeyError(f"unknown tool-call format {name!r} (known: {sorted(FORMATS)})")
    return FORMATS[name]


def detect_format(tokenizer) -> ModuleType:
    """The format the tokenizer's chat template asks for.

    ``<tool_call>`` in the template -> hermes (Qwen2.5, Hermes); Llama 3 headers with ``parameters`` or a
    ``<|python_tag|>`` -> llama3_json; anything else, including no template at all -> json.
    """
    tpl = common.template_text(tokenizer)
    if "<tool_call>" in tpl:
        return hermes
    if "<|python_tag|>" in tpl or ("<|start_header_id|>" in tpl and "parameters" in tpl):
        return llama3_json
    return plain_json


def parse_any(text: str) -> list[dict]:
    """Calls in ``text`` whatever the format: tagged hermes blocks first, else any call-shaped JSON.

    Never raises on model output: prose, unclosed brackets, NaN and nesting deeper than
    ``common.MAX_DEPTH`` parse as no call, in time linear in ``len(text)``.
    """
    return hermes.parse_calls(text)


__all__ = ["FORMATS", "detect_format", "get_format", "parse_any"]
