#!/usr/bin/env bash
# The `transfer_vllm` DVC stage: the shipped sidecar's transfer cells inside vLLM (params.yaml `transfer_vllm`).
# Per target x benchmark: llama.cpp greedy on the registry GGUF (main venv), then in one `ooospec vllm-bench` run
# (.venv-vllm) vLLM plain and the METHODS -- vLLM's own speculation, `toolspec`, the sidecar's REAL deployment
# `ooospec-wave-first` (gated, warmed on WARMUP requests after the timed ones, paired with `toolspec` on the same
# engine), its EMULATED own device `ooospec-dedicated`, the hint ceiling `ooospec-oracle` -- on the same requests,
# 2 threads, the sidecar server on the same cores; then the cells' table (eval/vllm/headline.py). Resumable: a
# finished cell is kept. Without .venv-vllm the stage writes a table that says so and the transformers transfer
# stage (`transfer`) is the fallback.
#   OUT=eval/reports/transfer/vllm TARGETS=... BENCHES=... LIMIT=10 METHODS=... CACHE=warm bash eval/vllm/transfer_cells.sh
# (ADAPTER: the sidecar; BENCH_DIR: the benchmarks' folder; SCRIPTS: where llamacpp_cell.sh / sidecar_server.sh are)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-eval/reports/transfer/vllm}
TARGETS=${TARGETS:-qwen2.5-coder-0.5b}
BENCHES=${BENCHES:-bfcl-simple-python}
LIMIT=${LIMIT:-10}
METHODS=${METHODS:-vllm,vllm-ngram,toolspec,ooospec-oracle,ooospec-wave-first,ooospec-dedicated}
CACHE=${CACHE:-warm}
GATE=${GATE:-shared}
WARMUP=${WARMUP:-10}
PORT=${PORT:-8767}
ADAPTER=${ADAPTER:-adapters/sidecar}
export BENCH_DIR=${BENCH_DIR:-data/dedupe/eval}
SCRIPTS=${SCRIPTS:-eval/vllm}
mkdir -p "$OUT"
if [ ! -x .venv-vllm/bin/ooospec ]; then
  printf '%s\n' "# Transfer inside vLLM: not run" "" \
    "vLLM's CPU build is not set up here (\`bash eval/vllm/setup_cpu.sh\`, then \`dvc repro transfer_vllm\`);" \
    "the transformers transfer stage (\`eval/reports/transfer/transfer.md\`) is the fallback." > "$OUT/table.md"
  echo "transfer_vllm: .venv-vllm missing; wrote $OUT/table.md" >&2
  exit 0
fi
case "$CACHE" in
  warm) WARM_FLAG=--warm-tools ;;
  cold) WARM_FLAG= ;;
  *) echo "CACHE must be warm or cold, got $CACHE" >&2; exit 1 ;;
esac
source "$SCRIPTS/llamacpp_cell.sh"
source "$SCRIPTS/sidecar_server.sh"
start_sidecar .venv/bin "$OUT/sidecar_server.log" "$PORT" --adapter "$ADAPTER" --threads 2 --dtype bf16 \
  --engine transformers
for t in $TARGETS; do
  for b in $BENCHES; do
    cell="$OUT/${t}_${b}_${CACHE}"
    [ -f "$cell.json" ] && continue
    llamacpp_cell "$t" "$b" "$cell" "$LIMIT" $WARM_FLAG
    .venv-vllm/bin/ooospec vllm-bench --target "$t" --dataset "$b" --benchmark-dir "$BENCH_DIR" --limit "$LIMIT" \
      --methods "$METHODS" \
      --sidecar-url "http://127.0.0.1:$PORT" --sidecar-gate "$GATE" --gate-warmup "$WARMUP" --paired \
      --sidecar-wave function-first --threads 2 --max-new-tokens 128 $WARM_FLAG \
      --llamacpp-bench "$cell.llamacpp.json" --out "$cell.json.partial"
    mv "$cell.json.partial" "$cell.json"
  done
done
.venv/bin/python -m ooospec.eval.vllm.headline --cells "$OUT" --out "$OUT/table.md"
echo TRANSFER_VLLM_DONE
