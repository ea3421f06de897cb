#!/usr/bin/env bash
# ooo-spec inside vLLM on one CUDA GPU: vLLM plain / ngram vs toolspec / ooospec-oracle on the same requests the CPU
# report uses (eval/reports/vllm/), qwen2.5-coder-1.5b, greedy, batch 1. About 5-8 minutes on one H200 once vLLM is
# installed. Weights are carried in (no hub): MODEL_DIR is an HF folder, e.g. the one `ooospec models fetch
# qwen2.5-coder-1.5b` writes (~/.cache/ooospec/models/qwen2.5-coder-1.5b/hf); benchmarks come from
# `dvc repro dedupe` (data/dedupe/eval/). Offline machines: WHEELHOUSE=DIR installs vLLM from wheels in DIR.
#   MODEL_DIR=/path/to/hf bash eval/vllm/gpu_bench.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${MODEL_DIR:?set MODEL_DIR to the target's HF folder}"
VENV=${VLLM_VENV:-.venv-vllm-gpu}
OUT=${OUT:-eval/reports/vllm/gpu}
LIMIT=${LIMIT:-30}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
if [ -n "${WHEELHOUSE:-}" ]; then
  "$VENV/bin/pip" install -q --no-index --find-links "$WHEELHOUSE" vllm
else
  "$VENV/bin/pip" install -q "vllm==0.33.0"
fi
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/python" -c "import vllm, ooospec.runtime.vllm.plugin as p; p.register(); assert p.installed(), p.why_not(); print('vLLM', vllm.__version__)"
mkdir -p "$OUT"
for b in apibank-l1 bfcl-simple-python; do
  "$VENV/bin/ooospec" vllm-bench --target "$MODEL_DIR" --dataset "$b" --limit "$LIMIT" \
    --methods vllm,vllm-ngram,toolspec,ooospec-oracle --max-new-tokens 128 --chain-cost-slope 0.0 \
    --out "$OUT/qwen2.5-coder-1.5b_${b}.json"
done
"$VENV/bin/ooospec" vllm-report "$OUT"
