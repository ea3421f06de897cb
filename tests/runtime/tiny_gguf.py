"""Tiny random GGUF models built in code (no download), for the llama.cpp backend's tests.

``make_tiny_gguf(path)`` writes a 2-layer Llama-architecture GGUF with a SentencePiece-style vocabulary of
``vocab`` tokens (``<unk>``, ``<s>``, ``</s>``, the 256 byte tokens, then plain pieces) and random float32
weights. ``head_scale`` multiplies the output head: a large one spreads the logits, so the top-2 margins are far
above llama.cpp's batch-shape rounding and greedy decoding is exactly reproducible; a small one makes near-ties
common (to test that they are handled, not that they vanish). ``chat_template`` (e.g. the hermes template of
:mod:`tests.runtime.toy_bpe`) goes into ``tokenizer.chat_template``, where a registry GGUF keeps its own.
``plain_output`` zeroes the output rows of ``<unk>``, ``<s>`` and the byte tokens, so greedy decoding writes plain
pieces and EOS: valid text, streamable piece by piece. ``quantize(src, dst, "Q8_0")`` requantizes with llama.cpp's
own ``llama_model_quantize``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15}   # llama_ftype values


def make_tiny_gguf(path: str | Path, *, vocab: int = 320, hidden: int = 64, layers: int = 2, heads: int = 4,
                   kv_heads: int = 2, ffn: int = 128, context: int = 2048, seed: int = 0,
                   head_scale: float = 4.0, chat_template: str | None = None, plain_output: bool = False) -> Path:
    import gguf

    if vocab < 259 + 1:
        raise ValueError("vocab must hold <unk>, <s>, </s>, the 256 byte tokens and at least one piece")
    rng = np.random.default_rng(seed)
    path = Path(path)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hidden // heads)
    w.add_file_type(0)   # all F32

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(vocab - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (vocab - 259)   # UNKNOWN, CONTROL, BYTE, NORMAL
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(vocab - 259)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def mat(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    head_dim = hidden // heads
    w.add_tensor("token_embd.weight", (rng.standard_normal((vocab, hidden))).astype(np.float32))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(hidden, heads * head_dim))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(hidden, ffn))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    head = mat(vocab, hidden, head_scale)
    head[[0, 1, *range(3, 259)] if plain_output else []] = 0.0     # <unk>, <s>, bytes: 0, below the best piece
    w.add_tensor("output.weight", head)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def quantize(src: str | Path, dst: str | Path, ftype: str) -> Path:
    """``src`` requantized to ``ftype`` (a key of :data:`FTYPES`) by llama.cpp's ``llama_model_quantize``."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {ftype}) failed with {rc}")
    return Path(dst)
