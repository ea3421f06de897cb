"""A tiny byte-level BPE tokenizer built in code (no downloads) plus chat templates of each tool-call family.

``toy_bpe()`` trains ~400 merges on a few JSON tool calls, so merges cross the boundaries the schema FSM
drafts at (``name``, ``":``, `` "``), like the real Qwen/SmolLM2 BPE vocabularies do.
"""

from __future__ import annotations

import functools
import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

_CALLS = [
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
    {"name": "get_time", "arguments": {"timezone": "Europe/Berlin"}},
    {"name": "set_alarm", "arguments": {"time": "07:30", "repeat": True, "days": 3}},
    {"name": "QueryStock", "arguments": {"symbol": "AMZN", "date": "2022-03-11"}},
]
CORPUS = (
    [json.dumps(c) for c in _CALLS]
    + [json.dumps(c, indent=2) for c in _CALLS]
    + [json.dumps({"name": c["name"], "parameters": c["arguments"]}) for c in _CALLS]
    + ["<tool_call>\n" + json.dumps(c) + "\n</tool_call>" for c in _CALLS]
    + ["What is the weather in Paris today? Please set an alarm for tomorrow morning."]
)
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


@functools.cache
def toy_bpe(vocab_size: int = 420) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 pre-tokenizer) with ChatML / Llama-3 specials and ``<tool_call>`` added tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    fast.add_tokens(["<tool_call>", "</tool_call>"])
    return fast


def with_template(template: str | None) -> PreTrainedTokenizerFast:
    """A copy of the toy tokenizer carrying ``template`` as its chat template."""
    tok = toy_bpe()
    out = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token="<|im_end|>")
    out.add_tokens(["<tool_call>", "</tool_call>"])
    out.chat_template = template
    return out


# Qwen2.5-style: tools listed in the system turn, calls as <tool_call> blocks.
HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}
# Tools
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>
For each function call, return <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{%- for tc in message.tool_calls %}{% set tc = tc.function if tc.function is defined else tc %}
<tool_call>
{"name": "{{ tc.name }}", "arguments": {{ tc.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif not (message.role == 'system' and tools) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Llama-3.1-style: JSON tool definitions in the user turn, calls as {"name", "parameters"}.
LLAMA3_TEMPLATE = """\
{%- for message in messages %}<|start_header_id|>{{ 'ipython' if message.role == 'tool' else message.role }}\
<|end_header_id|>

{% if loop.first and tools %}Given the following functions, respond with a JSON for a function call \
with its proper arguments. Respond in the format {"name": function name, "parameters": dictionary of argument \
name and its value}.
{% for t in tools %}{{ t | tojson }}
{% endfor %}{% endif %}
{%- if message.tool_calls %}{% for tc in message.tool_calls %}{% set tc = tc.function %}\
{"name": "{{ tc.name }}", "parameters": {{ tc.arguments | tojson }}}{% endfor %}\
{%- else %}{{ message.content }}{% endif %}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# SmolLM2-style ChatML without any tool support.
CHATML_TEMPLATE = """\
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
