"""Every recipe under recipes/ loads, validates, and says how to launch it; bad recipes fail loudly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ooospec.pipelines.recipe import Recipe, load_recipe, recipe_from_dict
from ooospec.pipelines.train_sidecar import TrainSidecarParams

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
LAUNCHERS = sorted(RECIPES.glob("accelerate_*.yaml"))     # accelerate configs, not training recipes
TRAINING = sorted(p for p in RECIPES.glob("*.yaml") if p not in LAUNCHERS)


@pytest.mark.parametrize("path", LAUNCHERS, ids=lambda p: p.name)
def test_accelerate_configs_launch_several_local_processes(path):
    cfg = yaml.safe_load(path.read_text())
    # accelerate starts N local processes only for its multi-device types (MULTI_CPU needs mpirun)
    assert cfg["distributed_type"] in ("MULTI_GPU", "DEEPSPEED") and cfg["num_processes"] >= 2
    assert "accelerate launch --config_file " + f"recipes/{path.name}" in path.read_text()


def test_there_are_recipes():
    names = {p.name for p in TRAINING}
    assert {"cpu_default.yaml", "gpu_qwen3_0.6b.yaml"} <= names


@pytest.mark.parametrize("path", TRAINING, ids=lambda p: p.name)
def test_recipe_loads_validates_and_shows_its_launch_command(path):
    recipe = load_recipe(path)
    assert isinstance(recipe, Recipe)
    first = path.read_text().splitlines()[0]
    assert first.startswith("#")
    assert "ooospec.pipelines.train_sidecar" in path.read_text().split("\nbase:")[0]
    # the paper: one epoch, then frozen; a recipe that continues a trained adapter on a small log of your own calls
    # passes over it twice (mixed with the built-in data: once)
    assert recipe.num_train_epochs == (2.0 if recipe.init_adapter and "_mix" not in path.name else 1.0)
    assert recipe.report_to == "wandb"


def test_default_params_point_at_the_cpu_recipe():
    assert (RECIPES.parent / TrainSidecarParams().recipe).resolve() == RECIPES / "cpu_default.yaml"


def test_paper_recipe_matches_the_paper():
    r = load_recipe(RECIPES / "gpu_qwen3_0.6b.yaml")
    assert (r.base, r.lora_r, r.lora_alpha) == ("Qwen/Qwen3-0.6B", 32, 64)


def test_accelerate_config_uses_the_zero2_json():
    text = (RECIPES / "accelerate_multi_gpu.yaml").read_text()
    assert "accelerate launch --config_file recipes/accelerate_multi_gpu.yaml" in text
    assert "-m ooospec.pipelines.train_sidecar" in text
    cfg = yaml.safe_load(text)
    ds_path = RECIPES.parent / cfg["deepspeed_config"]["deepspeed_config_file"]
    assert cfg["distributed_type"] == "DEEPSPEED" and ds_path.is_file()
    assert json.loads(ds_path.read_text())["zero_optimization"]["stage"] == 2


@pytest.mark.parametrize("bad, match", [
    ({"base": "x", "lora_rank": 8}, r"unknown recipe key\(s\) \['lora_rank'\]"),
    ({"lora_r": 8}, "needs a 'base'"),
    ({"base": "x", "dtype": "fp16"}, "dtype must be one of"),
    ({"base": "x", "lora_r": 0}, "lora_r must be > 0"),
    ({"base": "x", "lora_r": "8"}, "lora_r must be an integer"),
    ({"base": "x", "autocast": "yes"}, "autocast must be one of"),
    ({"base": "x", "autocast": False}, "autocast must be a string"),
    ({"base": "x", "init_lora_weights": 1}, "init_lora_weights must be true/false"),
    ({"base": "x", "target_modules": ["q_proj", "lm_head"]}, "exclude lm_head"),
    ({"base": "x", "report_to": "mlflow"}, "report_to must be one of"),
])
def test_bad_recipes_are_rejected_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        recipe_from_dict(bad, "bad.yaml")


def test_unknown_key_in_a_file_names_the_file(tmp_path):
    p = tmp_path / "typo.yaml"
    p.write_text("base: smollm2-135m\nlearnig_rate: 1e-4\n")
    with pytest.raises(ValueError, match=r"typo.yaml: unknown recipe key\(s\) \['learnig_rate'\]"):
        load_recipe(p)
    with pytest.raises(FileNotFoundError, match="recipes there"):
        load_recipe(tmp_path / "nope.yaml")


def test_the_full_params_set_is_the_shipped_adapters_recipe():
    """pipelines/sidecar_full.yaml reproduces adapters/sidecar: same base, same LoRA rank, every request."""
    from ooospec.pipelines.params import load_section

    root = RECIPES.parent
    full = load_section(TrainSidecarParams, "train_sidecar", root / "pipelines" / "sidecar_full.yaml")
    recipe = load_recipe(root / full.recipe)
    shipped = json.loads((root / "adapters" / "sidecar" / "sidecar.json").read_text())
    assert full.max_train_requests == 0
    assert (recipe.base, recipe.lora_r) == (shipped["base"], shipped["lora_r"])
    assert yaml.safe_load((root / "adapters" / "sidecar" / "recipe.yaml").read_text())["base"] == recipe.base
    # pipelines/full/dvc.yaml names the untrained floor and the run labels after `full.base`
    assert yaml.safe_load((root / "pipelines" / "sidecar_full.yaml").read_text())["full"]["base"] == recipe.base


@pytest.mark.parametrize("name", ["cpu_qwen2.5-coder-0.5b_continue.yaml", "cpu_qwen2.5-coder-0.5b_mix.yaml"])
def test_the_continue_recipes_fit_the_shipped_adapter(name):
    """The 0.5B continue and mix recipes continue adapters/sidecar: same base, same rank, layout 3."""
    from ooospec.pipelines.sidecar_trainer import check_init_adapter

    r = load_recipe(RECIPES / name)
    assert r.init_adapter == "adapters/sidecar"
    assert len(check_init_adapter(r, layout=3)) == 64
    with pytest.raises(ValueError, match="the rows are layout 2"):
        check_init_adapter(r, layout=2)
