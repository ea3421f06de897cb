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
    in_fp32 = bytes_per_token(tmp_path, float_bytes=4)       # vLLM casts the float tensors to float32: 4 bytes each
    assert in_fp32["weight_bytes"] == 16 * 8 + 16 * 4 + 8 * 2 * 4 + 100 * 8 * 4
    assert in_fp32["matmul_params"] == got["matmul_params"]


def test_a_format_whose_worker_fails_becomes_an_error_row(monkeypatch, capsys):
    import argparse
    import subprocess

    from ooospec.eval.vllm import substrate

    def fake_run(cmd, check, stdout, stderr):
        stdout.write("".join(f"log line {i}\n" for i in range(20)) + "ValueError: no CPU kernel for WNA16\n")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(subprocess, "run", fake_run)
    args = argparse.Namespace(target="m", threads=2, repeats=3, cache=None)
    row = substrate._in_worker(args, "w4a16-rtn")
    assert row["format"] == "w4a16-rtn" and row["error"].startswith("exit 1: log line 9\n")
    assert row["error"].endswith("ValueError: no CPU kernel for WNA16")
    assert len(row["error"].splitlines()) == substrate.ERROR_LINES and "w4a16-rtn" in capsys.readouterr().err
    assert row["cause"] == "ValueError: no CPU kernel for WNA16"


def test_the_cause_is_the_exception_not_torch_compiles_advice():
    from ooospec.eval.vllm.substrate import cause

    log = ["[rank0]:   File \"cpu.py\", line 198, in apply_weights",
           "[rank0]: AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'",
           "[rank0]: Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace"]
    assert cause(log) == "AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'"
    assert cause(["all fine", "exit"]) is None
