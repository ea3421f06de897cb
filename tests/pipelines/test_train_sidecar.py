"""train_sidecar on a tiny in-code Llama + byte tokenizer: LoRA moves, packed labels, checkpoints, resume."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from sidecar_tiny import FIXTURE, byte_tokenizer, save_tiny_base, tiny_llama, tiny_recipe_dict

from ooospec.pipelines import train_sidecar as ts
from ooospec.pipelines.packing import IGNORE, pack_rows
from ooospec.pipelines.recipe import load_recipe, recipe_from_dict
from ooospec.pipelines.slot_rows import read_request_rows
from ooospec.runtime import sidecar_prompts as sp

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def rows():
    return read_request_rows(FIXTURE)


def _trainer(tmp_path, rows, **overrides):
    recipe = recipe_from_dict(tiny_recipe_dict(tmp_path / "unused", **overrides))
    seqs, _ = pack_rows(byte_tokenizer(), rows, recipe.max_len)
    return ts.build_trainer(tiny_llama(), byte_tokenizer(), seqs, recipe, tmp_path / "ckpt", seed=0)


def test_lora_moves_trainable_weights_and_nothing_else(tmp_path, rows):
    trainer = _trainer(tmp_path, rows[:4], max_steps=3, save_steps=100)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    trainer.train()
    after = dict(trainer.model.named_parameters())
    for name, old in before.items():
        if name in trainable:
            assert not torch.equal(old, after[name].detach()), f"LoRA weight {name} did not move"
        else:
            assert torch.equal(old, after[name].detach()), f"frozen weight {name} changed"


def test_labels_cover_exactly_the_answers_and_eos(tmp_path, rows):
    trainer = _trainer(tmp_path, rows, max_steps=1)
    tok = byte_tokenizer()
    ds = trainer.train_dataset
    assert len(ds) == len(rows)           # the fixture's requests all fit max_len: one sequence each
    for i, row in enumerate(rows):
        ids, labels = ds[i]["input_ids"], ds[i]["labels"]
        labelled = tok.decode([t for t, lab in zip(ids, labels) if lab != IGNORE])
        assert labelled == "".join(s["answer"] + tok.eos_token for s in row["slots"]), row["id"]
        assert tok.decode(ids[: len(row["block"].encode())]) == row["block"]
    batch = trainer.data_collator([ds[0], ds[4]])
    assert batch["attention_mask"].shape[:2] == (2, 1) and batch["position_ids"].shape == batch["input_ids"].shape
    assert batch["shift_labels"].numel() == sum(sum(x != IGNORE for x in ds[j]["labels"]) for j in (0, 4))


def test_run_writes_adapter_metrics_and_resume_reproduces_the_uninterrupted_run(tmp_path, rows):
    base = save_tiny_base(tmp_path / "base")
    recipe = recipe_from_dict(tiny_recipe_dict(base, max_steps=4, save_steps=2, per_device_train_batch_size=2))
    params = ts.TrainSidecarParams(recipe="<tiny>", max_train_requests=8, seed=3, threads=1, resume=True)
    out, metrics_path = tmp_path / "sidecar", tmp_path / "metrics" / "train_sidecar.json"

    m1 = ts.run(params, FIXTURE, out, metrics_path, recipe=recipe)
    assert json.loads(metrics_path.read_text()) == m1
    assert m1["steps"] == 4 and m1["resumed_from"] is None and m1["steps_this_run"] == 4
    assert m1["train_loss"] > 0
    assert m1["requests"] == {"available": 9, "trained": 8} and m1["sequences"] == 8
    assert sum(m1["slots"]["by_form"].values()) == m1["slots"]["trained"] > 8
    assert [p["step"] for p in m1["loss_curve"]] == [1, 2, 3, 4]
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "sidecar.json"):
        assert (out / "adapter" / name).is_file(), name
    meta = json.loads((out / "adapter" / "sidecar.json").read_text())
    assert meta["layout_version"] == sp.LAYOUT_VERSION and meta["base"] == str(base)
    assert load_recipe(out / "recipe.yaml") == recipe
    assert json.loads((out / "params.json").read_text())["train_sidecar"]["max_train_requests"] == 8
    w_full = load_file(out / "adapter" / "adapter_model.safetensors")

    # simulate a crash after step 2: the step-4 checkpoint never got written
    import shutil
    shutil.rmtree(out / "checkpoints" / "checkpoint-4")
    m2 = ts.run(params, FIXTURE, out, metrics_path, recipe=recipe)
    assert m2["resumed_from"] == "checkpoint-2" and m2["steps"] == 4 and m2["steps_this_run"] == 2
    w_resumed = load_file(out / "adapter" / "adapter_model.safetensors")
    assert w_full.keys() == w_resumed.keys()
    for k in w_full:
        torch.testing.assert_close(w_resumed[k], w_full[k], rtol=1e-5, atol=1e-6, msg=k)

    # rerun after a finished run: resumes from the last checkpoint, trains nothing, reports no loss
    m3 = ts.run(params, FIXTURE, out, metrics_path, recipe=recipe)
    assert m3["resumed_from"] == "checkpoint-4" and m3["steps_this_run"] == 0 and m3["train_loss"] is None
    assert [p["step"] for p in m3["loss_curve"]] == [1, 2, 3, 4]
    w_again = load_file(out / "adapter" / "adapter_model.safetensors")
    assert all(torch.equal(w_again[k], w_resumed[k]) for k in w_full)


def test_checkpoints_of_another_run_are_not_resumed(tmp_path):
    ckpt = tmp_path / "checkpoints"
    (ckpt / "checkpoint-7").mkdir(parents=True)
    assert ts.prepare_checkpoints(ckpt, "fp-a", resume=True) is None  # no stamp yet: not ours
    (ckpt / "checkpoint-3").mkdir()
    (ckpt / "checkpoint-12").mkdir()
    assert ts.prepare_checkpoints(ckpt, "fp-a", resume=True).name == "checkpoint-12"
    assert ts.prepare_checkpoints(ckpt, "fp-b", resume=True) is None
    assert not list(ckpt.glob("checkpoint-*"))
    (ckpt / "checkpoint-5").mkdir()
    assert ts.prepare_checkpoints(ckpt, "fp-b", resume=False) is None


def test_select_requests_is_seeded_order_free_and_prefix_stable(rows):
    a = ts.select_requests(rows, 5, seed=1)
    assert [r["id"] for r in a] == [r["id"] for r in ts.select_requests(rows[::-1], 5, seed=1)]
    assert [r["id"] for r in ts.select_requests(rows, 8, seed=1)][:5] == [r["id"] for r in a]
    assert {r["id"] for r in ts.select_requests(rows, 5, seed=2)} != {r["id"] for r in a}
    assert len(ts.select_requests(rows, 0, seed=1)) == len(rows)
    with pytest.raises(ValueError, match="max_train_requests"):
        ts.select_requests(rows, -1, seed=0)


def test_autocast_follows_the_recipe_and_the_hardware(monkeypatch, tmp_path):
    recipe = recipe_from_dict(tiny_recipe_dict(tmp_path, autocast="none"))
    assert ts.resolve_autocast(recipe, 1) == (False, "recipe: autocast none")
    assert ts.resolve_autocast(recipe_from_dict(tiny_recipe_dict(tmp_path, autocast="bf16")), 1)[0] is True
    from ooospec.runtime import hardware
    monkeypatch.setattr(hardware, "resolve_dtype", lambda *a, **k: ("fp32", "no native bf16"))
    assert ts.resolve_autocast(recipe_from_dict(tiny_recipe_dict(tmp_path, autocast="auto")), 1) == (
        False, "no native bf16")


def test_wandb_is_offline_unless_the_user_chose(monkeypatch, tmp_path):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    ts.configure_wandb("wandb", tmp_path, "ooo-spec")
    import os
    assert os.environ["WANDB_MODE"] == "offline" and os.environ["WANDB_DIR"] == str(tmp_path)
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    ts.configure_wandb("wandb", tmp_path, "ooo-spec")
    assert "WANDB_MODE" not in os.environ
