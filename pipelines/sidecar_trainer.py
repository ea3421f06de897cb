"""The transformers ``Trainer`` the sidecar trains with (``train_sidecar``): a LoRA on the base (fresh, or continued
from an earlier sidecar adapter once :func:`check_init_adapter` says it fits), the ``TrainingArguments`` of a recipe
(:class:`~ooospec.pipelines.recipe.Recipe`: packed batches kept whole, checkpoints, bf16 autocast where
:func:`resolve_autocast` says so) and, when the rows weigh their slots, a loss that weighs each answer token by its
slot. The stage itself (rows, resume, metrics, outputs) is :mod:`ooospec.pipelines.train_sidecar`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ooospec.pipelines.packing import LossWeights, PackedCollator
from ooospec.pipelines.recipe import Recipe
from ooospec.pipelines.records import sha256_file
from ooospec.runtime.sidecar import prompts as sp


def lora_config(recipe: Recipe):
    from peft import LoraConfig

    return LoraConfig(r=recipe.lora_r, lora_alpha=recipe.lora_alpha, lora_dropout=recipe.lora_dropout,
                      target_modules=list(recipe.target_modules), init_lora_weights=recipe.init_lora_weights,
                      bias="none", task_type="CAUSAL_LM")


def check_init_adapter(recipe: Recipe, layout: int) -> str:
    """The sha256 of ``recipe.init_adapter``'s weights, once it fits: the recipe's base and rank, the rows' layout.
    Raises ValueError saying what does not fit."""
    folder = Path(recipe.init_adapter)
    meta = sp.read_metadata(folder)
    problems = []
    if meta.get("base") != recipe.base:
        problems.append(f"its base is {meta.get('base')!r}, the recipe's {recipe.base!r}")
    if meta.get("layout_version") != layout:
        problems.append(f"it learned prompt layout {meta.get('layout_version')}, the rows are layout {layout}")
    rank = json.loads((folder / "adapter_config.json").read_text()).get("r")
    if rank != recipe.lora_r:
        problems.append(f"its LoRA rank is {rank}, the recipe's lora_r {recipe.lora_r}")
    if problems:
        raise ValueError(f"init_adapter {str(folder)!r} does not fit: " + "; ".join(problems))
    return sha256_file(folder / "adapter_model.safetensors")


def continued_adapter(model, recipe: Recipe):
    """``model`` with ``recipe.init_adapter``'s LoRA loaded trainable, its weights in fp32 (a bf16 export would
    otherwise train in bf16)."""
    import torch
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(model, recipe.init_adapter, is_trainable=True)
    for param in peft_model.parameters():
        if param.requires_grad:
            param.data = param.data.to(torch.float32)
    return peft_model


def resolve_autocast(recipe: Recipe, threads: int) -> tuple[bool, str]:
    """``(bf16 autocast on?, reason)`` for the recipe's ``autocast`` on this machine."""
    if recipe.autocast == "none":
        return False, "recipe: autocast none"
    if recipe.autocast == "bf16":
        return True, "recipe: autocast bf16"
    from ooospec.runtime.backends.hardware import resolve_dtype

    dtype, why = resolve_dtype("auto", threads=threads)
    return dtype == "bf16", why


def training_args(recipe: Recipe, output_dir: Path, seed: int, bf16: bool, report_to: str | None = None):
    """The transformers ``TrainingArguments`` of a recipe: packed batches kept whole, checkpoints, one epoch."""
    import torch
    from transformers import TrainingArguments

    return TrainingArguments(
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
        bf16=bf16,  # autocast: CUDA, or CPU (fast with AMX / avx512_bf16)
        use_cpu=not torch.cuda.is_available(),
        train_sampling_strategy="group_by_length" if recipe.group_by_length else "random",
        remove_unused_columns=False,  # the collator needs segment_ids / position_ids
        logging_steps=recipe.logging_steps,
        save_strategy="steps",
        save_steps=recipe.save_steps,
        save_total_limit=recipe.save_total_limit,
        report_to=report_to if report_to is not None else recipe.report_to,
        run_name=f"sidecar-{Path(recipe.base).name}-r{recipe.lora_r}",
        dataloader_num_workers=0,
        disable_tqdm=False,
    )


def loss_weights(recipe: Recipe) -> LossWeights:
    return LossWeights(function_index=recipe.loss_weight_function_index, null=recipe.loss_weight_null)


def _weighted_trainer_class():
    from transformers import Trainer

    class WeightedLossTrainer(Trainer):
        """``Trainer`` whose loss weighs each answer token by its slot (the collator's ``label_weights``).

        loss = sum_i w_i * CE_i / N, N = the label tokens of the whole accumulated batch (``num_items_in_batch``,
        as the model's own loss does), so weights of 1 give exactly the plain loss, gradient accumulation included.
        """

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            import torch

            inputs = dict(inputs)
            weights = inputs.pop("label_weights")
            shift_labels = inputs.pop("shift_labels")
            inputs.pop("labels", None)
            outputs = model(**inputs)
            logits = outputs.logits.reshape(-1, outputs.logits.shape[-1]).float()
            ce = torch.nn.functional.cross_entropy(logits, shift_labels.to(logits.device), reduction="none")
            n = num_items_in_batch if num_items_in_batch is not None else shift_labels.numel()
            loss = (ce * weights.to(ce.device, ce.dtype)).sum() / n
            if num_items_in_batch is not None and self.args.average_tokens_across_devices:
                # n counts every process's label tokens and DDP averages the gradients over processes: scale
                # back so N processes give the 1-process gradient of the same global batch (as Trainer does
                # for the models' own loss)
                loss = loss * self.accelerator.num_processes
            return (loss, outputs) if return_outputs else loss

    return WeightedLossTrainer


def build_trainer(model, tokenizer, sequences: list[dict], recipe: Recipe, output_dir: Path, seed: int,
                  bf16: bool = False, report_to: str | None = None):
    """A transformers ``Trainer`` over packed ``sequences`` with a fresh LoRA on ``model``.

    The returned trainer's ``model`` is the ``PeftModel``; only LoRA weights have ``requires_grad``.
    """
    import torch
    from datasets import Dataset
    from peft import get_peft_model
    from transformers import Trainer

    torch.manual_seed(seed)  # LoRA A init (and B when init_lora_weights=False)
    if recipe.init_adapter:
        peft_model = continued_adapter(model, recipe)
    else:
        peft_model = get_peft_model(model, lora_config(recipe))
    data = Dataset.from_list([{**s, "length": len(s["input_ids"])} for s in sequences])
    collator = PackedCollator(tokenizer.pad_token_id, mask_dtype=model.dtype)
    trainer_class = _weighted_trainer_class() if "label_weights" in sequences[0] else Trainer
    return trainer_class(model=peft_model, args=training_args(recipe, output_dir, seed, bf16, report_to),
                   train_dataset=data, data_collator=collator, processing_class=tokenizer)
