"""params.yaml ``transfer``: the matrix the ``transfer`` stage measures, its named sets, and the commands that
reproduce a run (the stage is :mod:`ooospec.eval.transfer.stage`).

    params = load_params(Path("params.yaml"))   # the small default matrix
    regenerate_command(params)                  # "dvc repro transfer", or the `dvc exp run` line of what differs
    full_command()                              # the `full` named set, into its own folders

The named sets (:data:`NAMED_SETS`) are params files next to params.yaml: the default section with :data:`FULL`'s
keys changed (``eval/transfer/full.yaml``), and that with a warm toolbox (``eval/transfer_warm*.yaml``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ooospec.pipelines.params import as_dict, load_section
from ooospec.runtime import methods as registry
from ooospec.runtime.sidecar.deployments import BENCH_DEPLOYMENTS, DEFAULT_DEPLOYMENT, get_deployment


@dataclass(frozen=True)
class TransferParams:
    """params.yaml ``transfer``: the matrix and how each cell is measured (defaults = the small default matrix)."""

    targets: tuple[str, ...] = ("qwen2.5-coder-0.5b",)      # registry names, HF ids or local folders
    benchmarks: tuple[str, ...] = ("apibank-l1", "bfcl-simple-python")   # data/dedupe/eval/<name>.jsonl or paths
    methods: tuple[str, ...] = registry.DEFAULT_TRANSFER_METHODS
    assistants: dict = field(default_factory=lambda: {"qwen2.5-coder-1.5b": "qwen2.5-coder-0.5b"})
    limit: int = 2                       # first N examples of each benchmark, by id
    max_new_tokens: int = 128
    warmup: int = 1
    dtype: Literal["auto", "bf16", "fp32", "fp16"] = "auto"
    threads: int = 0                     # 0 = the cores this process may use
    pld_tokens: int = 10
    sidecar_adapter: str = "adapters/sidecar"
    sidecar_deploy: str = DEFAULT_DEPLOYMENT   # one of runtime/sidecar/deployments.py's BENCH_DEPLOYMENTS
    sidecar_gate: bool = True            # each wave only as far as it pays (runtime/sidecar/gate.py); False: in full
    warm_tools: bool = False             # True: every method's system + tools block cached before the clock starts
    roofline: bool = True
    seed: int = 0                        # of the bootstrap intervals
    bootstrap_resamples: int = 2000
    resume: bool = True
    report_to: Literal["wandb", "none"] = "wandb"

    def __post_init__(self):
        unknown = [m for m in self.methods if m not in registry.BENCH_METHODS]
        if unknown:
            raise ValueError(f"transfer.methods: unknown {unknown}; known: {list(registry.BENCH_METHODS)}")
        try:
            get_deployment(self.sidecar_deploy, BENCH_DEPLOYMENTS)
        except ValueError as e:
            raise ValueError(f"transfer.sidecar_deploy: {e}") from None
        if not self.targets or not self.benchmarks:
            raise ValueError("transfer.targets and transfer.benchmarks must not be empty")
        for name, value in (("limit", self.limit), ("max_new_tokens", self.max_new_tokens),
                            ("bootstrap_resamples", self.bootstrap_resamples)):
            if value < 1:
                raise ValueError(f"transfer.{name} must be >= 1, got {value}")
        if self.warmup < 0 or self.threads < 0:
            raise ValueError(f"transfer.warmup and transfer.threads must be >= 0, got {self.warmup}, {self.threads}")
        bad = {k: v for k, v in self.assistants.items() if not (isinstance(k, str) and isinstance(v, str))}
        if bad:
            raise ValueError(f"transfer.assistants maps target -> draft model name, got {bad}")


# The named `full` set: the default section with these keys replaced (see the module docstring).
FULL: dict = {
    "targets": ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m", "gemma-3-270m"],
    "benchmarks": ["apibank-l1", "apibank-l2", "toolalpaca-real", "bfcl-simple-python", "bfcl-java",
                   "bfcl-javascript"],
    "limit": 4,
}


def exp_command(overrides: Mapping) -> str:
    """``dvc repro transfer``, or the ``dvc exp run`` line that sets ``overrides`` (``transfer.*`` keys). A mapping
    (``assistants``) cannot be replaced by ``-S`` (Hydra merges into it and splits keys at dots), so it is named
    after the command as an edit of params.yaml.

    >>> exp_command({"limit": 5, "targets": ["a", "b"]})
    "dvc exp run transfer -S transfer.limit=5 -S 'transfer.targets=[a,b]'"
    >>> exp_command({"assistants": {"big": "small"}})
    'dvc repro transfer  # with params.yaml transfer.assistants: {big: small}'
    """
    sets, edits = [], []
    for k, v in overrides.items():
        if isinstance(v, dict):
            edits.append(f"transfer.{k}: {{" + ", ".join(f"{a}: {b}" for a, b in v.items()) + "}")
        elif isinstance(v, (list, tuple)):
            sets.append(f"-S 'transfer.{k}=[{','.join(str(x) for x in v)}]'")
        else:
            sets.append(f"-S transfer.{k}={str(v).lower() if isinstance(v, bool) else v}")
    command = "dvc exp run transfer " + " ".join(sets) if sets else "dvc repro transfer"
    return command + (f"  # with params.yaml {'; '.join(edits)}" if edits else "")


FULL_PARAMS = "eval/transfer/full.yaml"
WARM_PARAMS = "eval/transfer/warm.yaml"     # the full matrix with a warm toolbox (warm_tools: true)
WARM_QWEN_PARAMS = "eval/transfer/warm_qwen.yaml"   # the same on the two Qwen targets (same folders, same cells)
SIDECAR_GOLD_PARAMS = "eval/transfer/sidecar_gold.yaml"       # which sidecar to ship: the gold-trained one
SIDECAR_TEACHER_PARAMS = "eval/transfer/sidecar_teacher.yaml"   # ... and the teacher-trained one, same requests
NAMED_SETS = {FULL_PARAMS: "full", WARM_PARAMS: "warm", WARM_QWEN_PARAMS: "warm",
              SIDECAR_GOLD_PARAMS: "sidecar-gold", SIDECAR_TEACHER_PARAMS: "sidecar-teacher"}


def named_command(params_file: str) -> str:
    """The command that runs the named params set ``params_file`` (a key of :data:`NAMED_SETS`) into its folders.

    >>> named_command(WARM_PARAMS).split()[3:]
    ['data/transfer-warm', 'eval/reports/transfer/warm', 'metrics/transfer-warm.json', '--params', \
'eval/transfer/warm.yaml']
    """
    name = NAMED_SETS[params_file]
    return (f"python -m ooospec.eval.transfer data/transfer-{name} eval/reports/transfer/{name} "
            f"metrics/transfer-{name}.json --params {params_file}")


def full_command() -> str:
    """The command that runs the ``full`` matrix (the named params set :data:`FULL_PARAMS`)."""
    return named_command(FULL_PARAMS)


def regenerate_command(params: TransferParams) -> str:
    """The command that reproduces a run of ``params``: the keys that differ from the defaults as overrides."""
    given, default = as_dict(params), as_dict(TransferParams())
    return exp_command({k: v for k, v in given.items() if v != default[k]})


def load_params(path: Path) -> TransferParams:
    """The ``transfer`` section of the params file at ``path``."""
    return load_section(TransferParams, "transfer", path)
