#!/usr/bin/env bash
# vLLM's OpenAI server under concurrent load (`ooospec vllm-load`, eval/vllm/load.py): plain vLLM, ooo-spec's
# toolspec proposer and vLLM's ngram, the same requests at each concurrency, streamed and not; per target one results
# JSON, a markdown table and the servers' logs in OUT. Each method is kept as it finishes: rerun to resume.
#   bash eval/vllm/load.sh            # TARGETS / DATASET / LIMIT / CONC / STREAM / OUT / QUANTIZED / METHODS / ROUNDS
#   ROUNDS=3 METHODS=vllm,toolspec bash eval/vllm/load.sh    # interleaved: plain before and after each toolspec run
#   QUANTIZED=w8a8 OUT=eval/reports/cpu/quantized/<cpu>/load bash eval/vllm/load.sh   # the quantized target
#   BLOCK_SIZE=32 ...                 # the KV cache's block size (the prefix cache's unit; vLLM's CPU default 128)
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGETS=${TARGETS:-"qwen2.5-coder-0.5b qwen2.5-coder-1.5b"}
DATASET=${DATASET:-apibank-l1}
LIMIT=${LIMIT:-16}
CONC=${CONC:-1,2,4,8,16}
STREAM=${STREAM:-both}
OUT=${OUT:-eval/reports/vllm/load}
QUANTIZED=${QUANTIZED:-}
METHODS=${METHODS:-vllm,toolspec,vllm-ngram}
ROUNDS=${ROUNDS:-1}
BLOCK_SIZE=${BLOCK_SIZE:-}
mkdir -p "$OUT"
for t in $TARGETS; do
  .venv-vllm/bin/ooospec vllm-load --target "$t" --dataset "$DATASET" --limit "$LIMIT" --concurrency "$CONC" --stream "$STREAM" \
    --methods "$METHODS" --rounds "$ROUNDS" \
    ${QUANTIZED:+--quantized "$QUANTIZED"} ${BLOCK_SIZE:+--block-size "$BLOCK_SIZE"} --out "$OUT/${t}_${DATASET}.json"
done
echo VLLM_LOAD_DONE
