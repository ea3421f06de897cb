"""train_sidecar on a tiny in-code Llama + byte tokenizer: LoRA moves, packed labels, checkpoints, resume."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from sidecar_tiny import FIXTURE, byte_tokenizer, save_tiny_base, tiny_llama, tiny_recipe_dict

from ooospec.pipelines import checkpoints as ck
from ooospec.pipelines import sidecar_trainer as st
from ooospec.pipelines import tracking
from ooospec.pipelines import train_sidecar as ts
from ooospec.pipelines.packing import IGNORE, pack_rows
from ooospec.pipelines.recipe import load_recipe, recipe_from_dict
from ooospec.pipelines.slot_rows import read_request_rows

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def rows():
    return read_request_rows(FIXTURE)


def _trainer(tmp_path, rows, **overrides):
    recipe = recipe_from_dict(tiny_recipe_dict(tmp_path / "unused", **overrides))
    seqs, _ = pack_rows(byte_tokenizer(), rows, recipe.max_len)
    return st.build_trainer(tiny_llama(), byte_tokenizer(), seqs, recipe, tmp_path / "ckpt", seed=0)


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
    assert meta["layout_version"] == 2 and meta["base"] == str(base)   # the fixture's rows: no "layout" key = 2
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
    assert ck.prepare_checkpoints(ckpt, "fp-a", resume=True) is None  # no stamp yet: not ours
    (ckpt / "checkpoint-3").mkdir()
    (ckpt / "checkpoint-12").mkdir()
    assert ck.prepare_checkpoints(ckpt, "fp-a", resume=True).name == "checkpoint-12"
    assert ck.prepare_checkpoints(ckpt, "fp-b", resume=True) is None
    assert not list(ckpt.glob("checkpoint-*"))
    (ckpt / "checkpoint-5").mkdir()
    assert ck.prepare_checkpoints(ckpt, "fp-b", resume=False) is None


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
    assert st.resolve_autocast(recipe, 1) == (False, "recipe: autocast none")
    assert st.resolve_autocast(recipe_from_dict(tiny_recipe_dict(tmp_path, autocast="bf16")), 1)[0] is True
    from ooospec.runtime.backends import hardware
    monkeypatch.setattr(hardware, "resolve_dtype", lambda *a, **k: ("fp32", "no native bf16"))
    assert st.resolve_autocast(recipe_from_dict(tiny_recipe_dict(tmp_path, autocast="auto")), 1) == (
        False, "no native bf16")


def test_wandb_is_offline_unless_the_user_chose(monkeypatch, tmp_path):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    tracking.configure_wandb("wandb", tmp_path, "ooo-spec")
    import os
    assert os.environ["WANDB_MODE"] == "offline" and os.environ["WANDB_DIR"] == str(tmp_path)
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    tracking.configure_wandb("wandb", tmp_path, "ooo-spec")
    assert "WANDB_MODE" not in os.environ


def _loss_and_grads(trainer, batch):
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, dict(batch))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


def test_weighted_loss_with_unit_weights_is_the_plain_loss_and_weights_scale_their_slots(tmp_path, rows):
    from ooospec.pipelines.packing import LossWeights, slot_weight

    tok = byte_tokenizer()
    recipe = recipe_from_dict(tiny_recipe_dict(tmp_path / "unused", max_steps=1, init_lora_weights=False))
    plain_seqs, _ = pack_rows(tok, rows[:3], recipe.max_len)
    # unit weights forced through the weighted path (pack_rows drops uniform weights, so add them by hand)
    unit_seqs = [{**s, "label_weights": [0.0 if lab == IGNORE else 1.0 for lab in s["labels"]]} for s in plain_seqs]
    plain = st.build_trainer(tiny_llama(), tok, plain_seqs, recipe, tmp_path / "a", seed=0)
    unit = st.build_trainer(tiny_llama(), tok, unit_seqs, recipe, tmp_path / "b", seed=0)
    assert type(unit).__name__ == "WeightedLossTrainer" and type(plain).__name__ == "Trainer"
    b_plain = plain.data_collator([plain.train_dataset[i] for i in range(3)])
    b_unit = unit.data_collator([unit.train_dataset[i] for i in range(3)])
    n = b_plain["shift_labels"].numel()
    l_plain, g_plain = _loss_and_grads(plain, {**b_plain, "num_items_in_batch": n})
    l_unit, g_unit = _loss_and_grads(unit, {**b_unit, "num_items_in_batch": n})
    assert torch.allclose(l_plain, l_unit, atol=1e-6)
    for name, g in g_plain.items():
        assert torch.allclose(g, g_unit[name], atol=1e-6), name

    # real weights: every label token carries its slot's weight, and the loss is sum(w * CE) / N
    weights = LossWeights(function_index=4.0, null=0.25)
    w_seqs, _ = pack_rows(tok, rows[:3], recipe.max_len, weights)
    for seq, row in zip(w_seqs, rows[:3]):
        got = [w for w, lab in zip(seq["label_weights"], seq["labels"]) if lab != IGNORE]
        want = [slot_weight(s, weights) for s in row["slots"]
                for _ in tok(s["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
        assert got == want, row["id"]
    assert {4.0, 0.25} <= {w for s in w_seqs for w in s["label_weights"]}
    weighted = st.build_trainer(tiny_llama(), tok, w_seqs, recipe, tmp_path / "c", seed=0)
    b_w = weighted.data_collator([weighted.train_dataset[i] for i in range(3)])
    assert torch.equal(b_w["shift_labels"], b_plain["shift_labels"]) and b_w["label_weights"].shape == (n,)
    with torch.no_grad():
        out = weighted.model(**{k: v for k, v in b_w.items() if k not in ("labels", "shift_labels", "label_weights")})
        ce = torch.nn.functional.cross_entropy(out.logits.reshape(n, -1).float(), b_w["shift_labels"], reduction="none")
        got = weighted.compute_loss(weighted.model, {**b_w, "num_items_in_batch": n})
    assert torch.allclose(got, (ce * b_w["label_weights"]).sum() / n, atol=1e-6)
    assert not torch.allclose(got, ce.mean())
    assert weighted.train().training_loss > 0    # and the Trainer's own loop runs it (label_weights reach the loss)


def test_uniform_loss_weights_keep_the_run_fingerprint(tmp_path):
    params = ts.TrainSidecarParams(recipe="<tiny>", max_train_requests=8, seed=3, threads=1, resume=True)
    base = recipe_from_dict(tiny_recipe_dict(tmp_path))
    same = recipe_from_dict(tiny_recipe_dict(tmp_path, loss_weight_function_index=1.0, loss_weight_null=1.0))
    other = recipe_from_dict(tiny_recipe_dict(tmp_path, loss_weight_function_index=4.0))
    assert ts.run_fingerprint(params, base, "x") == ts.run_fingerprint(params, same, "x")
    assert ts.run_fingerprint(params, base, "x") != ts.run_fingerprint(params, other, "x")
    with pytest.raises(ValueError, match="loss_weight_null"):
        recipe_from_dict(tiny_recipe_dict(tmp_path, loss_weight_null=0.0))
