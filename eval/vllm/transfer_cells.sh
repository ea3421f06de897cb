#!/usr/bin/env bash
# The `transfer_vllm` DVC stage: the shipped sidecar's transfer cells inside vLLM (params.yaml `transfer_vllm`).
# Per target x benchmark: llama.cpp greedy on the registry GGUF (main venv), then in one `ooospec vllm-bench` run
# (.venv-vllm) vLLM plain and the METHODS -- vLLM's own speculation, `toolspec`, the sidecar's REAL deployment
# `ooospec-wave-first` (gated, warmed on WARMUP requests after the timed ones, paired with `toolspec` on the same
# engine), its EMULATED own device `ooospec-dedicated`, the hint ceiling `ooospec-oracle` -- on the same requests,
# 2 threads, the sidecar server on the same cores; then the cells' table (eval/vllm/headline.py). Resumable: a
# finished cell of these methods (or more), this limit and this CPU is kept (one of another CPU is run again, or with
# FOREIGN=stop, as the matrix sets, stops the run), one that lacks some of the methods gets only those added
# (`vllm-bench --add`, compared with its own vLLM plain rows); a cell that fails leaves CELL.error.txt (its last log
# lines) and the others go on; a file OUT/.stop stops the run before its next cell (the cell running finishes).
# Without .venv-vllm the stage writes a table that says so and the transformers transfer stage (`transfer`) is the
# fallback.
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
start_sidecar .venv/bin "$OUT/sidecar_server.log" "$PORT" --adapter "$ADAPTER" --threads 2 --dtype "${SIDECAR_DTYPE:-auto}" \
  --engine transformers
vllm_bench() {   # vllm_bench TARGET BENCH CELL METHODS [--add]: the vLLM methods of one cell
  local t=$1 b=$2 cell=$3 methods=$4 add=${5:-} warmup=0
  [[ ",$methods," == *",ooospec-wave-first,"* ]] && warmup=$WARMUP     # the gate warm-up is wave-first's
  .venv-vllm/bin/ooospec vllm-bench --target "$t" --dataset "$b" --benchmark-dir "$BENCH_DIR" --limit "$LIMIT" \
    --methods "$methods" $add \
    --sidecar-url "http://127.0.0.1:$PORT" --sidecar-gate "$GATE" --gate-warmup "$warmup" --paired \
    --sidecar-wave function-first --threads 2 --max-new-tokens 128 $WARM_FLAG \
    --llamacpp-bench "$cell.llamacpp.json" --out "$cell.json.partial"
}
run_cell() {   # run_cell TARGET BENCH CELL: llama.cpp greedy, then the vLLM methods, on the same requests
  local t=$1 b=$2 cell=$3
  # (called under `if`, where set -e is off: each step returns its own failure)
  llamacpp_cell "$t" "$b" "$cell" "$LIMIT" $WARM_FLAG || return
  if [ -n "${MISSING:-}" ]; then      # the finished cell plus its missing methods, then in its place
    cp "$cell.json" "$cell.json.partial"
    vllm_bench "$t" "$b" "$cell" "$MISSING" --add || return
  else
    vllm_bench "$t" "$b" "$cell" "$METHODS" || return
  fi
  mv "$cell.json.partial" "$cell.json"
}
for t in $TARGETS; do
  for b in $BENCHES; do
    cell="$OUT/${t}_${b}_${CACHE}"
    if [ -f "$OUT/.stop" ]; then
      echo "transfer_vllm: $OUT/.stop is there; stopping before $cell (remove it and run again to go on)" >&2
      exit 0
    fi
    MISSING=
    if [ -f "$cell.json" ]; then
      # kept when it ran these methods on this many requests; the methods it lacks are added to it (same
      # requests, compared with its own plain rows); a cell of another limit is run again
      MISSING=$(.venv/bin/python -c 'import sys; from pathlib import Path
from ooospec.eval.vllm.matrix import missing_methods
print(missing_methods(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])))' "$cell.json" "$METHODS" "$LIMIT")
      [ -z "$MISSING" ] && continue
      if [ "$MISSING" = OTHER-MACHINE ] && [ "${FOREIGN:-rerun}" = stop ]; then
        echo "transfer_vllm: $cell.json was measured on another CPU; a matrix holds one machine's cells: give it" \
          "another out folder (or move those cells) to run it here" >&2
        exit 1
      fi
      if [ "$MISSING" = ALL ] || [ "$MISSING" = OTHER-MACHINE ]; then
        echo "transfer_vllm: $cell.json ran another limit or on another CPU; running it again here" >&2
        rm -f "$cell.json" "$cell.llamacpp.json"
        MISSING=
      else
        echo "transfer_vllm: $cell.json lacks $MISSING; adding them" >&2
      fi
    fi
    rm -f "$cell.error.txt"
    if ! run_cell "$t" "$b" "$cell" 2>&1 | tee "$OUT/.cell.log"; then
      # a target vLLM (or llama.cpp) cannot run is listed with its error; the other cells go on
      { echo "# $t x $b ($CACHE): failed $(date -u +%FT%TZ)"; grep -v '^\s*$' "$OUT/.cell.log" | tail -n 40; } \
        > "$cell.error.txt"
      echo "transfer_vllm: $t x $b failed; the error is in $cell.error.txt" >&2
    fi
  done
done
rm -f "$OUT/.cell.log"
if compgen -G "$OUT/*_$CACHE.json" > /dev/null; then
  .venv/bin/python -m ooospec.eval.vllm.headline --cells "$OUT" --out "$OUT/table.md"
fi
echo TRANSFER_VLLM_DONE
