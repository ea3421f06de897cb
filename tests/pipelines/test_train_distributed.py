"""train_sidecar on 2 CPU processes (accelerate launch + recipes/accelerate_cpu.yaml, gloo) against 1 process.

The same 8 requests, the same global batch (2 x 1 per process vs 1 x 2), the same seed: the adapters agree within
float32 reduction noise, the reported loss is the mean over both processes (not one process's half), and a 2-process
run resumed from its middle checkpoint ends where the uninterrupted one did.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from sidecar_tiny import FIXTURE, save_tiny_base, tiny_recipe_dict

from ooospec.pipelines import checkpoints as ck
from ooospec.pipelines import train_sidecar as ts
from ooospec.pipelines.recipe import recipe_from_dict

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE_CPU = ROOT / "recipes" / "accelerate_cpu.yaml"
# float32 on both sides; the 1-process batch pads its two sequences to one length and sums in another order. On an
# AMD EPYC (Zen 5) the adapters differed by at most 7.5e-8 and the losses by under 1e-9 (relative), while 4 steps of
# training moved the weights by 2e-2: the bounds leave ~100x room for other CPUs' kernels and stay far below training
RTOL, ATOL = 1e-4, 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_two(tmp_path: Path, recipe_file: Path, params_file: Path, out: Path, metrics: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CPU),
           "--num_processes", "2", "--main_process_port", str(_free_port()),
           "-m", "ooospec.pipelines.train_sidecar", str(FIXTURE), str(out), str(metrics),
           "--params", str(params_file), "--recipe", str(recipe_file)]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def _adapter(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "adapter" / "adapter_model.safetensors")


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun + gloo on Linux")
def test_two_cpu_processes_train_the_one_process_adapter_and_resume(tmp_path):
    base = save_tiny_base(tmp_path / "base")
    # weighted slots: the WeightedLossTrainer path, whose loss must be scaled back by the process count
    common = {"max_steps": -1, "save_steps": 2, "loss_weight_function_index": 2.0, "loss_weight_null": 0.5}
    one = recipe_from_dict(tiny_recipe_dict(base, per_device_train_batch_size=2, **common))
    two_file = tmp_path / "two.yaml"
    two_file.write_text(yaml.safe_dump(tiny_recipe_dict(base, per_device_train_batch_size=1, **common)))
    params = ts.TrainSidecarParams(recipe="<tiny>", max_train_requests=8, seed=3, threads=1, resume=True)
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump({"train_sidecar": {"max_train_requests": 8, "seed": 3, "threads": 1,
                                                             "resume": True}}))

    m1 = ts.run(params, FIXTURE, tmp_path / "one", tmp_path / "one.json", recipe=one)
    out2, metrics2 = tmp_path / "two", tmp_path / "two.json"
    _launch_two(tmp_path, two_file, params_file, out2, metrics2)
    m2 = json.loads(metrics2.read_text())

    assert m1["processes"] == 1 and m2["processes"] == 2
    assert m1["sequences"] == m2["sequences"] == 8 and m2["sequences_cut_for_processes"] == 0
    assert m1["steps"] == m2["steps"] == 4            # 8 sequences, global batch 2: each process 4 distinct ones
    assert m2["train_loss"] == pytest.approx(m1["train_loss"], rel=RTOL)
    assert [p["loss"] for p in m2["loss_curve"]] == pytest.approx([p["loss"] for p in m1["loss_curve"]], rel=RTOL)
    w1, w2 = _adapter(tmp_path / "one"), _adapter(out2)
    assert w1.keys() == w2.keys()
    moved = max((w1[k] - load_file(out2 / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors")[k])
                .abs().max().item() for k in w1)
    assert moved > 100 * ATOL                          # the tolerance is far below what training changes
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=RTOL, atol=ATOL, msg=k)
    # rank 0 wrote one set of outputs: one checkpoint folder per save, one adapter, no half-written leftovers
    assert sorted(p.name for p in (out2 / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert not list(out2.glob("*.partial"))

    # a crash after step 2 on 2 processes: both resume from checkpoint-2 and end on the uninterrupted adapter
    shutil.rmtree(out2 / "checkpoints" / "checkpoint-4")
    _launch_two(tmp_path, two_file, params_file, out2, metrics2)
    m3 = json.loads(metrics2.read_text())
    assert m3["resumed_from"] == "checkpoint-2" and m3["steps"] == 4 and m3["steps_this_run"] == 2
    w3 = _adapter(out2)
    for k in w2:
        torch.testing.assert_close(w3[k], w2[k], rtol=1e-5, atol=1e-6, msg=k)


def test_shards_are_whole_distinct_batches():
    seqs = list(range(9))
    assert ck.shardable_sequences(seqs, 1, 4) == (seqs, 0)
    assert ck.shardable_sequences(seqs, 2, 2) == (list(range(8)), 1)
    assert ck.shardable_sequences(seqs, 2, 1) == (list(range(8)), 1)
    with pytest.raises(ValueError, match="cannot give each of 4 processes"):
        ck.shardable_sequences(seqs, 4, 4)


def test_processes_from_the_launchers_env():
    assert ck.Processes.from_env({}) == ck.Processes(0, 1, 1)
    p = ck.Processes.from_env({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
    assert (p.rank, p.world_size, p.local_world_size, p.is_main) == (1, 4, 2, False)
