#!/usr/bin/env bash
# train_sidecar under DeepSpeed ZeRO-2 on the GPUs of one machine for a few steps (recipes/accelerate_multi_gpu.yaml
# + recipes/deepspeed_zero2.json, the paper's GPU recipe recipes/gpu_qwen3_0.6b.yaml with its base swapped for a
# folder carried in, since GPU boxes here reach no hub). A few minutes once deepspeed is installed.
#   BASE_DIR=~/.cache/ooospec/models/qwen2.5-coder-0.5b/hf bash pipelines/gpu_deepspeed_smoke.sh
# BASE_DIR: an HF folder (default: the hub id of the recipe); STEPS (default 20); NPROC (default: every GPU);
# WHEELHOUSE=DIR installs deepspeed from wheels in DIR. Inputs: data/slots/train.jsonl (`dvc repro expand_slots`).
# Writes $OUT (default runs/deepspeed-smoke): the adapter, checkpoints, metrics.json; prints the loss curve.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/deepspeed-smoke}
STEPS=${STEPS:-20}
NPROC=${NPROC:-$(nvidia-smi -L | wc -l)}
PY=${PYTHON:-.venv/bin/python}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
if ! "$PY" -c "import deepspeed" 2>/dev/null; then
  if [ -n "${WHEELHOUSE:-}" ]; then "$PY" -m pip install -q --no-index --find-links "$WHEELHOUSE" deepspeed
  else "$PY" -m pip install -q deepspeed; fi
fi
mkdir -p "$OUT"
"$PY" - "$OUT/recipe.smoke.yaml" "$STEPS" "${BASE_DIR:-}" <<'PYEOF'
import sys, yaml
out, steps, base = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = yaml.safe_load(open("recipes/gpu_qwen3_0.6b.yaml"))
r.update(max_steps=steps, logging_steps=1, save_steps=max(steps // 2, 1), report_to="none")
if base:
    r.update(base=base, base_model_id=base)
open(out, "w").write(yaml.safe_dump(r, sort_keys=False))
PYEOF
"$PY" -m accelerate.commands.launch --config_file recipes/accelerate_multi_gpu.yaml --num_processes "$NPROC" \
  -m ooospec.pipelines.train_sidecar data/slots/train.jsonl "$OUT" "$OUT/metrics.json" \
  --recipe "$OUT/recipe.smoke.yaml" --max-train-requests $((STEPS * 32 * NPROC))
"$PY" -c "import json,sys; m=json.load(open(sys.argv[1])); print('processes', m['processes'], 'steps', m['steps'], 'train_loss', m['train_loss']); [print(p['step'], p['loss']) for p in m['loss_curve']]" "$OUT/metrics.json"
