"""Experiment tracking (W&B) setup, shared by training (:mod:`ooospec.pipelines.train_sidecar`) and the transfer
evaluation (:mod:`ooospec.eval.transfer.stage`): one place decides where runs go and that they never need a network."""

from __future__ import annotations

import os
from pathlib import Path


def configure_wandb(report_to: str, out_dir: Path, project: str) -> None:
    """W&B runs offline unless the user chose otherwise (WANDB_API_KEY or WANDB_MODE set): no network errors.

    Runs go under ``out_dir/wandb`` unless ``WANDB_DIR`` is set; ``project`` unless ``WANDB_PROJECT`` is set.
    Does nothing unless ``report_to == "wandb"``.
    """
    if report_to != "wandb":
        return
    if "WANDB_MODE" not in os.environ and "WANDB_API_KEY" not in os.environ:
        os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("WANDB_PROJECT", project)
    if "WANDB_DIR" not in os.environ:
        (Path(out_dir) / "wandb").mkdir(parents=True, exist_ok=True)
        os.environ["WANDB_DIR"] = str(out_dir)
    os.environ.setdefault("WANDB_SILENT", "true")
