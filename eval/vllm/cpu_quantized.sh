#!/usr/bin/env bash
# The quantized-target report (eval/reports/cpu/quantized/<cpu>/): can toolspec inside vLLM on a quantized target beat
# llama.cpp's greedy on the registry's Q4_K_M GGUF? Per target and benchmark, on the same 30 requests, 2 threads,
# one run at a time, toolbox warm (WARM=0: cold): llama.cpp greedy and the bindings' prompt-lookup speculation
# (`ooospec bench`, main venv; LLAMACPP_METHODS), then vLLM plain +
# toolspec on each weight format (the dense weights and the SCHEMES, `ooospec vllm-bench`, .venv-vllm); then what a forward costs
# per format at 2 and 1 threads (vllm_substrate, substrate) and the roofline table. Resumable: a finished cell is
# skipped. Needs .venv (llama.cpp), .venv-vllm (eval/vllm/setup_cpu.sh), .venv-quant (eval/vllm/setup_quant.sh).
#   bash eval/vllm/cpu_quantized.sh && .venv/bin/python -m ooospec.eval.substrate.roofline eval/reports/cpu/quantized/<cpu>
set -euo pipefail
cd "$(dirname "$0")/../.."
source eval/vllm/llamacpp_cell.sh
CPU_TAG=${CPU_TAG:-$(.venv/bin/python -c "from ooospec.runtime.backends.hardware import cpu_tag; print(cpu_tag())")}
OUT=${OUT:-eval/reports/cpu/quantized/$CPU_TAG}
TARGETS=${TARGETS:-"qwen2.5-coder-0.5b qwen2.5-coder-1.5b"}
BENCHES=${BENCHES:-"apibank-l1 bfcl-simple-python"}
SCHEMES=${SCHEMES:-w8a8}
# the dense weights in the dtype vLLM runs here: bf16 where the CPU multiplies it natively, fp32 where not
DENSE=${DENSE:-$(.venv/bin/python -c "from ooospec.runtime.backends.hardware import vllm_dtype; print({'bfloat16': 'bf16'}.get(vllm_dtype('auto', cuda=False), 'fp32'))")}
FORMATS=${FORMATS-"$SCHEMES $DENSE"}
SUBSTRATE=${SUBSTRATE-"$DENSE,w8a8-rtn,w4a16-rtn"}   # formats timed per forward (same format, same cost: RTN)
SUBSTRATE_THREADS=${SUBSTRATE_THREADS:-"2 1"}   # 1 and 2: the many-core model in eval/substrate/roofline.py fits on both
LIMIT=${LIMIT:-30}
WARM=${WARM:-1}
WARM_FLAG=$([ "$WARM" = 1 ] && echo --warm-tools || true)
# the KV cache's block size (the prefix cache's unit; vLLM's CPU default 128): cells in <format>-b<N>/
BLOCK_SIZE=${BLOCK_SIZE:-}
BLOCK_FLAG=${BLOCK_SIZE:+--block-size $BLOCK_SIZE}
METHODS=${METHODS:-vllm,toolspec}
export LLAMACPP_METHODS=${LLAMACPP_METHODS:-llama.cpp,llama.cpp-pld}   # greedy, and the bindings' prompt lookup
DENSE_METHODS=${DENSE_METHODS:-${BF16_METHODS:-vllm}}   # dense: plain (the quality reference, what quantizing buys)
CALIBRATION=${CALIBRATION:-data/dedupe/train.jsonl}
SAMPLES=${SAMPLES:-32}            # calibration records (GPTQ, SmoothQuant)
[ "$WARM" = 1 ] || OUT="$OUT/cold"
mkdir -p "$OUT"
for t in $TARGETS; do
  for s in $SCHEMES; do
    .venv-quant/bin/ooospec models quantize "$t" --scheme "$s" --calibration "$CALIBRATION" --samples "$SAMPLES"
  done
  for b in $BENCHES; do
    cell="$OUT/${t}_${b}"
    llamacpp_cell "$t" "$b" "$cell" "$LIMIT" $WARM_FLAG
  done
done
for f in $FORMATS; do
  for t in $TARGETS; do
    for b in $BENCHES; do
      cell="$OUT/$f${BLOCK_SIZE:+-b$BLOCK_SIZE}/${t}_${b}"
      [ -f "$cell.json" ] && continue
      mkdir -p "$(dirname "$cell")"
      case "$f" in
        bf16|fp32) QUANT="--dtype $f"; M=$DENSE_METHODS ;;
        *) QUANT="--quantized $f"; M=$METHODS ;;
      esac
      .venv-vllm/bin/ooospec vllm-bench --target "$t" $QUANT --dataset "$b" --limit "$LIMIT" --methods "$M" \
        --threads 2 --max-new-tokens 128 $WARM_FLAG $BLOCK_FLAG --llamacpp-bench "$OUT/${t}_${b}.llamacpp.json" --out "$cell.json"
    done
  done
done
[ "$WARM" = 1 ] && [ -n "$SUBSTRATE" ] || { echo QUANTIZED_DONE; exit 0; }
for t in $TARGETS; do
  for s in $(echo "$SUBSTRATE" | tr ',' ' '); do
    [ "$s" = bf16 ] || [ "$s" = fp32 ] || .venv-quant/bin/ooospec models quantize "$t" --scheme "$s" --calibration "$CALIBRATION" --samples "$SAMPLES"
  done
done
for threads in $SUBSTRATE_THREADS; do
  for t in $TARGETS; do
    f="$OUT/substrate_vllm_${t}_t$threads.json"
    [ -f "$f" ] || .venv-vllm/bin/python -m ooospec.eval.vllm.substrate --target "$t" --formats "$SUBSTRATE" \
      --threads "$threads" --out "$f"
    f="$OUT/substrate_llamacpp_${t}_t$threads.json"
    [ -f "$f" ] || .venv/bin/python -m ooospec.eval.substrate --target "$t" --formats registry,Q4_0 \
      --threads "$threads" --forward-only --out "$f"
  done
done
echo QUANTIZED_DONE
