"""DVC stage ``export_adapter``: lay the trained sidecar out as a Hugging Face Hub model repo, optionally push it.

``export/sidecar-adapter/`` gets::

    adapter_model.safetensors  adapter_config.json     the peft adapter (base_model_name_or_path = Hub id),
                                                       weights in ``weights_dtype`` (bf16 by default: half the size)
    sidecar.json                                       prompt layout version + data/training summary (the runtime
                                                       refuses an adapter of another layout)
    tokenizer.json  tokenizer_config.json ...          the sidecar's tokenizer
    README.md                                          model card: YAML front matter + data, recipe, metrics, usage
    recipe.yaml  params.json                           the recipe and params sections that produced it

Run as a stage, or by hand with a push (HF_TOKEN from the environment; it is never printed or logged)::

    python -m ooospec.pipelines.export_adapter models/sidecar export/sidecar-adapter --metrics-dir metrics
    python -m ooospec.pipelines.export_adapter models/sidecar-full models/sidecar-full/hub --metrics-dir metrics \
        --metrics train_sidecar=RUN.train.json --metrics eval_sidecar=RUN.heldout.json   # pipelines/full/dvc.yaml
    HF_TOKEN=... ooospec export --push you/ooo-spec-sidecar

Without a token, or when the Hub cannot be reached, the push prints ONE line saying so and exits with
status 2 (no token) or 3 (upload failed); the exported folder is kept either way.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ooospec.pipelines.params import as_dict, load_section, module_main
from ooospec.pipelines.records import atomic_write_text, write_json
from ooospec.reporting import md_table, pct

logger = logging.getLogger(__name__)

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json", "sidecar.json")
WEIGHTS_DTYPES = ("fp32", "bf16")
CARD_METRICS = ("ingest", "dedupe", "teacher", "normalize", "expand_slots", "train_sidecar", "eval_sidecar")
EXIT_NO_TOKEN, EXIT_PUSH_FAILED = 2, 3
DATA_LICENSES = """\
| source | role | license |
|---|---|---|
| API-Bank (AlibabaResearch/DAMO-ConvAI, `api-bank/`) | training + held-out | Apache-2.0 |
| ToolAlpaca (tangqiaoyu/ToolAlpaca) | training + held-out | Apache-2.0 |
| Seal-Tools (fairyshine/Seal-Tools) | training + held-out | Apache-2.0 |
| Glaive function-calling demo (hiyouga/LLaMA-Factory) | training | Apache-2.0 |
| ToolRL `rlla_sft` (qiancheng0/ToolRL) | training | Apache-2.0 |
| BFCL (ShishirPatil/gorilla) | evaluation only, never trained on | Apache-2.0 |

Part of the ToolRL data is derived from **xLAM-function-calling-60k** (Salesforce, CC-BY-4.0), directly and via
Hammer's masked variant. Attribution: *xLAM function-calling data © Salesforce, licensed under CC BY 4.0
(https://creativecommons.org/licenses/by/4.0/)*; keep this notice when you redistribute the adapter.
ToolACE-derived rows are Apache-2.0. Teacher traces were decoded by the project's teacher model; only the
normalized compact-JSON calls were kept."""


@dataclass(frozen=True)
class ExportAdapterParams:
    """params.yaml section ``export_adapter``."""

    license: str = "apache-2.0"
    model_name: str = "ooo-spec-sidecar"
    weights_dtype: str = "bf16"  # adapter tensors as exported: bf16 (half the size) | fp32 (bit-exact with training)
    tags: tuple[str, ...] = ("lora", "peft", "sft", "tool-calling", "function-calling",
                             "speculative-decoding", "ooo-spec")

    def __post_init__(self) -> None:
        if self.weights_dtype not in WEIGHTS_DTYPES:
            raise ValueError(f"export_adapter.weights_dtype must be one of {WEIGHTS_DTYPES}, "
                             f"got {self.weights_dtype!r}")


# ------------------------------------------------------------------------------------------- model card

def read_metrics(metrics_dir: Path, files: dict[str, Path] | None = None) -> dict[str, dict]:
    """``{stage: metrics}`` for each ``metrics/<stage>.json`` of :data:`CARD_METRICS` that exists.

    ``files`` names a stage's file elsewhere (``{"eval_sidecar": Path("runs/heldout.json")}``); such a file must
    exist, and a stage outside :data:`CARD_METRICS` is an error.
    """
    files = dict(files or {})
    unknown = sorted(set(files) - set(CARD_METRICS))
    if unknown:
        raise ValueError(f"metrics for unknown stage(s) {unknown}; the card reads {list(CARD_METRICS)}")
    out = {}
    for stage in CARD_METRICS:
        path = Path(files[stage]) if stage in files else Path(metrics_dir) / f"{stage}.json"
        if stage in files and not path.is_file():
            raise FileNotFoundError(f"{path}: the {stage} metrics given with --metrics do not exist")
        if path.is_file():
            out[stage] = json.loads(path.read_text(encoding="utf-8"))
    return out


def _scalars(d: dict, prefix: str = "", depth: int = 2) -> list[tuple[str, Any]]:
    """Flatten numbers/strings of a metrics dict to ``[("a.b", v)]`` (lists and deep levels skipped)."""
    rows = []
    for k in sorted(d):
        v = d[k]
        if isinstance(v, dict) and depth > 0:
            rows += _scalars(v, f"{prefix}{k}.", depth - 1)
        elif isinstance(v, (int, float, str)) and not isinstance(v, bool) and len(str(v)) < 80:
            rows.append((f"{prefix}{k}", v))
    return rows


def _pct(x: Any) -> str:
    return pct(x, "n/a")


def _table(rows: list[tuple[str, Any]]) -> str:
    return md_table(["key", "value"], rows, align="ll")


def eval_section(ev: dict | None) -> str:
    if not ev:
        return "_No offline evaluation yet (run the `eval_sidecar` stage)._"
    lat = ev.get("latency", {})
    anchor = ev.get("anchor", {})
    floor = ev.get("baselines", {})
    wave = lat.get("wave", {})
    return "\n".join([
        (f"Held-out requests: {ev.get('requests')} (of {ev.get('requests_available')}), each answered as the "
         "runtime's one-pass wave (index + every tool x parameter), greedy. A constant answer scores the third "
         "column on the same slots: below it, the adapter has learned the answer format but not the task."),
        "",
        "| metric | this adapter | constant answer (same slots) | public reproduction (Qwen3-0.6B, GPU) |",
        "|---|---|---|---|",
        (f"| function-index accuracy | {_pct(ev['function_index']['accuracy'])} "
         f"| {_pct(floor.get('function_index_always_0'))} (always 0) "
         f"| {_pct(anchor.get('function_index_accuracy'))} |"),
        (f"| argument exact match | {_pct(ev['argument']['exact_match'])} "
         f"| {_pct(floor.get('argument_always_null'))} (always null) "
         f"| {_pct(anchor.get('argument_exact_match'))} |"),
        f"| argument exact match (non-null gold) | {_pct(ev['argument'].get('exact_match_non_null'))} | | |",
        f"| joined call exact match (the hint) | {_pct((ev.get('joined') or {}).get('exact_match'))} | | |",
        f"| direct-call exact match | {_pct(ev['direct_call']['exact_match'])} | | |",
        f"| null precision / recall | {_pct(ev['null']['precision'])} / {_pct(ev['null']['recall'])} | | |",
        (f"| wave latency, median / p90 (CPU, {lat.get('threads')} thread(s), {ev.get('dtype')}) "
         f"| {wave.get('median_ms')} / {wave.get('p90_ms')} ms ({lat.get('median_queries')} queries per wave) | | |"),
    ])


def _train_time(train: dict) -> Any:
    """``train_seconds``; for a resumed run, said to cover only the steps after the resume."""
    secs, steps, this_run = train.get("train_seconds"), train.get("steps"), train.get("steps_this_run")
    if secs is not None and steps and this_run is not None and this_run < steps:
        return (f"{secs:.0f} (the last {this_run} of {steps} steps; the run resumed from "
                f"{train.get('resumed_from') or 'a checkpoint'})")
    return secs


def _training_section(metrics: dict[str, dict]) -> str:
    """``## Training data``: the training run's counts and one line of scalars per data stage."""
    tr = metrics.get("train_sidecar", {})
    requests, slots = tr.get("requests", {}), tr.get("slots", {})
    data_lines = [f"- `{stage}`: " + ", ".join(f"{k}={v}" for k, v in _scalars(m, depth=1)[:12])
                  for stage, m in metrics.items() if stage not in ("train_sidecar", "eval_sidecar")]
    by_form = ", ".join(f"{k} {v}" for k, v in sorted((slots.get("by_form") or {}).items()))
    train_rows = [("requests trained", requests.get("trained")), ("requests available", requests.get("available")),
                  ("slots by form", by_form), ("slots dropped (> max_len)", slots.get("dropped_too_long")),
                  ("packed sequences / tokens", f"{tr.get('sequences')} / {tr.get('tokens')}"),
                  ("label tokens", tr.get("label_tokens")), ("optimizer steps", tr.get("steps")),
                  ("final loss", tr.get("final_loss")), ("train time (s)", _train_time(tr)),
                  ("device / threads / bf16 autocast",
                   f"{tr.get('device')} / {tr.get('threads')} / {tr.get('bf16_autocast')}")] if tr else []
    return f"""## Training data

Request rows expanded from teacher tool calls on deduplicated tool-calling dialogues (prompt layout
{tr.get("layout_version")}, recorded in `sidecar.json`): one shared block (conversation + numbered tools with
parameters) and every slot query with its compact-JSON answer, packed into one sequence per request; benchmark test
sets were held out before training.

{_table([(k, v) for k, v in train_rows]) if train_rows else "_No training metrics found._"}

{chr(10).join(data_lines) if data_lines else ""}
"""


def data_seen_section(metrics: dict[str, dict]) -> str:
    """``## Data it saw``: the adapter it continued from, and per source the training records it kept (dedupe),
    the source's kind, place and license (ingest: your own sources carry their path / Hub id and revision)."""
    init = (metrics.get("train_sidecar") or {}).get("init_adapter")
    kept = ((metrics.get("dedupe") or {}).get("train") or {}).get("output_by_source") or {}
    sources = (metrics.get("ingest") or {}).get("sources") or {}
    rows = []
    for name in sorted(set(kept) | {n for n, s in sources.items() if "user" in s}):
        st = sources.get(name, {})
        user = st.get("user")
        kind = f"yours: {user['kind']} ({user['schema']})" if user else "built-in"
        where = (f"{user['path']}" + (f"@{user['revision']}" if user.get("revision") else "")) if user else \
            st.get("upstream", "?")
        rows.append((name, kind, where, st.get("license", "?"), kept.get(name, 0)))
    lines = []
    if init:
        lines.append(f"Continued from the adapter `{init['path']}` (sha256 {init['sha256'][:12]}), whose own card "
                     "lists the data it was trained on; then trained on:\n")
    if rows:
        lines.append(md_table(["source", "kind", "from", "license", "training records"], [list(r) for r in rows]))
    return "## Data it saw\n\n" + ("\n".join(lines) if lines else "_No ingest / dedupe metrics found._") + "\n"


def _usage_section(base_id: str) -> str:
    """``## How to load``: with peft, and with ooo-spec's one-pass wave."""
    return f"""## How to load

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import PeftModel

base = AutoModelForCausalLM.from_pretrained("{base_id}")
sidecar = PeftModel.from_pretrained(base, "<this repo or folder>").merge_and_unload().eval()
tok = AutoTokenizer.from_pretrained("<this repo or folder>")
```

or, with ooo-spec's one-pass wave (the block is prefilled once, every slot answered as a branch):

```python
from ooospec.runtime.sidecar.wave import Sidecar
call, result = Sidecar.from_adapter("<this folder>").predict(messages, tools)   # {{"name", "arguments"}} | None
```
"""


def model_card(params: ExportAdapterParams, recipe: dict, train_params: dict, metrics: dict[str, dict],
               notes: str = "") -> str:
    """README.md text: YAML front matter (base_model, library_name: peft, license, tags) then the card body;
    ``notes`` (markdown: why this adapter ships, what it was compared with) become the card's section after the
    introduction."""
    why = f"## Why this adapter\n\n{notes.strip()}\n\n" if notes.strip() else ""
    base_id = recipe.get("base_model_id") or recipe["base"]
    front = yaml.safe_dump({"base_model": base_id, "library_name": "peft", "license": params.license,
                            "pipeline_tag": "text-generation", "tags": list(params.tags)}, sort_keys=False)
    return f"""---
{front}---

# {params.model_name}

A LoRA adapter that turns `{base_id}` into the **semantic sidecar** of OoO-Spec (out-of-order semantic
speculation for tool calls, arXiv 2608.00814). At request arrival the sidecar answers, in one greedy pass (the
request's shared block prefilled once, every slot decoded as a branch), which tool is called (`function_index`)
and the compact-JSON value of every argument slot of every tool (`argument`, `null` when omitted or when that tool
is not the one called); the runtime joins them into a hint that the target model verifies. The
adapter only drafts: the target stays the sole verifier, so outputs equal the target's greedy output.

{why}## Base model

`{base_id}` (loaded as `{recipe['base']}`; frozen weights `{recipe['dtype']}`, bf16 autocast
`{recipe.get('autocast')}`: bf16 where the CPU/GPU multiplies it natively).

{data_seen_section(metrics)}
{_training_section(metrics)}
## Recipe

One epoch of causal cross-entropy on the answer tokens only, each request packed into one sequence whose 4D mask
lets every query/answer segment see the shared block and itself only (peft LoRA + transformers `Trainer`),
then frozen. The exact recipe and params are in `recipe.yaml` and `params.json`:

```yaml
{yaml.safe_dump(recipe, sort_keys=False).rstrip()}
```

params (`train_sidecar`): `{json.dumps(train_params, sort_keys=True)}`

## Offline metrics

{eval_section(metrics.get("eval_sidecar"))}

{_usage_section(base_id)}
## Data licenses

{DATA_LICENSES}

The adapter itself is released under {params.license}.
"""


# ------------------------------------------------------------------------------------------- export

def run(params: ExportAdapterParams, model_dir: str | os.PathLike, out_dir: str | os.PathLike,
        metrics_dir: str | os.PathLike = "metrics", metrics_files: dict[str, Path] | None = None,
        card_notes: str | os.PathLike | None = None) -> Path:
    """Build the Hub folder ``out_dir`` from a train_sidecar output ``model_dir``; return ``out_dir``.

    The card's metrics come from ``metrics_dir/<stage>.json``, or from ``metrics_files[stage]`` where given;
    ``card_notes`` is a markdown file whose text becomes the card's "Why this adapter" section.
    """
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    adapter = model_dir / "adapter"
    missing = [f for f in ADAPTER_FILES if not (adapter / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{adapter}: missing {missing}; run the train_sidecar stage first")
    recipe = yaml.safe_load((model_dir / "recipe.yaml").read_text(encoding="utf-8"))
    train_params = json.loads((model_dir / "params.json").read_text(encoding="utf-8"))

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in sorted(adapter.iterdir()):
        if f.is_file() and f.name != "README.md":  # peft writes a stub card; ours replaces it
            shutil.copy2(f, tmp / f.name)
    if params.weights_dtype == "bf16":
        _to_bf16(tmp / "adapter_model.safetensors")
    cfg = json.loads((tmp / "adapter_config.json").read_text(encoding="utf-8"))
    cfg["base_model_name_or_path"] = recipe.get("base_model_id") or recipe["base"]
    write_json(tmp / "adapter_config.json", cfg)
    atomic_write_text(tmp / "recipe.yaml", yaml.safe_dump(recipe, sort_keys=False))
    write_json(tmp / "params.json", {**train_params, "export_adapter": as_dict(params)})
    metrics = read_metrics(Path(metrics_dir), metrics_files)
    notes = Path(card_notes).read_text(encoding="utf-8") if card_notes else ""
    card = model_card(params, recipe, train_params.get("train_sidecar", {}), metrics, notes)
    atomic_write_text(tmp / "README.md", card)
    for f in tmp.iterdir():
        f.chmod(0o644)  # atomic writes create 0600 files; a Hub folder is meant to be read
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.replace(out_dir)
    return out_dir


def _to_bf16(path: Path) -> None:
    """Rewrite a safetensors file with its floating tensors in bf16 (metadata kept)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    tensors = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}
    save_file(tensors, str(path), metadata=meta)


def push(folder: str | os.PathLike, repo_id: str, private: bool = False, token: str | None = None) -> int:
    """Upload ``folder`` to the Hub model repo ``repo_id``; 0 on success, else one printed line and 2 / 3.

    The token comes from ``token`` or ``$HF_TOKEN``; it is passed to huggingface_hub and never printed.
    """
    token = token or os.environ.get("HF_TOKEN")
    if not token:
        print(f"export: HF_TOKEN is not set, nothing pushed; the adapter folder is kept at {folder}",
              file=sys.stderr)
        return EXIT_NO_TOKEN
    from huggingface_hub import HfApi

    try:
        api = HfApi(token=token)
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                                 commit_message="Upload OoO-Spec sidecar adapter")
    except Exception as e:  # noqa: BLE001 -- network down, auth refused, bad repo id: one line, the folder stays
        reason = str(e).splitlines()[0][:200].replace(token, "***") if str(e) else ""
        print(f"export: push to {repo_id} failed ({type(e).__name__}: {reason}); the adapter folder is kept at "
              f"{folder}", file=sys.stderr)
        return EXIT_PUSH_FAILED
    print(f"export: pushed {folder} to {getattr(info, 'commit_url', repo_id)}")
    return 0


# ------------------------------------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", nargs="?", default="models/sidecar", help="train_sidecar output")
    parser.add_argument("out_dir", nargs="?", default="export/sidecar-adapter", help="Hub folder to write")
    parser.add_argument("--metrics-dir", default="metrics", help="where the stage metrics JSON files are")
    parser.add_argument("--metrics", action="append", default=[], metavar="STAGE=FILE",
                        help="read STAGE's metrics from FILE instead of the metrics dir (repeatable), "
                             "e.g. eval_sidecar=runs/heldout.json")
    parser.add_argument("--card-notes", default=None, metavar="FILE",
                        help="markdown for the card's 'Why this adapter' section (e.g. the shipping decision)")
    parser.add_argument("--params", default="params.yaml", help="params file (section export_adapter)")
    parser.add_argument("--push", metavar="REPO_ID", default=None, help="upload to this Hub model repo (HF_TOKEN)")
    parser.add_argument("--private", action="store_true", help="create the Hub repo as private")


def run_cli(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    params = load_section(ExportAdapterParams, "export_adapter", Path(args.params))
    files = {}
    for spec in args.metrics:
        stage, sep, path = spec.partition("=")
        if not sep or not stage or not path:
            raise SystemExit(f"export: --metrics {spec!r}: expected STAGE=FILE")
        files[stage] = Path(path)
    if (Path(args.model_dir) / "adapter").is_dir():
        out = run(params, args.model_dir, args.out_dir, args.metrics_dir, files, args.card_notes)
        print(f"export: wrote {out}")
    elif not (args.push and (Path(args.out_dir) / "adapter_config.json").is_file()):
        print(f"export: no trained adapter in {args.model_dir}/adapter; run `dvc repro train_sidecar` first",
              file=sys.stderr)
        return 1
    return push(args.out_dir, args.push, args.private) if args.push else 0


def main(argv: list[str] | None = None) -> int:
    return module_main("ooospec.pipelines.export_adapter", __doc__, add_arguments, run_cli, argv)


if __name__ == "__main__":
    raise SystemExit(main())
