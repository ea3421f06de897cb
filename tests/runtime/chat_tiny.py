"""A tiny target that knows one tool conversation by heart (trained in code, ~3 s on one core; no downloads).

The toy BPE tokenizer with the Qwen2.5-style hermes template (``toy_bpe.HERMES_TEMPLATE``) and a 2-layer Qwen2
of hidden size 64, trained until greedy decoding reproduces both assistant turns of :data:`TURNS`:

    user: What is the weather in Paris?
    assistant -> <tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>
    tool: {"temp_c": 21}
    assistant -> It is 21 C in Paris.

so the agent loop, the sessions and the chat server can be tested on real calls with a real (tiny) model.
"""

from __future__ import annotations

import functools

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.runtime.toy_bpe import HERMES_TEMPLATE, with_template

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
RESULT = '{"temp_c": 21}'
ANSWER = "It is 21 C in Paris."
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
AFTER_TOOL = USER + [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": CALL}]},
                     {"role": "tool", "content": RESULT}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TURNS = [(USER, CALL_TEXT + "<|im_end|>"), (AFTER_TOOL, ANSWER + "<|im_end|>")]
TRAIN_STEPS = 160


@functools.cache
def trained_chat_model() -> tuple[Qwen2ForCausalLM, object]:
    """``(model, tokenizer)``: fp32, sdpa, eval mode; cached for the test session (treat as read-only)."""
    tok = with_template(HERMES_TEMPLATE)
    seqs = []
    for messages, reply in TURNS:
        prompt = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        full = tok(prompt + reply, add_special_tokens=False)["input_ids"]
        assert full[:len(p_ids)] == p_ids, "the reply must tokenize after the prompt's tokens"
        seqs.append((len(p_ids), torch.tensor([full])))
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, head_dim=16, attn_implementation="sdpa",
                      tie_word_embeddings=False, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(TRAIN_STEPS):
        loss = 0.0
        for n_prompt, ids in seqs:
            labels = ids.clone()
            labels[0, :n_prompt] = -100
            loss = loss + model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.generation_config.eos_token_id = None   # the tokenizer's EOS (<|im_end|>) is the one
    model.generation_config.pad_token_id = 0
    for n_prompt, ids in seqs:
        out = model.generate(ids[:, :n_prompt], attention_mask=torch.ones(1, n_prompt, dtype=torch.long),
                             max_new_tokens=ids.shape[1] - n_prompt, do_sample=False)
        assert out[0, n_prompt:].tolist() == ids[0, n_prompt:].tolist(), "the tiny model did not learn its script"
    return model, tok
