"""DVC stage ``train_sidecar``: LoRA-train the OoO-Spec semantic sidecar on slot rows, one epoch, then freeze.

The sidecar is a small causal LM plus a LoRA adapter. It learns three kinds of prompt -> completion pairs that
``expand_slots`` cut from normalized teacher calls (OoO-Spec, arXiv 2608.00814, "slot supervision")::

    {"form": "function_index", "completion": "2"}                  # which tool (index into the tool list) or null
    {"form": "argument",       "completion": "\\"Paris\\""}         # one argument's compact-JSON value, or null
    {"form": "direct_call",    "completion": "{\\"arguments\\":{..},\\"name\\":\\"f\\"}"}   # the whole call

Training is trl's ``SFTTrainer`` on a prompt-completion dataset with ``completion_only_loss=True``: the loss
covers the completion tokens plus the EOS that trl appends, never the prompt (the paper's "one epoch of causal
cross-entropy", then the adapter is frozen and used unchanged across targets).

Everything about *how* to train lives in a recipe (``recipes/*.yaml`` -> :class:`Recipe`); params.yaml's
``train_sidecar`` section (:class:`TrainSidecarParams`) only picks the recipe and bounds the CPU run::

    python -m ooospec.pipelines.train_sidecar data/slots/train.jsonl models/sidecar metrics/train_sidecar.json
    accelerate launch --config_file recipes/accelerate_multi_gpu.yaml -m ooospec.pipelines.train_sidecar \\
        data/slots/train.jsonl models/sidecar metrics/train_sidecar.json --recipe recipes/gpu_qwen3_0.6b.yaml

Outputs (``out_dir`` = models/sidecar)::

    adapter/        peft save_pretrained (adapter_model.safetensors, adapter_config.json) + tokenizer
    checkpoints/    Trainer checkpoints every ``save_steps`` (resumed from when ``resume`` and the run matches)
    recipe.yaml     the resolved recipe;  params.json  the params section;  both travel with the export
    wandb/          offline W&B run (when the recipe reports to wandb and no WANDB_DIR is set)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import time
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ooospec.pipelines.params import as_dict, load_section
from ooospec.pipelines.records import atomic_write_text, canonical_json, read_jsonl, sha256_file, write_json

logger = logging.getLogger(__name__)

FORMS = ("function_index", "argument", "direct_call")
ROW_KEYS = ("id", "record_id", "form", "function", "parameter", "prompt", "completion")
DTYPES = ("fp32", "bf16")
REPORTERS = ("none", "wandb", "tensorboard")
FINGERPRINT_FILE = "run_fingerprint.json"


# ------------------------------------------------------------------------------------------ params + recipe

@dataclass(frozen=True)
class TrainSidecarParams:
    """params.yaml section ``train_sidecar``. Defaults are the bounded CPU run (<= 20 min on 2 cores)."""

    recipe: str = "recipes/cpu_default.yaml"  # path to a recipes/*.yaml, relative to the repo root
    max_train_rows: int = 400  # bounded, seeded subset of data/slots/train.jsonl (~15 min, 2 cores); 0 = all
    seed: int = 0
    threads: int = 2  # torch.set_num_threads on CPU; 0 = leave torch's default
    resume: bool = True  # continue from the latest checkpoint of the same run (same data, recipe, params)


@dataclass(frozen=True)
class Recipe:
    """A sidecar training recipe (recipes/*.yaml). Unknown keys are an error; see :func:`load_recipe`.

    ``base`` is anything ``ooospec.runtime.models.load_target`` takes (registry name, local folder, hub id);
    ``base_model_id`` is the Hub id written into the adapter config and the model card.
    """

    base: str
    base_model_id: str = ""
    dtype: str = "fp32"  # weights dtype at load: fp32 | bf16
    bf16: bool = False  # bf16 autocast in the Trainer (GPU recipes); independent of ``dtype``
    # LoRA
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    init_lora_weights: bool = True  # False = random B too (tests: a non-identity adapter from step 0)
    # optimisation
    learning_rate: float = 2e-4
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = 0.03  # fraction of total steps (Trainer's ``warmup_steps`` as a float in [0, 1))
    weight_decay: float = 0.0
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    num_train_epochs: float = 1.0  # the paper trains one epoch
    max_steps: int = -1  # > 0 overrides epochs (smoke runs)
    max_len: int = 1024  # rows whose prompt + completion + EOS exceed this are dropped (and counted)
    group_by_length: bool = True  # batches of similar length: less padding, much faster on CPU
    gradient_checkpointing: bool = False
    # bookkeeping
    logging_steps: int = 5
    save_steps: int = 50
    save_total_limit: int = 2
    report_to: str = "wandb"
    wandb_project: str = "ooo-spec"

    def __post_init__(self) -> None:
        problems = []
        if not self.base:
            problems.append("base must name a model")
        if self.dtype not in DTYPES:
            problems.append(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.report_to not in REPORTERS:
            problems.append(f"report_to must be one of {REPORTERS}, got {self.report_to!r}")
        for name in ("lora_r", "lora_alpha", "per_device_train_batch_size", "gradient_accumulation_steps",
                     "max_len", "logging_steps", "save_steps"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.lora_dropout < 1.0:
            problems.append(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            problems.append(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.learning_rate <= 0:
            problems.append(f"learning_rate must be > 0, got {self.learning_rate}")
        if not self.target_modules or "lm_head" in self.target_modules:
            problems.append(f"target_modules must be non-empty and exclude lm_head, got {list(self.target_modules)}")
        if self.num_train_epochs <= 0 and self.max_steps <= 0:
            problems.append("one of num_train_epochs or max_steps must be > 0")
        if problems:
            raise ValueError("invalid recipe: " + "; ".join(problems))


def recipe_from_dict(data: dict, source: str = "<dict>") -> Recipe:
    """Build a :class:`Recipe`, rejecting unknown keys and wrong types by name.

    >>> recipe_from_dict({"base": "smollm2-135m", "lora_r": 8}).lora_r
    8
    >>> recipe_from_dict({"base": "x", "lora_rank": 8})
    Traceback (most recent call last):
    ValueError: <dict>: unknown recipe key(s) ['lora_rank']; known: [...]
    """
    if not isinstance(data, dict):
        raise TypeError(f"{source}: a recipe must be a YAML mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(Recipe)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{source}: unknown recipe key(s) {unknown}; known: {sorted(fields)}")
    if "base" not in data:
        raise ValueError(f"{source}: recipe needs a 'base' model")
    hints = typing.get_type_hints(Recipe)
    kwargs = {}
    for key, value in data.items():
        kwargs[key] = _coerce(hints[key], value, f"{source}: {key}")
    try:
        return Recipe(**kwargs)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Check a YAML value against a field type; ints widen to float, lists become tuples."""
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true/false, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} must be a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string, got {value!r}")
        return value
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{where} must be a list of strings, got {value!r}")
        return tuple(value)
    return value


def load_recipe(path: str | os.PathLike) -> Recipe:
    """Read and validate ``recipes/*.yaml``."""
    path = Path(path)
    if not path.is_file():
        known = sorted(p.name for p in path.parent.glob("*.yaml")) if path.parent.is_dir() else []
        raise FileNotFoundError(f"recipe {str(path)!r} not found (recipes there: {known})")
    with open(path, encoding="utf-8") as f:
        return recipe_from_dict(yaml.safe_load(f), str(path))


def recipe_to_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(as_dict(recipe), sort_keys=False)


# ------------------------------------------------------------------------------------------------ rows

def read_slot_rows(path: str | os.PathLike) -> list[dict]:
    """Read slot rows; a row missing a key or with an unknown ``form`` raises, naming the row."""
    rows = []
    for i, row in enumerate(read_jsonl(Path(path)), 1):
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"{path}:{i}: slot row {row.get('id')!r} lacks {missing}")
        if row["form"] not in FORMS:
            raise ValueError(f"{path}:{i}: slot row {row['id']!r} has form {row['form']!r}, expected one of {FORMS}")
        if not isinstance(row["prompt"], str) or not isinstance(row["completion"], str):
            raise TypeError(f"{path}:{i}: slot row {row['id']!r}: prompt and completion must be strings")
        rows.append(row)
    return rows


def _rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def select_rows(rows: list[dict], max_rows: int, seed: int) -> list[dict]:
    """A seeded subset of at most ``max_rows`` rows (0 = all), by hash of ``seed:id``; output in that hash order.

    The choice of one row never depends on the others, so growing ``max_rows`` only adds rows, and the same
    (rows, seed) always gives the same subset whatever the file order.
    """
    if max_rows < 0:
        raise ValueError(f"max_train_rows must be >= 0 (0 = all), got {max_rows}")
    ranked = sorted(rows, key=lambda r: _rank(seed, r["id"]))
    return ranked if max_rows == 0 else ranked[:max_rows]


def split_by_length(rows: list[dict], tokenizer, max_len: int) -> tuple[list[dict], list[dict]]:
    """``(kept, too_long)``: a row is kept when ``len(tok(prompt + completion + eos)) <= max_len``.

    SFTTrainer would otherwise cut the sequence at ``max_len`` from the right and train on a truncated
    completion (or drop it), silently; we drop and count instead.
    """
    eos = tokenizer.eos_token or ""
    texts = [r["prompt"] + r["completion"] + eos for r in rows]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    kept = [r for r, n in zip(rows, lengths) if n <= max_len]
    too_long = [r for r, n in zip(rows, lengths) if n > max_len]
    return kept, too_long


def count_forms(rows: Iterable[dict]) -> dict[str, int]:
    counts = {f: 0 for f in FORMS}
    for r in rows:
        counts[r["form"]] += 1
    return counts


# ------------------------------------------------------------------------------------------------ model

def load_base(recipe: Recipe, threads: int | None = None):
    """``(model, tokenizer)`` of the recipe's base via ``load_target`` (registry name, local folder or hub id)."""
    from ooospec.runtime.models import load_target

    model, tok = load_target(recipe.base, dtype=recipe.dtype, threads=threads or None)
    if tok.eos_token is None:
        raise ValueError(f"base {recipe.base!r}: tokenizer has no eos_token; completions need one to stop")
    return model, tok


def lora_config(recipe: Recipe):
    from peft import LoraConfig

    return LoraConfig(r=recipe.lora_r, lora_alpha=recipe.lora_alpha, lora_dropout=recipe.lora_dropout,
                      target_modules=list(recipe.target_modules), init_lora_weights=recipe.init_lora_weights,
                      bias="none", task_type="CAUSAL_LM")


def configure_wandb(report_to: str, out_dir: Path, project: str) -> None:
    """W&B runs offline unless the user chose otherwise (WANDB_API_KEY or WANDB_MODE set): no network errors."""
    if report_to != "wandb":
        return
    if "WANDB_MODE" not in os.environ and "WANDB_API_KEY" not in os.environ:
        os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("WANDB_PROJECT", project)
    if "WANDB_DIR" not in os.environ:
        (out_dir / "wandb").mkdir(parents=True, exist_ok=True)
        os.environ["WANDB_DIR"] = str(out_dir)
    os.environ.setdefault("WANDB_SILENT", "true")


def sft_config(recipe: Recipe, output_dir: Path, seed: int, report_to: str | None = None):
    """The trl ``SFTConfig`` for a recipe: prompt-completion data, completion-only loss, checkpoints."""
    import torch
    from trl import SFTConfig

    on_gpu = torch.cuda.is_available()
    return SFTConfig(
        output_dir=str(output_dir),
        seed=seed,
        data_seed=seed,
        num_train_epochs=recipe.num_train_epochs,
        max_steps=recipe.max_steps,
        per_device_train_batch_size=recipe.per_device_train_batch_size,
        gradient_accumulation_steps=recipe.gradient_accumulation_steps,
        learning_rate=recipe.learning_rate,
        lr_scheduler_type=recipe.lr_scheduler_type,
        warmup_steps=recipe.warmup_ratio,
        weight_decay=recipe.weight_decay,
        activation_checkpointing=recipe.gradient_checkpointing,
        bf16=recipe.bf16,  # CUDA autocast, or CPU autocast (fast with AMX/avx512_bf16)
        use_cpu=not on_gpu,
        max_length=recipe.max_len,
        train_sampling_strategy="group_by_length" if recipe.group_by_length else "random",
        completion_only_loss=True,
        packing=False,
        logging_steps=recipe.logging_steps,
        save_strategy="steps",
        save_steps=recipe.save_steps,
        save_total_limit=recipe.save_total_limit,
        report_to=report_to if report_to is not None else recipe.report_to,
        run_name=f"sidecar-{Path(recipe.base).name}-r{recipe.lora_r}",
        dataloader_num_workers=0,
        disable_tqdm=False,
    )


def build_trainer(model, tokenizer, rows: list[dict], recipe: Recipe, output_dir: Path, seed: int,
                  report_to: str | None = None):
    """An ``SFTTrainer`` over ``rows`` (prompt-completion pairs) with a fresh LoRA on ``model``.

    The returned trainer's ``model`` is the ``PeftModel``; only LoRA weights have ``requires_grad``.
    """
    import torch
    from datasets import Dataset
    from peft import get_peft_model
    from trl import SFTTrainer

    torch.manual_seed(seed)  # LoRA A init (and B when init_lora_weights=False)
    peft_model = get_peft_model(model, lora_config(recipe))
    data = Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows])
    return SFTTrainer(model=peft_model, args=sft_config(recipe, output_dir, seed, report_to),
                      train_dataset=data, processing_class=tokenizer)


# --------------------------------------------------------------------------------------------- resume

def run_fingerprint(params: TrainSidecarParams, recipe: Recipe, data_sha: str) -> str:
    """What must match for a checkpoint to be resumed: data file, recipe and the params section."""
    return hashlib.sha256(canonical_json({"params": as_dict(params), "recipe": as_dict(recipe),
                                          "data": data_sha}).encode()).hexdigest()


def _checkpoint_step(ckpt: Path) -> int:
    """``checkpoint-12`` -> 12."""
    return int(ckpt.name.rsplit("-", 1)[1])


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The ``checkpoint-<step>`` folder with the highest step, or None."""
    if not ckpt_dir.is_dir():
        return None
    found = [(_checkpoint_step(p), p) for p in ckpt_dir.glob("checkpoint-*")
             if p.is_dir() and p.name.split("-")[1].isdigit()]
    return max(found)[1] if found else None


def prepare_checkpoints(ckpt_dir: Path, fingerprint: str, resume: bool) -> Path | None:
    """Return the checkpoint to resume from, clearing checkpoints of a different run (or all, if not resuming)."""
    stamp = ckpt_dir / FINGERPRINT_FILE
    previous = json.loads(stamp.read_text())["fingerprint"] if stamp.is_file() else None
    ckpt = latest_checkpoint(ckpt_dir)
    if ckpt is not None and (not resume or previous != fingerprint):
        why = "resume is off" if not resume else "they belong to a different run (data, recipe or params changed)"
        logger.warning("removing old checkpoints in %s: %s", ckpt_dir, why)
        shutil.rmtree(ckpt_dir)
        ckpt = None
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps({"fingerprint": fingerprint}) + "\n")
    if ckpt is not None:
        logger.info("resuming from %s", ckpt)
    return ckpt


def checkpoint_is_final(ckpt: Path) -> bool:
    """True when ``ckpt`` was saved at the run's last step (its ``trainer_state.json`` says so)."""
    state_file = ckpt / "trainer_state.json"
    if not state_file.is_file():
        return False
    state = json.loads(state_file.read_text())
    return state.get("max_steps", 0) > 0 and state.get("global_step", 0) >= state["max_steps"]


def load_final_checkpoint(trainer, ckpt: Path) -> None:
    """Put a finished run's adapter weights and trainer state (step, epoch, loss log) into ``trainer``."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import TrainerState

    result = set_peft_model_state_dict(trainer.model, load_file(ckpt / "adapter_model.safetensors"))
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise ValueError(f"{ckpt}: adapter weights do not fit the model (e.g. {unexpected[:3]})")
    trainer.state = TrainerState.load_from_json(str(ckpt / "trainer_state.json"))


# ------------------------------------------------------------------------------------------------ metrics

def loss_curve(log_history: list[dict]) -> list[dict]:
    """The logged training losses: ``[{"step", "epoch", "loss", "learning_rate"}]`` in step order."""
    return [{"step": h["step"], "epoch": round(h.get("epoch", 0.0), 4), "loss": round(h["loss"], 6),
             "learning_rate": h.get("learning_rate")}
            for h in log_history if "loss" in h and "step" in h]


def _cpu_seconds() -> float:
    """User + system CPU time of this process (all threads)."""
    t = os.times()
    return t.user + t.system


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------------------ stage

def run(params: TrainSidecarParams, train_path: str | os.PathLike, out_dir: str | os.PathLike,
        metrics_path: str | os.PathLike, recipe: Recipe | None = None) -> dict:
    """Train the sidecar adapter; write ``out_dir/adapter`` and the metrics JSON; return the metrics.

    ``recipe`` overrides ``params.recipe`` (tests pass a tiny one; the CLI's ``--recipe`` too).
    """
    import torch

    out_dir, metrics_path = Path(out_dir), Path(metrics_path)
    recipe_source = params.recipe if recipe is None else "<given>"
    recipe = recipe or load_recipe(params.recipe)
    seed_everything(params.seed)
    if params.threads > 0:
        torch.set_num_threads(params.threads)
    configure_wandb(recipe.report_to, out_dir, recipe.wandb_project)

    all_rows = read_slot_rows(train_path)
    if not all_rows:
        raise ValueError(f"{train_path}: no slot rows to train on")
    chosen = select_rows(all_rows, params.max_train_rows, params.seed)
    model, tok = load_base(recipe, params.threads)
    rows, too_long = split_by_length(chosen, tok, recipe.max_len)
    if too_long:
        logger.warning("dropped %d of %d rows longer than max_len=%d tokens (e.g. %s)",
                       len(too_long), len(chosen), recipe.max_len, too_long[0]["id"])
    if not rows:
        raise ValueError(f"every selected row is longer than max_len={recipe.max_len}; raise it in the recipe")

    ckpt_dir = out_dir / "checkpoints"
    resume_from = prepare_checkpoints(ckpt_dir, run_fingerprint(params, recipe, sha256_file(Path(train_path))),
                                      params.resume)
    trainer = build_trainer(model, tok, rows, recipe, ckpt_dir, params.seed)
    trained_tokens = sum(sum(1 for t in labels if t != -100) for labels in trainer.train_dataset["labels"])
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    if resume_from is not None and checkpoint_is_final(resume_from):
        # the run already finished: Trainer would step once more past max_steps on such a resume (seen with
        # transformers 5.24 when max_steps ends mid-epoch), so load the final weights and train nothing
        logger.info("%s is the final checkpoint of this run: nothing to train", resume_from)
        load_final_checkpoint(trainer, resume_from)
        training_loss = None
    else:
        training_loss = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None).training_loss
    wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    start_step = _checkpoint_step(resume_from) if resume_from else 0
    steps_this_run = trainer.state.global_step - start_step
    curve = loss_curve(trainer.state.log_history)

    metrics = {
        "base": recipe.base,
        "base_model_id": recipe.base_model_id,
        "recipe": recipe_source,
        "rows": {"available": len(all_rows), "selected": len(chosen), "dropped_too_long": len(too_long),
                 "trained": len(rows), "by_form": count_forms(rows)},
        "completion_tokens": trained_tokens,
        "steps": trainer.state.global_step,
        "epochs": round(trainer.state.epoch or 0.0, 4),
        "resumed_from": resume_from.name if resume_from else None,
        "steps_this_run": steps_this_run,  # train_loss / seconds below cover only these steps
        # a resume from the final checkpoint trains nothing: no loss to report (the curve keeps the old ones)
        "train_loss": round(training_loss, 6) if steps_this_run and training_loss is not None else None,
        "final_loss": curve[-1]["loss"] if curve else None,
        "loss_curve": curve,
        "train_seconds": round(wall, 2),
        "train_cpu_seconds": round(cpu, 2),  # user+sys of this process: wall x threads on an idle machine
        "threads": torch.get_num_threads(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
    }
    if trainer.is_world_process_zero():
        save_adapter(trainer, tok, out_dir / "adapter")
        atomic_write_text(out_dir / "recipe.yaml", recipe_to_yaml(recipe))
        write_json(out_dir / "params.json", {"train_sidecar": as_dict(params)})
        write_json(metrics_path, metrics)
    logger.info("trained %d rows in %.1fs, final loss %s", len(rows), wall, metrics["final_loss"])
    return metrics


def _sort_target_modules(config_path: Path) -> None:
    """peft keeps ``target_modules`` as a set and writes it in hash order; sort it so reruns are byte-identical."""
    cfg = json.loads(config_path.read_text())
    if isinstance(cfg.get("target_modules"), list):
        cfg["target_modules"] = sorted(cfg["target_modules"])
        config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def save_adapter(trainer, tokenizer, adapter_dir: Path) -> None:
    """peft ``save_pretrained`` (adapter_model.safetensors + adapter_config.json) and the tokenizer."""
    tmp = adapter_dir.with_name(adapter_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    _sort_target_modules(tmp / "adapter_config.json")
    shutil.rmtree(adapter_dir, ignore_errors=True)
    tmp.replace(adapter_dir)


# ------------------------------------------------------------------------------------------------ CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("train", help="slot rows (data/slots/train.jsonl)")
    parser.add_argument("out_dir", help="output folder (models/sidecar)")
    parser.add_argument("metrics", help="metrics JSON (metrics/train_sidecar.json)")
    parser.add_argument("--params", default="params.yaml", help="params file (section train_sidecar)")
    parser.add_argument("--recipe", default=None, help="override params' recipe (e.g. recipes/gpu_qwen3_0.6b.yaml)")
    parser.add_argument("--max-train-rows", type=int, default=None, help="override params' max_train_rows (0 = all)")
    parser.add_argument("--threads", type=int, default=None, help="override params' threads")


def run_cli(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    params = load_section(TrainSidecarParams, "train_sidecar", Path(args.params))
    if args.recipe:
        params = dataclasses.replace(params, recipe=args.recipe)
    if args.max_train_rows is not None:
        params = dataclasses.replace(params, max_train_rows=args.max_train_rows)
    if args.threads is not None:
        params = dataclasses.replace(params, threads=args.threads)
    m = run(params, args.train, args.out_dir, args.metrics)
    print(f"train_sidecar: {m['rows']['trained']} rows, {m['steps']} steps, loss {m['final_loss']}, "
          f"{m['train_seconds']:.0f}s -> {Path(args.out_dir) / 'adapter'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ooospec.pipelines.train_sidecar", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
