#!/usr/bin/env bash
# The vLLM report's measurements (eval/reports/vllm/): per target and benchmark, llama.cpp's greedy on the GGUF
# (`ooospec bench`, main venv) and then vLLM plain / ngram / toolspec / ooospec-oracle (`ooospec vllm-bench`,
# .venv-vllm) on the same 30 requests, 2 threads, one run at a time, then vllm-prefill (one new token: the prompt's
# forward, for decode-only speedups). Resumable: a finished cell is skipped.
#   bash eval/vllm/setup_cpu.sh && bash eval/vllm/cpu_matrix.sh
# WARM=1: the warm-toolbox rows (prefix caching on, each request's system + tools block cached before its clock
# starts, every method and llama.cpp alike; --warm-tools) into eval/reports/vllm/warm/.
set -euo pipefail
cd "$(dirname "$0")/../.."
source eval/vllm/llamacpp_cell.sh
WARM=${WARM:-0}
WARM_FLAG=$([ "$WARM" = 1 ] && echo --warm-tools || true)
OUT=${OUT:-$([ "$WARM" = 1 ] && echo eval/reports/vllm/warm || echo eval/reports/vllm)}
TARGETS=${TARGETS:-"qwen2.5-coder-0.5b qwen2.5-coder-1.5b"}
BENCHES=${BENCHES:-"apibank-l1 bfcl-simple-python"}
LIMIT=${LIMIT:-30}
METHODS=${METHODS:-vllm,vllm-ngram,toolspec,ooospec-oracle,vllm-prefill}
mkdir -p "$OUT"
for t in $TARGETS; do
  for b in $BENCHES; do
    cell="$OUT/${t}_${b}"
    llamacpp_cell "$t" "$b" "$cell" "$LIMIT" $WARM_FLAG
    if [ ! -f "$cell.json" ]; then
      .venv-vllm/bin/ooospec vllm-bench --target "$t" --dataset "$b" --limit "$LIMIT" --methods "$METHODS" \
        --threads 2 --max-new-tokens 128 $WARM_FLAG --llamacpp-bench "$cell.llamacpp.json" --out "$cell.json"
    fi
  done
done
echo MATRIX_DONE
