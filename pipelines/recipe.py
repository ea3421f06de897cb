"""Sidecar training recipes (``recipes/*.yaml``): the typed schema, strict loading, and the resolved form.

A recipe says *how* to train the sidecar (base model, LoRA, optimisation, precision); params.yaml's
``train_sidecar`` section only picks the recipe and bounds the run. ``train_sidecar`` trains with one,
``eval_sidecar`` and ``export_adapter`` read the copy saved next to the adapter (``models/sidecar/recipe.yaml``)::

    recipe = load_recipe("recipes/cpu_default.yaml")        # unknown keys and wrong types are errors, by name
"""

from __future__ import annotations

import dataclasses
import logging
import os
import typing
from dataclasses import dataclass

import yaml

from ooospec.pipelines.params import as_dict, coerce
from ooospec.runtime.paths import resolve_recipe

DTYPES = ("auto", "fp32", "bf16")
AUTOCASTS = ("auto", "bf16", "none")
REPORTERS = ("none", "wandb", "tensorboard")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recipe:
    """A sidecar training recipe. Unknown keys are an error; see :func:`load_recipe`.

    ``base`` is anything ``ooospec.runtime.backends.models.load_target`` takes (registry name, local folder, hub id);
    ``base_model_id`` is the Hub id written into the adapter config and the model card.
    """

    base: str
    base_model_id: str = ""
    dtype: str = "fp32"  # frozen base weights at load: auto | fp32 | bf16 (auto: see ooospec.runtime.backends.hardware)
    # bf16 autocast: "auto" = on where the hardware multiplies bf16 natively and a probe finds it faster
    # (CUDA, AMX / avx512_bf16 CPUs; see ooospec.runtime.backends.hardware), "bf16" = always, "none" = never
    # (YAML reads a bare off as false)
    autocast: str = "auto"
    # LoRA
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    init_lora_weights: bool = True  # False = random B too (tests: a non-identity adapter from step 0)
    # continue from a trained sidecar adapter folder (e.g. adapters/sidecar) instead of a fresh LoRA: its base must be
    # this recipe's, its layout the rows', its rank lora_r; its LoRA weights train on (in fp32)
    init_adapter: str | None = None
    # optimisation
    learning_rate: float = 2e-4
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = 0.03  # fraction of total steps (Trainer's ``warmup_steps`` as a float in [0, 1))
    weight_decay: float = 0.0
    per_device_train_batch_size: int = 4  # packed sequences (one request each) per device batch
    gradient_accumulation_steps: int = 1
    num_train_epochs: float = 1.0  # the paper trains one epoch
    max_steps: int = -1  # > 0 overrides epochs (smoke runs)
    max_len: int = 1536  # tokens per packed sequence; longer requests are split (whole slots per sequence)
    group_by_length: bool = True  # batches of similar length: less padding, much faster on CPU
    gradient_checkpointing: bool = False
    # loss: each answer token's cross-entropy times its slot's weight, normalised by the number of answer tokens
    # (1.0 everywhere = the plain mean). Up-weight the index answer (1 token of ~90 in a 5-tool request) and
    # down-weight the many ``null`` argument answers; see ooospec.pipelines.packing.slot_weight.
    loss_weight_function_index: float = 1.0
    loss_weight_null: float = 1.0
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
        if self.autocast not in AUTOCASTS:
            problems.append(f"autocast must be one of {AUTOCASTS}, got {self.autocast!r}")
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
        for name in ("loss_weight_function_index", "loss_weight_null"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if self.learning_rate <= 0:
            problems.append(f"learning_rate must be > 0, got {self.learning_rate}")
        if not self.target_modules or "lm_head" in self.target_modules:
            problems.append(f"target_modules must be non-empty and exclude lm_head, got {list(self.target_modules)}")
        if self.num_train_epochs <= 0 and self.max_steps <= 0:
            problems.append("one of num_train_epochs or max_steps must be > 0")
        if problems:
            raise ValueError("invalid recipe: " + "; ".join(problems))


# Fields added after runs were checkpointed: left out of a run's fingerprint while at their default, so those runs
# still resume (see ooospec.pipelines.train_sidecar.run_fingerprint).
LATER_FIELDS = {"loss_weight_function_index": 1.0, "loss_weight_null": 1.0, "init_adapter": None}


def recipe_from_dict(data: dict, source: str = "<dict>") -> Recipe:
    """Build a :class:`Recipe`, rejecting unknown keys and wrong types by name (the params' strict coercion).

    >>> recipe_from_dict({"base": "smollm2-135m", "lora_r": 8}).lora_r
    8
    >>> recipe_from_dict({"base": "x", "lora_rank": 8})
    Traceback (most recent call last):
    ValueError: <dict>: unknown recipe key(s) ['lora_rank']; known: [...]
    """
    if not isinstance(data, dict):
        raise TypeError(f"{source}: a recipe must be a YAML mapping, got {type(data).__name__}")
    fields = {f.name for f in dataclasses.fields(Recipe)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ValueError(f"{source}: unknown recipe key(s) {unknown}; known: {sorted(fields)}")
    if "base" not in data:
        raise ValueError(f"{source}: recipe needs a 'base' model")
    hints = typing.get_type_hints(Recipe)
    kwargs = {key: coerce(hints[key], value, f"{source}: {key}") for key, value in data.items()}
    try:
        return Recipe(**kwargs)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def load_recipe(path: str | os.PathLike) -> Recipe:
    """Read and validate ``recipes/*.yaml`` (found by :func:`~ooospec.runtime.paths.resolve_recipe`)."""
    path = resolve_recipe(path)
    with open(path, encoding="utf-8") as f:
        return recipe_from_dict(yaml.safe_load(f), str(path))


def recipe_to_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(as_dict(recipe), sort_keys=False)


def load_base(recipe: Recipe, threads: int | None = None, dtype: str | None = None):
    """``(model, tokenizer)`` of the recipe's base via ``load_target`` (registry name, local folder or hub id)."""
    from ooospec.runtime.backends.hardware import resolve_dtype
    from ooospec.runtime.backends.models import load_target

    dtype, why = resolve_dtype(dtype or recipe.dtype, threads=threads or None)
    logger.info("sidecar base %s in %s (%s)", recipe.base, dtype, why)
    model, tok = load_target(recipe.base, dtype=dtype, threads=threads or None)
    if tok.eos_token is None:
        raise ValueError(f"base {recipe.base!r}: tokenizer has no eos_token; answers need one to stop")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok
