"""Where a training process sits in a multi-process job, and the checkpoints a run resumes from.

``train_sidecar`` runs alone or under ``torchrun`` / ``accelerate launch`` (gloo on CPU, NCCL on GPUs).
:class:`Processes` reads the launcher's environment; :func:`shardable_sequences` gives every process distinct
whole batches; :func:`mean_over_processes` reduces the reported loss. A run's checkpoints (``checkpoint-<step>``
folders of transformers' Trainer) are kept only for the run they belong to (:func:`prepare_checkpoints` compares
the run fingerprint stamped beside them).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

FINGERPRINT_FILE = "run_fingerprint.json"


# --------------------------------------------------------------------------------------------- processes

@dataclass(frozen=True)
class Processes:
    """Where this process sits in a ``torchrun`` / ``accelerate launch`` job (from the launcher's env vars)."""

    rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @classmethod
    def from_env(cls, env: dict | None = None) -> Processes:
        env = os.environ if env is None else env
        world = int(env.get("WORLD_SIZE", 1))
        return cls(rank=int(env.get("RANK", 0)), world_size=world,
                   local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def shardable_sequences(sequences: list, world_size: int, per_device_batch: int) -> tuple[list, int]:
    """``sequences`` cut to a multiple of ``world_size x per_device_batch``, and how many were cut.

    Each process then gets whole batches of distinct sequences: without the cut accelerate evens the last batch out
    by repeating sequences from the start (trained twice). One process cuts nothing.
    """
    if world_size <= 1:
        return sequences, 0
    unit = world_size * per_device_batch
    keep = len(sequences) - len(sequences) % unit
    if keep == 0:
        raise ValueError(f"{len(sequences)} sequences cannot give each of {world_size} processes a batch of "
                         f"{per_device_batch}; train on more requests or fewer processes")
    return sequences[:keep], len(sequences) - keep


def mean_over_processes(value: float | None) -> float | None:
    """The mean of ``value`` over the processes of a torch.distributed job (the value itself when alone)."""
    import torch
    import torch.distributed as dist

    if value is None or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


# ------------------------------------------------------------------------------------------------ checkpoints

def checkpoint_step(ckpt: Path) -> int:
    """``checkpoint-12`` -> 12."""
    return int(ckpt.name.rsplit("-", 1)[1])


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The ``checkpoint-<step>`` folder with the highest step, or None."""
    if not ckpt_dir.is_dir():
        return None
    found = [(checkpoint_step(p), p) for p in ckpt_dir.glob("checkpoint-*")
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
