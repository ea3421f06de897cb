#!/usr/bin/env bash
# ooo-spec inside vLLM on one CUDA GPU: vLLM plain / ngram vs toolspec / ooospec-oracle on the same requests the CPU
# report uses (eval/reports/vllm/), qwen2.5-coder-1.5b, greedy, batch 1. About 5-8 minutes on one H200 once vLLM is
# installed. Weights are carried in (no hub): MODEL_DIR is an HF folder, e.g. the one `ooospec models fetch
# qwen2.5-coder-1.5b` writes (~/.cache/ooospec/models/qwen2.5-coder-1.5b/hf); benchmarks come from
# `dvc repro dedupe` (data/dedupe/eval/). Offline machines: WHEELHOUSE=DIR installs vLLM from wheels in DIR.
# With the sidecar (SIDECAR=1, the default): the shipped adapter served by `ooospec sidecar serve --engine vllm` on the
# same GPU (SIDECAR_GPU_MEMORY of its memory, the target TARGET_GPU_MEMORY) adds the real `ooospec` rows (its waves
# share the GPU with the target, every wave sent) and `ooospec-dedicated` (EMULATED: each wave timed alone on the GPU
# before the target loads). The sidecar's base (qwen2.5-coder-0.5b) must be in $OOOSPEC_CACHE (`ooospec models fetch
# qwen2.5-coder-0.5b` on a machine with the hub, then carry the cache). Not yet run on a GPU (no device was lent
# when these rows were added); SIDECAR=0 gives the rows above only.
#   MODEL_DIR=/path/to/hf bash eval/vllm/gpu_bench.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${MODEL_DIR:?set MODEL_DIR to the HF folder of the target}"
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
METHODS=vllm,vllm-ngram,toolspec,ooospec-oracle
SIDECAR_ARGS=()
if [ "${SIDECAR:-1}" = 1 ]; then
  PORT=${PORT:-8765}
  source eval/vllm/sidecar_server.sh
  start_sidecar "$VENV/bin" "$OUT/sidecar_server.log" "$PORT" --engine vllm --adapter "${ADAPTER:-adapters/sidecar}" \
    --dtype bf16 --gpu-memory "${SIDECAR_GPU_MEMORY:-0.15}"
  METHODS=$METHODS,ooospec,ooospec-dedicated
  SIDECAR_ARGS=(--sidecar-url "http://127.0.0.1:$PORT" --sidecar-wave function-first --sidecar-gate off
                --gpu-memory-utilization "${TARGET_GPU_MEMORY:-0.7}")
fi
for b in apibank-l1 bfcl-simple-python; do
  "$VENV/bin/ooospec" vllm-bench --target "$MODEL_DIR" --dataset "$b" --limit "$LIMIT" \
    --methods "$METHODS" --max-new-tokens 128 --chain-cost-slope 0.0 "${SIDECAR_ARGS[@]}" \
    --out "$OUT/qwen2.5-coder-1.5b_${b}.json"
done
"$VENV/bin/ooospec" vllm-report "$OUT"
