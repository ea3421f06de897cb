"""DVC stage ``train_sidecar``: LoRA-train the OoO-Spec sidecar on packed request rows, one epoch, then freeze.

The sidecar is a small causal LM plus a LoRA adapter. Each training sequence is ONE request of
``data/slots/train.jsonl`` packed with its shared block and every slot's query/answer segment
(:mod:`ooospec.pipelines.packing`): a 4D mask lets each segment see the block and itself only, with position
ids continuing from the block -- the visibility the runtime's one-pass wave has. The loss covers answer
tokens + EOS only (the paper's "one epoch of causal cross-entropy", then the adapter is frozen and used
unchanged across targets). Training is the HF stack: peft ``get_peft_model`` + transformers ``Trainer`` with
the packing collator (:mod:`ooospec.pipelines.sidecar_trainer`); bf16 autocast where the hardware has native bf16
(recipe ``autocast: auto``).

Everything about *how* to train lives in a recipe (``recipes/*.yaml`` -> :class:`~ooospec.pipelines.recipe.Recipe`);
params.yaml's ``train_sidecar`` section (:class:`TrainSidecarParams`) only picks the recipe and bounds the run::

    python -m ooospec.pipelines.train_sidecar data/slots/train.jsonl models/sidecar metrics/train_sidecar.json
    accelerate launch --config_file recipes/accelerate_cpu.yaml --num_processes 2 -m ooospec.pipelines.train_sidecar \\
        data/slots/train.jsonl models/sidecar metrics/train_sidecar.json          # N CPU processes, gloo
    accelerate launch --config_file recipes/accelerate_multi_gpu.yaml -m ooospec.pipelines.train_sidecar \\
        data/slots/train.jsonl models/sidecar metrics/train_sidecar.json --recipe recipes/gpu_qwen3_0.6b.yaml

On N processes (``torchrun`` / ``accelerate launch``): every process packs the same sequences, cut to a multiple of
N x the per-device batch so each trains distinct whole batches; process 0 alone clears or keeps checkpoints (the
others wait for it) and writes the adapter, checkpoints' model files and metrics; the reported loss is the mean over
the processes; ``threads: 0`` shares the machine's cores between its processes.

Outputs (``out_dir`` = models/sidecar)::

    adapter/        peft save_pretrained (adapter_model.safetensors, adapter_config.json) + tokenizer
                    + sidecar.json (prompt layout version, base, data and training summary)
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
from dataclasses import dataclass
from pathlib import Path

from ooospec.pipelines.checkpoints import (
    Processes,
    checkpoint_is_final,
    checkpoint_step,
    latest_checkpoint,
    load_final_checkpoint,
    mean_over_processes,
    prepare_checkpoints,
    shardable_sequences,
)
from ooospec.pipelines.packing import pack_rows
from ooospec.pipelines.params import as_dict, load_section, module_main
from ooospec.pipelines.recipe import LATER_FIELDS, Recipe, load_base, load_recipe, recipe_to_yaml
from ooospec.pipelines.records import atomic_write_text, sha256_file, write_json
from ooospec.pipelines.sidecar_trainer import build_trainer, check_init_adapter, loss_weights, resolve_autocast
from ooospec.pipelines.slot_rows import read_request_rows, rows_layout
from ooospec.pipelines.tracking import configure_wandb
from ooospec.runtime.backends.hardware import cpu_info, resolve_threads
from ooospec.runtime.calls import canonical_json
from ooospec.runtime.paths import DEFAULT_RECIPE
from ooospec.runtime.sidecar import prompts as sp

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class TrainSidecarParams:
    """params.yaml section ``train_sidecar``. Defaults are the small CPU run of the README's first command."""

    recipe: str = DEFAULT_RECIPE  # a recipes/*.yaml, relative to the repo root (else the shipped copy)
    max_train_requests: int = 0  # bounded, seeded subset of the request rows; 0 = all
    seed: int = 0
    threads: int = 0  # torch.set_num_threads on CPU; 0 = the cores this process may use
    resume: bool = True  # continue from the latest checkpoint of the same run (same data, recipe, params)


# ------------------------------------------------------------------------------------------------ rows

def _rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def select_requests(rows: list[dict], max_requests: int, seed: int) -> list[dict]:
    """A seeded subset of at most ``max_requests`` rows (0 = all), by hash of ``seed:id``; output in that order.

    The choice of one row never depends on the others, so growing ``max_requests`` only adds rows, and the same
    (rows, seed) always gives the same subset whatever the file order.
    """
    if max_requests < 0:
        raise ValueError(f"max_train_requests must be >= 0 (0 = all), got {max_requests}")
    ranked = sorted(rows, key=lambda r: _rank(seed, r["id"]))
    return ranked if max_requests == 0 else ranked[:max_requests]


def count_forms(rows: list[dict]) -> dict[str, int]:
    counts = {f: 0 for f in sp.FORMS}
    for r in rows:
        for s in r["slots"]:
            counts[s["form"]] += 1
    return counts


# --------------------------------------------------------------------------------------------- resume

def run_fingerprint(params: TrainSidecarParams, recipe: Recipe, data_sha: str,
                    layout: int = sp.LAYOUT_VERSION) -> str:
    """What must match for a checkpoint to be resumed: data file, recipe, params and the prompt layout.

    The thread count and ``resume`` are not part of it: a run may continue on another number of cores.
    """
    run_params = {k: v for k, v in as_dict(params).items() if k not in ("threads", "resume")}
    recipe_dict = {k: v for k, v in as_dict(recipe).items() if k not in LATER_FIELDS or v != LATER_FIELDS[k]}
    return hashlib.sha256(canonical_json({"params": run_params, "recipe": recipe_dict, "data": data_sha,
                                          "layout": layout}).encode()).hexdigest()


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
    recipe_source = describe_recipe(params, recipe)
    recipe = recipe or load_recipe(params.recipe)
    seed_everything(params.seed)
    procs = Processes.from_env()
    threads, threads_why = process_threads(params.threads, procs)
    torch.set_num_threads(threads)
    configure_wandb(recipe.report_to, out_dir, recipe.wandb_project)

    all_rows, layout, data_sha, init = training_data(train_path, recipe)
    chosen = select_requests(all_rows, params.max_train_requests, params.seed)
    model, tok = load_base(recipe, threads)
    sequences, pack, cut = training_sequences(tok, chosen, recipe, procs)
    bf16, autocast_why = resolve_autocast(recipe, threads)
    logger.info("bf16 autocast %s (%s); threads %d (%s)", "on" if bf16 else "off", autocast_why, threads,
                threads_why)

    fingerprint = run_fingerprint(params, recipe, data_sha, layout)
    trainer = build_trainer(model, tok, sequences, recipe, out_dir / "checkpoints", params.seed, bf16)   # joins
    resume_from = resume_point(trainer, out_dir / "checkpoints", fingerprint, params.resume)
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    training_loss = train_from(trainer, resume_from)
    wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0

    metrics = {
        "base": recipe.base,
        "base_model_id": recipe.base_model_id,
        "recipe": recipe_source,
        "init_adapter": init,
        "layout_version": layout,
        **data_metrics(all_rows, chosen, pack, cut, procs),
        **run_summary(trainer, resume_from, training_loss, wall, cpu),
        **machine_metrics(trainer, threads, bf16, autocast_why),
    }
    if trainer.is_world_process_zero():
        write_outputs(trainer, tok, recipe, params, metrics, out_dir, metrics_path)
    logger.info("trained %d requests (%d sequences) in %.1fs, final loss %s", len(chosen), pack.sequences, wall,
                metrics["final_loss"])
    return metrics


def describe_recipe(params: TrainSidecarParams, recipe: Recipe | None) -> str:
    """The metrics' ``recipe``: the params' recipe file, or ``<given>`` for a recipe passed in (with the adapter
    it continues from, when it names one)."""
    if recipe is None:
        return params.recipe
    if recipe.init_adapter is not None:
        return f"{params.recipe} (init_adapter {recipe.init_adapter})"
    return "<given>"


def training_data(train_path: str | os.PathLike, recipe: Recipe) -> tuple[list[dict], int, str, dict | None]:
    """``(request rows, their prompt layout, data fingerprint, init adapter)`` of a run: the rows of
    ``train_path`` (none: ValueError); the fingerprint is the file's sha256, plus the weights' of the recipe's
    ``init_adapter`` (``{"path", "sha256"}``, checked before the base loads: a continued run resumes only from
    that adapter)."""
    if not (all_rows := read_request_rows(train_path)):
        raise ValueError(f"{train_path}: no request rows to train on")
    layout = rows_layout(all_rows, f"{train_path}: request rows")   # what the adapter learns (sidecar.json)
    data_sha = sha256_file(Path(train_path))
    init = None
    if recipe.init_adapter:       # checked before the base loads; a continued run resumes only from that adapter
        init = {"path": recipe.init_adapter, "sha256": check_init_adapter(recipe, layout)}
        data_sha += ":" + init["sha256"]
    return all_rows, layout, data_sha, init


def data_metrics(all_rows: list[dict], chosen: list[dict], pack, cut: int, procs: Processes) -> dict:
    """The metrics of what was trained on: requests, slots, packed sequences and tokens, processes."""
    return {
        "requests": {"available": len(all_rows), "trained": len(chosen)},
        "slots": {"trained": pack.slots - pack.slots_dropped, "dropped_too_long": pack.slots_dropped,
                  "by_form": count_forms(chosen)},
        "sequences": pack.sequences,
        "sequences_cut_for_processes": cut,
        "processes": procs.world_size,
        "tokens": pack.tokens,
        "label_tokens": pack.label_tokens,
    }


def machine_metrics(trainer, threads: int, bf16: bool, autocast_why: str) -> dict:
    """The metrics of what it ran on: threads (per process), autocast, device, CPU, trainable parameters."""
    import torch

    return {
        "threads": threads,   # per process
        "bf16_autocast": bf16,
        "bf16_autocast_reason": autocast_why,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "cpu": cpu_info(),
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
    }


def process_threads(threads: int, procs: Processes) -> tuple[int, str]:
    """This process's torch threads and why: ``threads`` (0 = the cores this process may use, shared between the
    job's processes on this machine)."""
    n, why = resolve_threads(threads)
    if not threads and procs.local_world_size > 1:
        n = max(1, n // procs.local_world_size)
        why += f" / {procs.local_world_size} processes on this machine"
    return n, why


def training_sequences(tok, rows: list[dict], recipe: Recipe, procs: Processes):
    """``rows`` packed into training sequences (:func:`~ooospec.pipelines.packing.pack_rows`), cut so that every
    process gets distinct whole batches: ``(sequences, pack stats, sequences cut)``."""
    sequences, pack = pack_rows(tok, rows, recipe.max_len, loss_weights(recipe))
    if pack.slots_dropped:
        logger.warning("dropped %d of %d slots: block + slot longer than max_len=%d tokens",
                       pack.slots_dropped, pack.slots, recipe.max_len)
    if not sequences:
        raise ValueError(f"nothing fits max_len={recipe.max_len}; raise it in the recipe")
    sequences, cut = shardable_sequences(sequences, procs.world_size, recipe.per_device_train_batch_size)
    if cut:
        logger.warning("left out the last %d of %d sequences so %d processes get distinct whole batches",
                       cut, len(sequences) + cut, procs.world_size)
    return sequences, pack, cut


def resume_point(trainer, ckpt_dir: Path, fingerprint: str, resume: bool) -> Path | None:
    """The checkpoint this run resumes from: process 0 clears or keeps the checkpoints, the others follow it."""
    resume_from = None
    if trainer.is_world_process_zero():
        resume_from = prepare_checkpoints(ckpt_dir, fingerprint, resume)
    trainer.accelerator.wait_for_everyone()
    if not trainer.is_world_process_zero():
        resume_from = latest_checkpoint(ckpt_dir) if resume else None
    return resume_from


def train_from(trainer, resume_from: Path | None) -> float | None:
    """Train from ``resume_from`` (None: from scratch); the training loss, the mean over the processes."""
    if resume_from is not None and checkpoint_is_final(resume_from):
        # the run already finished: Trainer would step once more past max_steps on such a resume (seen with
        # transformers 5.24 when max_steps ends mid-epoch), so load the final weights and train nothing
        logger.info("%s is the final checkpoint of this run: nothing to train", resume_from)
        load_final_checkpoint(trainer, resume_from)
        return None
    result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    return mean_over_processes(result.training_loss)


def run_summary(trainer, resume_from: Path | None, training_loss: float | None, wall: float, cpu: float) -> dict:
    """The metrics of what this run trained: steps, epochs, losses (the curve keeps a resumed run's old ones) and
    time (only this run's steps)."""
    steps_this_run = trainer.state.global_step - (checkpoint_step(resume_from) if resume_from else 0)
    curve = loss_curve(trainer.state.log_history)
    return {
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
    }


def write_outputs(trainer, tok, recipe: Recipe, params: TrainSidecarParams, metrics: dict, out_dir: Path,
                  metrics_path: Path) -> None:
    """Process 0's outputs: the adapter (+ sidecar.json), the resolved recipe, the params section, the metrics."""
    save_adapter(trainer, tok, out_dir / "adapter", sidecar_metadata(recipe, metrics))
    atomic_write_text(out_dir / "recipe.yaml", recipe_to_yaml(recipe))
    write_json(out_dir / "params.json", {"train_sidecar": as_dict(params)})
    write_json(metrics_path, metrics)


def sidecar_metadata(recipe: Recipe, metrics: dict) -> dict:
    """``adapter/sidecar.json``: what the runtime needs to load and trust the adapter (the layout it learned,
    :func:`~ooospec.runtime.sidecar.prompts.read_metadata` checks it: the layout of the rows it trained on; its
    base)."""
    meta = {**sp.layout_metadata(metrics["layout_version"]), "base": recipe.base, "base_model_id": recipe.base_model_id,
            "lora_r": recipe.lora_r, "requests_trained": metrics["requests"]["trained"],
            "slots_trained": metrics["slots"]["trained"], "steps": metrics["steps"]}
    if recipe.init_adapter:
        meta["continued_from"] = recipe.init_adapter
    return meta


def _sort_target_modules(config_path: Path) -> None:
    """peft keeps ``target_modules`` as a set and writes it in hash order; sort it so reruns are byte-identical."""
    cfg = json.loads(config_path.read_text())
    if isinstance(cfg.get("target_modules"), list):
        cfg["target_modules"] = sorted(cfg["target_modules"])
        config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def save_adapter(trainer, tokenizer, adapter_dir: Path, metadata: dict) -> None:
    """peft ``save_pretrained`` (adapter_model.safetensors + adapter_config.json), the tokenizer, sidecar.json."""
    tmp = adapter_dir.with_name(adapter_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    _sort_target_modules(tmp / "adapter_config.json")
    (tmp / sp.METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(adapter_dir, ignore_errors=True)
    tmp.replace(adapter_dir)


# ------------------------------------------------------------------------------------------------ CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("train", help="request rows (data/slots/train.jsonl)")
    parser.add_argument("out_dir", help="output folder (models/sidecar)")
    parser.add_argument("metrics", help="metrics JSON (metrics/train_sidecar.json)")
    parser.add_argument("--params", default="params.yaml", help="params file (section train_sidecar)")
    parser.add_argument("--recipe", default=None, help="override params' recipe (e.g. recipes/gpu_qwen3_0.6b.yaml)")
    parser.add_argument("--max-train-requests", type=int, default=None,
                        help="override params' max_train_requests (0 = all)")
    parser.add_argument("--threads", type=int, default=None, help="override params' threads (0 = all cores)")
    parser.add_argument("--init-adapter", default=None, metavar="DIR",
                        help="continue from this sidecar adapter (overrides the recipe's init_adapter; 'none': a "
                             "fresh LoRA)")


def run_cli(args: argparse.Namespace) -> int:
    main_process = Processes.from_env().is_main
    logging.basicConfig(level=logging.INFO if main_process else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    params = load_section(TrainSidecarParams, "train_sidecar", Path(args.params))
    if args.recipe:
        params = dataclasses.replace(params, recipe=args.recipe)
    if args.max_train_requests is not None:
        params = dataclasses.replace(params, max_train_requests=args.max_train_requests)
    if args.threads is not None:
        params = dataclasses.replace(params, threads=args.threads)
    recipe = None
    if args.init_adapter:
        recipe = dataclasses.replace(load_recipe(params.recipe),
                                     init_adapter=None if args.init_adapter == "none" else args.init_adapter)
    m = run(params, args.train, args.out_dir, args.metrics, recipe=recipe)
    if main_process:
        print(f"train_sidecar: {m['requests']['trained']} requests ({m['sequences']} sequences), {m['steps']} steps, "
              f"loss {m['final_loss']}, {m['train_seconds']:.0f}s -> {Path(args.out_dir) / 'adapter'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return module_main("ooospec.pipelines.train_sidecar", __doc__, add_arguments, run_cli, argv)


if __name__ == "__main__":
    raise SystemExit(main())
