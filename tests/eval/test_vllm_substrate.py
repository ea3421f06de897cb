"""What the vLLM substrate reads from a checkpoint without vLLM: the bytes and matmul parameters of a token."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from ooospec.eval.vllm.substrate import bytes_per_token


def test_bytes_per_token_counts_linears_and_head_not_the_embedding(tmp_path):
    save_file({"model.embed_tokens.weight": torch.zeros(100, 8, dtype=torch.bfloat16),     # one row read: skipped
               "model.layers.0.mlp.up_proj.weight": torch.zeros(16, 8, dtype=torch.int8),  # int8 W8A8
               "model.layers.0.mlp.up_proj.weight_scale": torch.zeros(16, 1, dtype=torch.float32),
               "model.layers.0.mlp.down_proj.weight_packed": torch.zeros(8, 2, dtype=torch.int32),  # 8 int4 each
               "lm_head.weight": torch.zeros(100, 8, dtype=torch.bfloat16)}, str(tmp_path / "model.safetensors"))
    got = bytes_per_token(tmp_path)
    assert got["weight_bytes"] == 16 * 8 + 16 * 4 + 8 * 2 * 4 + 100 * 8 * 2
    assert got["matmul_params"] == 16 * 8 + 8 * 2 * 8 + 100 * 8    # scales are not multiplied
