"""`dvc repro pipelines/own/dvc.yaml` end to end on your own data: an OpenAI chat log and Hugging Face files in the
xlam, hermes and glaive layouts (local files that datasets loads as it loads a Hub dataset), a tiny base built in
code, through ingest, dedupe, teacher, normalize, expand_slots, train (continued from an adapter), eval on the
held-out conversations, export, the transfer cell (toolspec and the tuned sidecar's wave on the tiny base) and the
learning-curve report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from sidecar_tiny import save_tiny_base, tiny_recipe_dict
from test_user_sources import GLAIVE_ROW, HERMES_ROW, HOSTILE, XLAM_ROW, conversation, write_lines

from ooospec.pipelines import expand_slots, train_sidecar
from ooospec.pipelines.recipe import recipe_from_dict
from ooospec.pipelines.records import read_jsonl, validate_record, write_jsonl
from ooospec.pipelines.sources import openai_chat

ROOT = Path(__file__).resolve().parents[2]
CITIES = ["Paris", "Oslo", "Rome", "Lima", "Kyiv", "Bern", "Doha", "Riga", "Baku", "Pune", "Nice", "Cork"]


def project(tmp: Path) -> Path:
    """A copy of the repository's layout whose code folders link to the real ones and whose pipelines/own/ holds
    the real dvc.yaml beside test params (DVC hashes the code deps through the links)."""
    proj = tmp / "proj"
    (proj / "pipelines" / "own").mkdir(parents=True)
    for name in ("ooospec", "runtime", "eval", "recipes", "adapters"):
        (proj / name).symlink_to(ROOT / name)
    for item in (ROOT / "pipelines").iterdir():
        if item.name not in ("own", "__pycache__"):
            (proj / "pipelines" / item.name).symlink_to(item)
    shutil.copy(ROOT / "pipelines" / "own" / "dvc.yaml", proj / "pipelines" / "own" / "dvc.yaml")
    return proj


def user_data(proj: Path) -> None:
    data = proj / "data" / "user"
    data.mkdir(parents=True)
    logged = [conversation(c, second=CITIES[(i + 1) % len(CITIES)]) | {"log_version": 1}
              for i, c in enumerate(CITIES)]
    write_lines(data / "calls.jsonl", [conversation(c) for c in CITIES] + HOSTILE[:3])
    write_lines(data / "calls.jsonl.1", logged)                          # a rotated call log
    write_lines(data / "xlam.jsonl", [XLAM_ROW | {"query": f"Weather in {c}, and the time?"} for c in CITIES])
    write_lines(data / "hermes.jsonl", [HERMES_ROW])
    write_lines(data / "glaive.jsonl", [GLAIVE_ROW])


def init_adapter(proj: Path, base: Path) -> Path:
    """A layout-3 adapter of the tiny base to continue from (one step on a few of the log's records)."""
    recs = [r for r in openai_chat.parse_file(proj / "data" / "user" / "calls.jsonl", "seed")
            if isinstance(r, dict) and validate_record(r) is None]
    rows, _ = expand_slots.expand(expand_slots.ExpandSlotsParams(heldout_fraction=0.0, layout=3), recs)
    write_jsonl(proj / "seed_rows.jsonl", rows["train"])
    recipe = recipe_from_dict(tiny_recipe_dict(base, max_steps=1))
    train_sidecar.run(train_sidecar.TrainSidecarParams(recipe="<tiny>", threads=1), proj / "seed_rows.jsonl",
                      proj / "models" / "seed", proj / "seed.train.json", recipe=recipe)
    return proj / "models" / "seed" / "adapter"


def params(proj: Path, base: Path) -> dict:
    recipe = proj / "tiny_recipe.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe_dict(base, max_steps=2, save_steps=1)))
    source = {"heldout_fraction": 0.3, "max_reject_fraction": 0.5}
    return {
        "own": {"params": "pipelines/own/params.yaml", "log": "data/user", "data": "data/own", "metrics": "metrics/own",
                "cards": "data_cards/own", "models": "models/own", "report": "eval_out", "benchmark": "calls",
                "runs": {"tuned": {"recipe": "tiny_recipe.yaml", "requests": 0, "init": "models/seed/adapter"}},
                "evals": {"tuned": "models/own/tuned/adapter", "start": "models/seed/adapter"}, "ship": "tuned"},
        "ingest": {"sources": [], "user_sources": [
            {"name": "calls", "kind": "openai_chat", "path": "data/user/calls.jsonl*", **source},
            {"name": "xlam", "kind": "hf", "path": "data/user/xlam.jsonl", "schema": "xlam", **source},
            {"name": "hermes", "kind": "hf", "path": "data/user/hermes.jsonl", "schema": "hermes", **source},
            {"name": "glaive-demo", "kind": "hf", "path": "data/user/glaive.jsonl", "schema": "glaive", **source}]},
        "dedupe": {"eval_sets": {}, "train_splits": []},
        "teacher": {"backend": "gold"},
        "normalize": {},
        "expand_slots": {"heldout_fraction": 0.0, "layout": 3},
        "train_sidecar": {"recipe": "tiny_recipe.yaml", "threads": 1},
        "eval_sidecar": {"max_requests": 4, "max_new_tokens": 4, "max_forwards": 40, "threads": 1, "dtype": "fp32"},
        "export_adapter": {"weights_dtype": "fp32"},
        "transfer": {"targets": [str(base)], "benchmarks": ["data/own/dedupe/eval/calls.jsonl"],
                     "methods": ["toolspec", "ooospec-wave-first"], "sidecar_adapter": "models/own/tuned/hub",
                     "limit": 1, "max_new_tokens": 8, "dtype": "fp32", "threads": 1, "roofline": False,
                     "warm_tools": True, "report_to": "none", "bootstrap_resamples": 50},
    }


def test_dvc_repro_of_your_own_calls_runs_end_to_end(tmp_path):
    proj = project(tmp_path)
    user_data(proj)
    base = save_tiny_base(tmp_path / "tiny_base")
    init_adapter(proj, base)
    (proj / "pipelines" / "own" / "params.yaml").write_text(yaml.safe_dump(params(proj, base), sort_keys=False))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=proj, check=True, env=env)
    run = subprocess.run([*dvc, "repro", "pipelines/own/dvc.yaml"], cwd=proj, env=env, capture_output=True,
                         text=True, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    ingest = json.loads((proj / "metrics/own/ingest.json").read_text())["sources"]
    assert {n: s["parsed"] for n, s in ingest.items()} == {"calls": 24, "xlam": 12, "hermes": 2, "glaive-demo": 1}
    assert ingest["calls"]["rejects_by_reason"] == {"call_unknown_tool": 1, "malformed_record": 1, "not_json": 1}
    dedupe = json.loads((proj / "metrics/own/dedupe.json").read_text())
    held = {r["id"] for r in read_jsonl(proj / "data/own/dedupe/eval/calls.jsonl")}
    train = list(read_jsonl(proj / "data/own/dedupe/train.jsonl"))
    assert held and train and set(dedupe["eval"]) == {"calls", "xlam", "hermes", "glaive-demo"}
    assert {r["source"] for r in train} <= {"calls", "xlam", "hermes", "glaive-demo"}
    assert not {r["meta"]["dialogue"] for r in train} & {r["meta"]["dialogue"]
                                                         for r in read_jsonl(proj / "data/own/dedupe/eval/calls.jsonl")}
    tuned = json.loads((proj / "metrics/own/runs/tuned.train.json").read_text())
    assert tuned["init_adapter"]["path"] == "models/seed/adapter" and tuned["steps"] == 2
    for name in ("tuned", "start"):
        assert json.loads((proj / f"metrics/own/runs/{name}.heldout.json").read_text())["requests"] >= 1
    card = (proj / "models/own/tuned/hub/README.md").read_text()
    assert "## Data it saw" in card and "data/user/calls.jsonl*" in card and "models/seed/adapter" in card
    moved = json.loads((proj / "metrics/own/transfer.json").read_text())
    assert moved and (proj / "eval_out/transfer").is_dir(), moved
    curve = json.loads((proj / "eval_out/learning_curve.json").read_text())
    assert {r["run"] for r in curve["rows"]} == {"tuned", "start"}
    assert curve["ceiling"]["requests"] == len(held) and curve["ceiling"]["training_requests"] == len(train)
    assert (proj / "eval_out/learning_curve.png").stat().st_size > 0
    again = subprocess.run([*dvc, "status", "pipelines/own/dvc.yaml"], cwd=proj, env=env, capture_output=True,
                           text=True, check=True)
    assert "up to date" in again.stdout, again.stdout
