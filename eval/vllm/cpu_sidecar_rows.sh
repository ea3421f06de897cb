#!/usr/bin/env bash
# The `ooospec` rows of the vLLM report: the shipped sidecar adapter served by `ooospec sidecar serve` (main venv,
# transformers, bf16, sharing the same 2 cores with vLLM: what a single small CPU box gives), one wave per request
# sent at its first step, no gate; added to each cell of cpu_matrix.sh (--add: compared with that cell's vllm rows).
#   bash eval/vllm/cpu_sidecar_rows.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-eval/reports/vllm}
TARGETS=${TARGETS:-"qwen2.5-coder-0.5b qwen2.5-coder-1.5b"}
BENCHES=${BENCHES:-"apibank-l1 bfcl-simple-python"}
LIMIT=${LIMIT:-30}
PORT=${PORT:-8765}
.venv/bin/ooospec sidecar serve --port "$PORT" --threads 2 --dtype "${SIDECAR_DTYPE:-auto}" > "$OUT/sidecar_server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break; sleep 1; done
curl -sf "http://127.0.0.1:$PORT/health"; echo
for t in $TARGETS; do
  for b in $BENCHES; do
    cell="$OUT/${t}_${b}.json"
    if ! grep -q '"method": "ooospec"' "$cell"; then
      .venv-vllm/bin/ooospec vllm-bench --target "$t" --dataset "$b" --limit "$LIMIT" --methods ooospec --add \
        --sidecar-url "http://127.0.0.1:$PORT" --threads 2 --max-new-tokens 128 \
        --llamacpp-bench "${cell%.json}.llamacpp.json" --out "$cell"
    fi
  done
done
echo SIDECAR_ROWS_DONE
