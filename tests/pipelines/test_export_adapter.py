"""export_adapter: the Hub folder reloads with PeftModel.from_pretrained and gives the trained model's logits."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from sidecar_tiny import FIXTURE, byte_tokenizer, save_tiny_base, tiny_llama, tiny_recipe_dict

from ooospec.pipelines import export_adapter as ex
from ooospec.pipelines import sidecar_trainer as st
from ooospec.pipelines import train_sidecar as ts
from ooospec.pipelines.packing import pack_rows
from ooospec.pipelines.params import as_dict
from ooospec.pipelines.recipe import recipe_from_dict, recipe_to_yaml
from ooospec.pipelines.slot_rows import read_request_rows

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny sidecar trained 3 steps, saved the way train_sidecar.run saves it; plus its logits on a probe."""
    tmp = tmp_path_factory.mktemp("export")
    base = save_tiny_base(tmp / "base")
    recipe = recipe_from_dict(tiny_recipe_dict(base, max_steps=3, save_steps=100))
    rows = read_request_rows(FIXTURE)
    seqs, _ = pack_rows(byte_tokenizer(), rows[:4], recipe.max_len)
    trainer = st.build_trainer(tiny_llama(), byte_tokenizer(), seqs, recipe, tmp / "ckpt", seed=0)
    trainer.train()
    model_dir = tmp / "sidecar"
    ts.save_adapter(trainer, byte_tokenizer(), model_dir / "adapter", {"layout_version": 2, "base": str(base)})
    (model_dir / "recipe.yaml").write_text(recipe_to_yaml(recipe))
    (model_dir / "params.json").write_text(json.dumps({"train_sidecar": as_dict(ts.TrainSidecarParams())}))
    metrics = tmp / "metrics"
    metrics.mkdir()
    (metrics / "train_sidecar.json").write_text(json.dumps(
        {"requests": {"trained": 4, "available": 9}, "slots": {"trained": 30, "dropped_too_long": 0,
         "by_form": {"argument": 22}}, "sequences": 4, "tokens": 4000, "label_tokens": 300, "layout_version": 2,
         "steps": 3, "final_loss": 4.2, "train_seconds": 1.5, "device": "cpu", "threads": 1}))
    (metrics / "eval_sidecar.json").write_text(json.dumps(
        {"requests": 3, "requests_available": 9, "dtype": "fp32", "function_index": {"accuracy": 0.5},
         "argument": {"exact_match": 0.25, "exact_match_non_null": 0.125}, "direct_call": {"exact_match": 0.0},
         "joined": {"exact_match": 0.2}, "null": {"precision": 0.75, "recall": 1.0},
         "latency": {"threads": 1, "wave": {"median_ms": 12.5, "p90_ms": 20.0}, "median_queries": 4},
         "baselines": {"function_index_always_0": 0.625, "argument_always_null": 0.5},
         "anchor": {"function_index_accuracy": 0.963, "argument_exact_match": 0.861}}))
    probe = torch.tensor([list((rows[1]["block"] + rows[1]["slots"][0]["query"]).encode())[:64]])
    model = trainer.model.to("cpu").eval()  # the trainer may have moved it to a GPU; compare on CPU
    with torch.no_grad():
        logits = model(input_ids=probe).logits
    out = ex.run(ex.ExportAdapterParams(weights_dtype="fp32"), model_dir, tmp / "export" / "sidecar-adapter", metrics)
    half = ex.run(ex.ExportAdapterParams(), model_dir, tmp / "export" / "bf16", metrics)
    return {"out": out, "half": half, "base": base, "probe": probe, "logits": logits, "recipe": recipe,
            "model_dir": model_dir, "metrics": metrics}


def test_export_reloads_and_reproduces_the_trained_logits(trained):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(trained["base"])
    model = PeftModel.from_pretrained(base, trained["out"]).eval()
    with torch.no_grad():
        logits = model(input_ids=trained["probe"]).logits
    assert torch.equal(logits, trained["logits"])
    # and the adapter is not the identity: the bare base gives different logits
    with torch.no_grad():
        bare = AutoModelForCausalLM.from_pretrained(trained["base"])(input_ids=trained["probe"]).logits
    assert not torch.allclose(bare, logits)
    assert AutoTokenizer.from_pretrained(trained["out"]).eos_token == "</s>"


def test_bf16_export_is_half_the_size_and_close(trained):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    weights = load_file(trained["half"] / "adapter_model.safetensors")
    assert weights and all(t.dtype == torch.bfloat16 for t in weights.values())
    full = (trained["out"] / "adapter_model.safetensors").stat().st_size
    assert (trained["half"] / "adapter_model.safetensors").stat().st_size < full   # tiny: the header weighs a lot
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(trained["base"]), trained["half"]).eval()
    with torch.no_grad():
        logits = model(input_ids=trained["probe"]).logits
    torch.testing.assert_close(logits, trained["logits"], rtol=0.05, atol=0.05)


def test_folder_is_a_hub_model_repo(trained):
    out = trained["out"]
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "README.md",
                 "recipe.yaml", "params.json", "sidecar.json"):
        assert (out / name).is_file(), name
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == "tiny/llama-test" and cfg["r"] == 4
    assert recipe_from_dict(yaml.safe_load((out / "recipe.yaml").read_text())) == trained["recipe"]
    assert json.loads((out / "sidecar.json").read_text())["layout_version"] == 2
    params = json.loads((out / "params.json").read_text())
    assert set(params) == {"train_sidecar", "export_adapter"}


def test_model_card_front_matter_and_sections(trained):
    text = (trained["out"] / "README.md").read_text()
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["base_model"] == "tiny/llama-test" and front["library_name"] == "peft"
    assert front["license"] == "apache-2.0" and "lora" in front["tags"]
    for needle in ("PeftModel.from_pretrained", "CC-BY-4.0", "xLAM", "Apache-2.0", "| requests trained | 4 |",
                   "| function-index accuracy | 50.0% | 62.5% (always 0) | 96.3% |",
                   "| argument exact match | 25.0% | 50.0% (always null) | 86.1% |",
                   "| joined call exact match (the hint) | 20.0% |", "Sidecar.from_adapter",
                   "1 thread(s), fp32) | 12.5 / 20.0 ms (4 queries per wave)", "lora_r: 4", "prompt layout\n2"):
        assert needle in text, needle
    assert "## Why this adapter" not in text          # no --card-notes: no such section


def test_card_notes_become_the_why_section(trained, tmp_path):
    notes = tmp_path / "why.md"
    notes.write_text("Shipped over the teacher-trained adapter: more hint tokens accepted.\n")
    out = ex.run(ex.ExportAdapterParams(weights_dtype="fp32"), trained["model_dir"], tmp_path / "hub",
                 trained["metrics"], card_notes=notes)
    text = (out / "README.md").read_text()
    why = text.index("## Why this adapter\n\nShipped over the teacher-trained adapter")
    assert text.index("semantic sidecar") < why < text.index("## Base model")


def test_push_without_token_keeps_folder_and_says_so(trained, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert ex.push(trained["out"], "someone/sidecar") == ex.EXIT_NO_TOKEN
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HF_TOKEN is not set" in err
    assert (trained["out"] / "adapter_model.safetensors").is_file()


def test_push_failure_is_one_line_and_never_shows_the_token(trained, monkeypatch, capsys):
    import huggingface_hub

    secret = "hf_" + "s3cr3t" * 6

    class Boom:
        def __init__(self, token):
            assert token == secret

        def create_repo(self, *a, **k):
            raise ConnectionError(f"cannot reach the hub with token {secret}\nmore lines")

    monkeypatch.setattr(huggingface_hub, "HfApi", Boom)
    monkeypatch.setenv("HF_TOKEN", secret)
    assert ex.push(trained["out"], "someone/sidecar") == ex.EXIT_PUSH_FAILED
    out = capsys.readouterr()
    assert secret not in out.err + out.out
    assert out.err.count("\n") == 1 and "ConnectionError" in out.err and "kept at" in out.err


def test_missing_adapter_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the train_sidecar stage first"):
        ex.run(ex.ExportAdapterParams(), tmp_path / "nothing", tmp_path / "out")


def test_card_says_when_the_train_time_covers_only_the_steps_after_a_resume():
    assert ex._train_time({"train_seconds": 6985.2, "steps": 400, "steps_this_run": 400}) == 6985.2
    resumed = ex._train_time({"train_seconds": 4817.98, "steps": 400, "steps_this_run": 225,
                              "resumed_from": "checkpoint-175"})
    assert resumed == "4818 (the last 225 of 400 steps; the run resumed from checkpoint-175)"


def test_metrics_files_replace_the_metrics_dirs_by_stage(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "ingest.json").write_text('{"total": 1}')
    (tmp_path / "m" / "eval_sidecar.json").write_text('{"requests": 24}')
    (tmp_path / "heldout.json").write_text('{"requests": 344}')
    got = ex.read_metrics(tmp_path / "m", {"eval_sidecar": tmp_path / "heldout.json"})
    assert got == {"ingest": {"total": 1}, "eval_sidecar": {"requests": 344}}
    with pytest.raises(FileNotFoundError, match="nope.json"):
        ex.read_metrics(tmp_path / "m", {"train_sidecar": tmp_path / "nope.json"})
    with pytest.raises(ValueError, match="unknown stage"):
        ex.read_metrics(tmp_path / "m", {"eval": tmp_path / "heldout.json"})
