"""Tiny in-code models and tokenizers for the sidecar stage tests (no downloads).

A byte-level toy tokenizer (ids 0..255 = bytes, 256.. = specials) and a 2-layer Llama of hidden size 16.
``save_tiny_base(dir)`` writes both as a HF folder, which ``load_target`` (and so a recipe's ``base``) accepts.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>"]
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "slots_small.jsonl"


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges: every UTF-8 byte is one token; ``</s>`` (id 258) is EOS."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for i, s in enumerate(SPECIALS):
        vocab[s] = 256 + i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.add_special_tokens({"additional_special_tokens": []})
    return fast


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      pad_token_id=256, bos_token_id=257, eos_token_id=258, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def save_tiny_base(path: Path, seed: int = 0) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tiny_llama(seed).save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path


def tiny_recipe_dict(base: Path, **overrides) -> dict:
    """A recipe for the tiny base: fast, no tracking, LoRA on every projection, non-identity init."""
    d = {"base": str(base), "base_model_id": "tiny/llama-test", "dtype": "fp32", "lora_r": 4, "lora_alpha": 8,
         "lora_dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
         "init_lora_weights": False, "learning_rate": 1e-2, "lr_scheduler_type": "constant", "warmup_ratio": 0.0,
         "per_device_train_batch_size": 4, "max_len": 4096, "autocast": "none", "logging_steps": 1, "save_steps": 2,
         "save_total_limit": 5, "report_to": "none"}
    d.update(overrides)
    return d
